"""Command line of the benchmarks: ``python -m trainopt.perf.bench {matrix,recipe,stability,all}``.

- ``matrix``: vary one field at a time around a base configuration (the first value given for
  each field), or every combination with ``--grid``; write JSON and print a Markdown table.
- ``recipe``: the plain PyTorch loop against the project's recipe, in one run; prints the
  speed-up.
- ``stability``: the cost of the stability stack (``trainopt.perf.bench.stability``).
- ``all --preset h100``: the targeted GPU suite of the benchmarking page (recipe comparison at
  124M, the 350M model at several batch sizes and compile modes, the stability benchmark),
  stopping gracefully at ``--time-budget`` with what it has measured.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from trainopt.models import GPT_PRESETS
from trainopt.perf.bench.configs import (
    ATTENTION_BACKENDS,
    COMPILE_BACKENDS,
    COMPILE_MODES,
    OPTIMIZERS,
    BenchConfig,
    build_matrix,
)
from trainopt.perf.bench.harness import recipe_pair, run_matrix, speedup
from trainopt.perf.bench.report import (
    goals_summary,
    profile_table,
    recipe_summary,
    results_table,
    stability_summary,
)
from trainopt.perf.bench.results import write_results
from trainopt.perf.precision import PRECISIONS

STABILITY_GOAL_RATIO = 1.02  # the stability stack may cost at most 2% of step time
ALL_TIME_BUDGET_S = 480.0  # `all` fits in one 9-minute GPU call, compilation included
DEFAULT_BATCH = {"tiny": 8, "small": 8, "124m": 16, "350m": 16}


def suite(preset: str, device: str, size: str | None = None,
          batch_size: int | None = None) -> tuple[list[BenchConfig], list[BenchConfig]]:
    """The configurations of ``all --preset``: those before and after the stability benchmark.

    ``h100`` compares the plain loop and the recipe on the 124M model at 16 × 1024, then runs
    the recipe on the 350M model at batch 32; after the stability benchmark, while time is left,
    it tries ``max-autotune-no-cudagraphs`` at batch 32, batch 16, and cuDNN attention at batch
    32. ``cpu`` is the same comparison on the tiny model. ``size`` and ``batch_size`` replace
    every model size and batch size (to try the GPU suite at ``tiny`` size on a CPU);
    configurations that become identical run once.

    Example:
        >>> from trainopt.perf.bench.cli import suite
        >>> first, later = suite("h100", "cuda")
        >>> [c.name for c in first][:2]
        ['124m plain PyTorch loop', '124m trainopt recipe']
    """
    if preset not in ("h100", "cpu"):
        raise ValueError(f"preset must be one of ['cpu', 'h100'], got preset={preset!r}")
    cuda = torch.device(device).type == "cuda"
    if preset == "cpu":
        first = list(recipe_pair("tiny", device, batch_size=8))
        later: list[BenchConfig] = []
    else:
        plain, recipe = recipe_pair("124m", device, batch_size=16, seq_len=1024)
        big = replace(recipe, size="350m", label="", batch_size=32)
        first = [plain, recipe, big]
        later = [replace(big, compile="max-autotune-no-cudagraphs"), replace(big, batch_size=16),
                 replace(big, attention="cudnn" if cuda else "auto")]
    if size is not None:
        first, later = ([replace(c, size=size, seq_len=0, label=c.label.replace(c.size, size, 1))
                         for c in configs] for configs in (first, later))
    if batch_size is not None:
        first, later = ([replace(c, batch_size=batch_size) for c in configs] for configs in (first, later))
    first = list(dict.fromkeys(first))
    return first, [c for c in dict.fromkeys(later) if c not in first]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m trainopt.perf.bench``.

    Example:
        >>> from trainopt.perf.bench.cli import build_parser
        >>> build_parser().parse_args(["matrix", "--precision", "fp32", "bf16"]).precision
        ['fp32', 'bf16']
    """
    parser = argparse.ArgumentParser(prog="python -m trainopt.perf.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
        p.add_argument("--warmup", type=int, default=3, help="warm-up steps (compilation happens here)")
        p.add_argument("--steps", type=int, default=10, help="steps per timed window")
        p.add_argument("--windows", type=int, default=5, help="timed windows (median and spread over them)")
        p.add_argument("--peak-tflops", type=float, default=None, help="MFU reference (default: by GPU name)")
        p.add_argument("--time-budget", type=float, default=None, help="seconds; stop starting new configurations")
        p.add_argument("--out", type=Path, default=None, help="results JSON path")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument("--compile-backend", choices=COMPILE_BACKENDS, default="inductor")
        p.add_argument("--profile-steps", type=int, default=0, help="profile this many steps per configuration")

    m = sub.add_parser("matrix", help="vary one field at a time around a base configuration")
    common(m)
    m.add_argument("--size", choices=sorted(GPT_PRESETS), default="tiny")
    m.add_argument("--precision", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    m.add_argument("--checkpointing", nargs="+", choices=["off", "on"], default=["off", "on"])
    m.add_argument("--compile", nargs="+", choices=COMPILE_MODES, default=["none", "default"])
    m.add_argument("--optimizer", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS))
    m.add_argument("--attention", nargs="+", choices=ATTENTION_BACKENDS, default=["auto"])
    m.add_argument("--batch-size", nargs="+", type=int, default=None)
    m.add_argument("--seq-len", nargs="+", type=int, default=[0], help="0: the preset's block size")
    m.add_argument("--grid", action="store_true", help="every combination instead of one field at a time")

    r = sub.add_parser("recipe", help="the plain PyTorch loop against the project's recipe")
    common(r)
    r.add_argument("--size", choices=sorted(GPT_PRESETS), default="tiny")
    r.add_argument("--batch-size", type=int, default=None)
    r.add_argument("--seq-len", type=int, default=0)
    r.add_argument("--compile", choices=COMPILE_MODES[1:], default="default", help="the recipe's compile mode")

    a = sub.add_parser("all", help="the suite of the benchmarking page")
    common(a)
    a.add_argument("--preset", choices=["h100", "cpu"], default="h100")
    a.add_argument("--size", choices=sorted(GPT_PRESETS), default=None, help="replace every model size")
    a.add_argument("--batch-size", type=int, default=None, help="replace every batch size")
    a.add_argument("--no-stability", action="store_true", help="leave out the stability benchmark")
    a.set_defaults(time_budget=ALL_TIME_BUDGET_S, profile_steps=2)

    sub.add_parser("stability", help="the stability stack's overhead (arguments go to trainopt.perf.bench.stability)",
                   add_help=False)
    return parser


def _device(name: str | None) -> str:
    return name or ("cuda" if torch.cuda.is_available() else "cpu")


def _run(args: argparse.Namespace, configs: list[BenchConfig], **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("profile_steps", args.profile_steps)
    if args.compile_backend != "inductor":
        configs = [replace(c, compile_backend=args.compile_backend) for c in configs]
    return run_matrix(configs, _device(args.device), warmup_steps=args.warmup, steps=args.steps,
                      windows=args.windows, peak_tflops=args.peak_tflops, time_budget_s=args.time_budget,
                      out=args.out, progress=not args.no_progress, **kwargs)


def _matrix(args: argparse.Namespace) -> dict[str, Any]:
    batch = args.batch_size or [DEFAULT_BATCH[args.size]]
    axes = {"precision": args.precision, "checkpointing": [v == "on" for v in args.checkpointing],
            "compile": args.compile, "optimizer": args.optimizer, "attention": args.attention,
            "batch_size": batch, "seq_len": args.seq_len}
    base = BenchConfig(size=args.size, **{k: v[0] for k, v in axes.items()})
    return _run(args, build_matrix(base, {k: v[1:] if not args.grid else v for k, v in axes.items()},
                                   grid=args.grid))


def _recipe(args: argparse.Namespace) -> dict[str, Any]:
    plain, recipe = recipe_pair(args.size, _device(args.device), args.batch_size or DEFAULT_BATCH[args.size],
                                args.seq_len, args.compile)
    results = _run(args, [plain, recipe])
    results["recipe"] = speedup(results, plain.name, recipe.name)
    return results


def run_stability(size: str, device: str, windows: int, steps: int, warmup_steps: int) -> dict[str, Any]:
    """The stability benchmark (:func:`trainopt.perf.bench.stability.run`) with the goal beside it.

    Example:
        >>> from trainopt.perf.bench.cli import run_stability
        >>> result = run_stability("tiny", "cpu", windows=2, steps=1, warmup_steps=1)
        >>> result["status"], sorted(result["ratios"]), result["goal_ratio"]
        ('ok', ['seed_style/bare', 'stabilizer/bare'], 1.02)
    """
    from trainopt.perf.bench import stability as stability_bench

    result = stability_bench.run(size=size, device=device, windows=windows, steps_per_window=steps,
                                 warmup_steps=warmup_steps)
    return {**result, "status": "ok", "goal_ratio": STABILITY_GOAL_RATIO}


def _all(args: argparse.Namespace) -> dict[str, Any]:
    device = _device(args.device)
    started = time.perf_counter()
    first, later = suite(args.preset, device, args.size, args.batch_size)
    results = _run(args, first, started=started)
    results["meta"]["preset"] = args.preset
    results["recipe"] = speedup(results, first[0].name, first[1].name)
    if not args.no_stability:
        elapsed = time.perf_counter() - started
        if args.time_budget is not None and elapsed > args.time_budget:
            results["stability"] = {"status": "skipped", "error": f"time budget of {args.time_budget:g} s reached"}
        else:
            size = args.size or ("124m" if args.preset == "h100" else "tiny")
            try:
                results["stability"] = run_stability(size, device, max(args.windows, 2) * 2, args.steps,
                                                     args.warmup)
            except Exception as exc:  # noqa: BLE001 - keep the matrix results whatever happens here
                results["stability"] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    if args.out is not None:
        write_results(results, args.out)
    return _run(args, later, results=results, started=started)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code.

    Example:
        >>> from trainopt.perf.bench.cli import main
        >>> import contextlib, io
        >>> with contextlib.redirect_stdout(io.StringIO()) as printed:
        ...     code = main(["recipe", "--size", "tiny", "--batch-size", "2", "--seq-len", "8",
        ...                  "--compile-backend", "eager", "--warmup", "1", "--steps", "1",
        ...                  "--windows", "1", "--no-progress"])
        >>> code, "Speed-up" in printed.getvalue()
        (0, True)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["stability"]:
        from trainopt.perf.bench import stability as stability_bench

        return stability_bench.main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    try:
        results = {"matrix": _matrix, "recipe": _recipe, "all": _all}[args.command](args)
    except ValueError as exc:
        build_parser().error(str(exc))
    results["meta"]["command"] = shlex.join(["python", "-m", "trainopt.perf.bench", *argv])
    if args.out is not None:
        write_results(results, args.out)
    print(results_table(results))
    for render in (recipe_summary, goals_summary, profile_table, stability_summary):
        print(render(results))
    return 0
