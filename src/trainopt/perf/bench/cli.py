"""``python -m trainopt.perf.bench
{matrix,recipe,stability,experiments,all,compare,scaling,compile,estimate}``.

- ``matrix``: vary one field at a time around a base configuration (the first value given for
  each field), or every combination with ``--grid``.
- ``recipe``: the plain PyTorch loop against the project's recipe, in one run.
- ``stability``: what the stability stack costs per step, and its host syncs.
- ``experiments``: precision, memory, checkpointing, phases and operators of one model (the
  precision, memory, profiling and monitoring pages).
- ``all --preset {cpu,h100} --out-dir DIR``: the suite of the benchmarking page
  (``bench_<preset>.json``), the stability benchmark (``bench_stability_<preset>.json``) and the
  experiments (``perf_<preset>.json``: the 124M model on a GPU, the small one at 16 × 64 tokens
  on a CPU), within ``--time-budget``.
- ``compare A.json B.json``: the speed-up of B over A per configuration, with a bootstrap
  interval of the ratio of medians (:mod:`trainopt.perf.bench.compare`).
- ``scaling --processes N``: throughput of 1 and N gloo processes on a CPU, stand-ins for GPUs,
  and the scaling efficiency with its interval (:mod:`trainopt.perf.bench.scaling`).
- ``compile --modes ...``: compile time, steady-state step, speed-up and break-even point of
  ``torch.compile`` modes against eager (:func:`trainopt.perf.compilation.measure_compile`).

Each writes one results file (:mod:`trainopt.perf.bench.results`) and prints its summary
(:mod:`trainopt.perf.bench.summary`). A mistake in an argument prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from trainopt.config.cli import ArgumentParser, UsageError, output_file, output_folder, positive_int
from trainopt.models import GPT_PRESETS
from trainopt.perf.bench import compare, estimates, experiments, scaling, stability
from trainopt.perf.bench.arguments import (
    at_least_two,
    fraction,
    non_negative_int,
    peak_tflops,
    positive_float,
)
from trainopt.perf.bench.configs import (
    ATTENTION_BACKENDS,
    COMPILE_BACKENDS,
    COMPILE_MODES,
    OPTIMIZERS,
    BenchConfig,
    build_matrix,
)
from trainopt.perf.bench.harness import recipe_pair, run_matrix, speedup
from trainopt.perf.bench.mfu import peak_flops_for
from trainopt.perf.bench.results import write_results
from trainopt.perf.bench.summary import summary
from trainopt.perf.precision import PRECISIONS, supported_precisions

ALL_TIME_BUDGET_S = (
    480.0  # `all --preset h100` fits in one 10-minute GPU call, compilation included
)
DEFAULT_BATCH = {"tiny": 8, "small": 8, "124m": 16, "350m": 16}
SIZES = sorted(GPT_PRESETS)


def check_peaks(
    device: str | torch.device,
    precisions: Sequence[str],
    peak: dict[str, float] | None,
    device_name: str | None = None,
) -> None:
    """Fail before anything runs if a GPU has no peak for one of ``precisions`` (and none is given).

    Example:
        >>> from trainopt.perf.bench.cli import check_peaks
        >>> check_peaks("cuda", ["bf16"], {"*": 400.0}, device_name="NVIDIA H20")  # given: fine
        >>> try:
        ...     check_peaks("cuda", ["fp32", "bf16"], None, device_name="NVIDIA H20")
        ... except Exception as error:
        ...     print(error)
        --peak-tflops: GPU 'NVIDIA H20' is not in the peak table (H100 SXM, H100 PCIe, H100 NVL,
            H200, H200 NVL, A100, A10, L4, L40S); give its dense fp32 TFLOP/s
    """
    for precision in dict.fromkeys(precisions):
        try:
            peak_flops_for(device, precision, peak, device_name=device_name)
        except ValueError as exc:
            raise UsageError("--peak-tflops", str(exc)) from exc


def build_parser() -> ArgumentParser:
    """The argument parser of ``python -m trainopt.perf.bench``.

    Example:
        >>> from trainopt.perf.bench.cli import build_parser
        >>> build_parser().parse_args(["matrix", "--precision", "fp32", "bf16", "--out",
        ...                            "m.json"]).precision
        ['fp32', 'bf16']
    """
    parser = ArgumentParser(
        prog="python -m trainopt.perf.bench", description=" ".join(__doc__.split("\n\n")[0].split())
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    def common(p: argparse.ArgumentParser, out: bool = True) -> None:
        p.add_argument(
            "--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available"
        )
        p.add_argument(
            "--warmup",
            type=non_negative_int,
            default=3,
            help="warm-up steps at least (compilation)",
        )
        p.add_argument(
            "--max-warmup",
            type=positive_int,
            default=100,
            help="warm-up steps at most, if the step time never settles within 10%%",
        )
        p.add_argument("--steps", type=positive_int, default=10, help="steps per timed window")
        p.add_argument(
            "--windows", type=positive_int, default=5, help="timed windows (median and spread)"
        )
        p.add_argument(
            "--peak-tflops",
            type=peak_tflops,
            default=None,
            help="dense peak for MFU: 400, or bf16=835.5,fp32=60 "
            "(needed for a GPU not in the table)",
        )
        p.add_argument(
            "--note", default=None, help="recorded with the results, e.g. 'a shared 2-core VM'"
        )
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        if out:
            p.add_argument(
                "--out", type=output_file, required=True, help="results JSON file to write"
            )

    def model(p: argparse.ArgumentParser, size: str | None = "tiny") -> None:
        p.add_argument("--size", choices=SIZES, default=size, help="model preset")
        p.add_argument(
            "--batch-size",
            type=positive_int,
            default=None,
            help="sequences per step (default: the preset's)",
        )
        p.add_argument(
            "--seq-len", type=non_negative_int, default=0, help="0: the preset's block size"
        )

    def timing(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--compile-backend",
            choices=COMPILE_BACKENDS,
            default="inductor",
            help="torch.compile backend",
        )
        p.add_argument(
            "--profile-steps",
            type=non_negative_int,
            default=0,
            help="profile steps per configuration",
        )
        p.add_argument(
            "--time-budget",
            type=positive_float,
            default=None,
            help="seconds; stop starting configurations",
        )

    m = sub.add_parser("matrix", help="vary one field at a time around a base configuration")
    for add in (common, model, timing):
        add(m)
    m.add_argument(
        "--precision",
        nargs="+",
        choices=PRECISIONS,
        default=list(PRECISIONS),
        help="precisions to time",
    )
    m.add_argument(
        "--checkpointing",
        nargs="+",
        choices=["off", "on"],
        default=["off", "on"],
        help="activation checkpointing off, on, or both",
    )
    m.add_argument(
        "--compile",
        nargs="+",
        choices=COMPILE_MODES,
        default=["none", "default"],
        help="torch.compile modes to time",
    )
    m.add_argument(
        "--optimizer",
        nargs="+",
        choices=OPTIMIZERS,
        default=list(OPTIMIZERS),
        help="optimizers to time",
    )
    m.add_argument(
        "--attention",
        nargs="+",
        choices=ATTENTION_BACKENDS,
        default=["auto"],
        help="attention backends to time",
    )
    m.add_argument(
        "--grid", action="store_true", help="every combination instead of one field at a time"
    )

    r = sub.add_parser("recipe", help="the plain PyTorch loop against the project's recipe")
    for add in (common, model, timing):
        add(r)
    r.add_argument(
        "--compile", choices=COMPILE_MODES[1:], default="default", help="the recipe's compile mode"
    )

    s = sub.add_parser("stability", help="the stability stack's cost per step and its host syncs")
    common(s)
    model(s, size=None)
    s.add_argument(
        "--dtype", choices=["bf16", "fp32"], default="bf16", help="autocast dtype of the model"
    )
    s.add_argument("--compile", action="store_true", help="compile the model")
    s.add_argument(
        "--compile-backend",
        choices=COMPILE_BACKENDS,
        default="inductor",
        help="torch.compile backend",
    )
    s.add_argument(
        "--check-every", type=positive_int, default=100, help="the stabilizer's boundary interval"
    )
    s.add_argument(
        "--forms",
        nargs="+",
        choices=list(stability.FORMS),
        default=None,
        help="optimizer forms to time (default: all)",
    )
    s.add_argument(
        "--sync-steps",
        type=positive_int,
        default=20,
        help="steady-state steps whose host reads are counted, per form",
    )
    s.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch threads (default: torch's); 1 is steadier on a shared CPU",
    )

    e = sub.add_parser(
        "experiments", help="precision, memory, checkpointing and profile of one model"
    )
    common(e)
    model(e, size="124m")
    e.add_argument(
        "--snapshot",
        type=output_file,
        default=None,
        help="also write a CUDA memory snapshot (CUDA only)",
    )

    a = sub.add_parser("all", help="every results file of the pages, for one preset")
    common(a, out=False)
    timing(a)
    a.add_argument(
        "--preset", choices=["cpu", "h100"], required=True, help="the suite of a CPU or of an H100"
    )
    a.add_argument(
        "--out-dir", type=output_folder, required=True, help="folder of the results files"
    )
    a.add_argument(
        "--size", choices=SIZES, default=None, help="replace every model size (a quick try)"
    )
    a.add_argument("--batch-size", type=positive_int, default=None, help="replace every batch size")
    a.set_defaults(time_budget=ALL_TIME_BUDGET_S, profile_steps=2)

    c = sub.add_parser(
        "compare", help="speed-up of B over A per configuration, with a bootstrap interval"
    )
    c.add_argument("baseline", help="results file A (bench kind)")
    c.add_argument("candidate", help="results file B (bench kind)")
    c.add_argument("--confidence", type=fraction, default=0.95, help="coverage of the interval")
    c.add_argument("--resamples", type=positive_int, default=4000, help="bootstrap resamples")

    k = sub.add_parser(
        "compile", help="compile time and steady-state speed-up of torch.compile modes"
    )
    common(k)
    model(k)
    k.add_argument(
        "--modes",
        nargs="+",
        choices=COMPILE_MODES[1:],
        default=["default"],
        help="torch.compile modes",
    )
    k.add_argument(
        "--compile-backend",
        choices=COMPILE_BACKENDS,
        default="inductor",
        help="torch.compile backend",
    )

    m = sub.add_parser(
        "estimate", help="the memory estimate of 13 model families against the CPU peak"
    )
    m.add_argument(
        "--families",
        nargs="+",
        choices=list(estimates.FAMILIES),
        default=None,
        help="default: every family whose packages are installed",
    )
    m.add_argument("--note", default=None, help="recorded with the results")
    m.add_argument("--out", type=output_file, required=True, help="results JSON file to write")

    g = sub.add_parser(
        "scaling", help="throughput of 1 and N gloo processes on a CPU (stand-ins for GPUs)"
    )
    g.add_argument(
        "--processes", type=at_least_two, default=2, help="N, the processes of the parallel run"
    )
    g.add_argument("--size", choices=SIZES, default="tiny", help="model preset")
    g.add_argument(
        "--batch-size", type=positive_int, default=8, help="sequences per process and step"
    )
    g.add_argument("--seq-len", type=positive_int, default=64, help="tokens per sequence")
    g.add_argument("--steps", type=positive_int, default=5, help="steps per timed window")
    g.add_argument(
        "--windows", type=at_least_two, default=10, help="timed windows of each process count"
    )
    g.add_argument("--max-warmup", type=at_least_two, default=20, help="warm-up windows at most")
    g.add_argument("--threads", type=positive_int, default=1, help="torch threads per process")
    g.add_argument("--note", default=None, help="recorded with the results")
    g.add_argument("--out", type=output_file, required=True, help="results JSON file to write")
    return parser


def suite(
    preset: str, device: str, size: str | None = None, batch_size: int | None = None
) -> tuple[list[BenchConfig], list[BenchConfig]]:
    """The configurations of ``all --preset``: those before and after the stability benchmark.

    ``h100`` compares the plain loop and the recipe on the 124M model at 16 × 1024, then runs
    the recipe on the 350M model at batch 32; while time is left at the end, it tries
    ``max-autotune-no-cudagraphs`` at batch 32, batch 16, and cuDNN attention at batch 32.
    ``cpu`` compares the plain loop with bf16, activation checkpointing and the recipe on the
    tiny model. ``size`` and ``batch_size`` replace every size and batch size.

    Example:
        >>> from trainopt.perf.bench.cli import suite
        >>> first, later = suite("h100", "cuda")
        >>> [c.name for c in first][:2], len(later)
        (['124m plain PyTorch loop', '124m trainopt recipe'], 3)
    """
    cuda = torch.device(device).type == "cuda"
    if preset == "cpu":
        plain, recipe = recipe_pair("tiny", device, batch_size=8)
        first = [
            plain,
            replace(plain, precision="bf16", label=""),
            replace(plain, checkpointing=True, label=""),
            recipe,
        ]
        later: list[BenchConfig] = []
    else:
        plain, recipe = recipe_pair("124m", device, batch_size=16, seq_len=1024)
        big = replace(recipe, size="350m", label="", batch_size=32)
        first = [plain, recipe, big]
        later = [
            replace(big, compile="max-autotune-no-cudagraphs"),
            replace(big, batch_size=16),
            replace(big, attention="cudnn" if cuda else "auto"),
        ]
    if size is not None:
        first, later = (
            [
                replace(c, size=size, seq_len=0, label=c.label.replace(c.size, size, 1))
                for c in configs
            ]
            for configs in (first, later)
        )
    if batch_size is not None:
        first, later = (
            [replace(c, batch_size=batch_size) for c in configs] for configs in (first, later)
        )
    first = list(dict.fromkeys(first))
    return first, [c for c in dict.fromkeys(later) if c not in first]


def _checked(build: Any, *args: Any, **kwargs: Any) -> Any:
    """``build(*args, **kwargs)``; a configuration's ValueError (``seq_len must ...``) becomes a
    mistake in the matching argument (``--seq-len``)."""
    try:
        return build(*args, **kwargs)
    except ValueError as exc:
        name, _, rest = str(exc).partition(" must ")
        field = f"--{name.replace('_', '-')}" if rest and name.isidentifier() else "arguments"
        raise UsageError(field, f"must {rest}" if rest else str(exc)) from exc


def _check_shape(size: str, seq_len: int) -> None:
    _checked(BenchConfig, size=size, seq_len=seq_len)


def _run(
    args: argparse.Namespace, configs: list[BenchConfig], command: str, **kwargs: Any
) -> dict[str, Any]:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_peaks(device, [c.precision for c in configs], args.peak_tflops)
    configs = [replace(c, compile_backend=args.compile_backend) for c in configs]
    return run_matrix(
        configs,
        device,
        warmup_steps=args.warmup,
        max_warmup_steps=args.max_warmup,
        steps=args.steps,
        windows=args.windows,
        peak_tflops=args.peak_tflops,
        time_budget_s=args.time_budget,
        progress=not args.no_progress,
        profile_steps=args.profile_steps,
        command=command,
        note=args.note,
        **kwargs,
    )


def _matrix(args: argparse.Namespace, command: str) -> dict[str, Any]:
    axes = {
        "precision": args.precision,
        "checkpointing": [v == "on" for v in args.checkpointing],
        "compile": args.compile,
        "optimizer": args.optimizer,
        "attention": args.attention,
    }
    base = _checked(
        BenchConfig,
        size=args.size,
        batch_size=args.batch_size or DEFAULT_BATCH[args.size],
        seq_len=args.seq_len,
        **{k: v[0] for k, v in axes.items()},
    )
    configs = build_matrix(
        base, {k: v if args.grid else v[1:] for k, v in axes.items()}, grid=args.grid
    )
    return _run(args, configs, command, out=args.out)


def _recipe(args: argparse.Namespace, command: str) -> dict[str, Any]:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    plain, recipe = _checked(
        recipe_pair,
        args.size,
        device,
        args.batch_size or DEFAULT_BATCH[args.size],
        args.seq_len,
        args.compile,
    )
    results = _run(args, [plain, recipe], command, out=args.out)
    results["recipe"] = speedup(results, plain.name, recipe.name)
    return results


def _stability(args: argparse.Namespace, command: str) -> dict[str, Any]:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    _check_shape(args.size or ("124m" if device == "cuda" else "tiny"), args.seq_len)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads or threads)
    try:
        return stability.run(
            size=args.size,
            device=args.device,
            batch_size=args.batch_size,
            seq_len=args.seq_len or None,
            steps_per_window=args.steps,
            windows=args.windows,
            warmup_steps=args.warmup,
            max_warmup_steps=args.max_warmup,
            check_every=args.check_every,
            compile=args.compile,
            compile_backend=args.compile_backend,
            dtype=args.dtype,
            forms=args.forms,
            sync_steps=args.sync_steps,
            command=command,
            note=args.note,
        )
    finally:
        torch.set_num_threads(threads)


def _experiments(args: argparse.Namespace, command: str) -> dict[str, Any]:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_peaks(device, supported_precisions(device), args.peak_tflops)
    _check_shape(args.size, args.seq_len)
    if args.snapshot is not None and device != "cuda":
        raise UsageError("--snapshot", f"records CUDA allocations; the device here is {device!r}")
    return experiments.run(
        args.size,
        device,
        args.batch_size,
        args.seq_len or None,
        args.steps,
        args.warmup,
        args.max_warmup,
        args.snapshot,
        command=command,
        note=args.note,
    )


def _all(args: argparse.Namespace, command: str) -> dict[str, Any]:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_peaks(device, supported_precisions(device), args.peak_tflops)
    started = time.perf_counter()
    first, later = _checked(suite, args.preset, device, args.size, args.batch_size)
    out = args.out_dir / f"bench_{args.preset}.json"
    results = _run(args, first, command, out=out, started=started)
    recipe = next(c.name for c in first if c.label.endswith("trainopt recipe"))
    results["recipe"] = speedup(results, first[0].name, recipe)
    write_results(results, out)
    gpu = args.preset == "h100"
    small = args.size or ("124m" if gpu else "tiny")
    jobs = {
        "bench_stability": lambda: stability.run(
            size=small,
            device=device,
            batch_size=args.batch_size,
            steps_per_window=args.steps,
            windows=max(args.windows, 10) * 2,
            warmup_steps=args.warmup,
            max_warmup_steps=args.max_warmup,
            compile=gpu,
            compile_backend=args.compile_backend,
            command=command,
            note=args.note,
        ),
        "perf": lambda: experiments.run(
            args.size or ("124m" if gpu else "small"),
            device,
            args.batch_size or (None if gpu else 16),
            None if gpu or args.size else 64,
            args.steps,
            args.warmup,
            args.max_warmup,
            command=command,
            note=args.note,
        ),
    }
    for name, job in jobs.items():
        if time.perf_counter() - started > args.time_budget:
            print(
                f"{name}_{args.preset}.json: skipped, "
                f"time budget of {args.time_budget:g} s reached",
                file=sys.stderr,
            )
            continue
        write_results(job(), args.out_dir / f"{name}_{args.preset}.json")
    return _run(args, later, command, out=out, results=results, started=started)


def _compare(args: argparse.Namespace) -> str:
    try:
        baseline, candidate = compare.load_pair(args.baseline, args.candidate)
    except FileNotFoundError as exc:
        raise UsageError(str(exc), "no such results file") from exc
    except (ValueError, OSError) as exc:
        raise UsageError("baseline/candidate", str(exc).splitlines()[0]) from exc
    rows = compare.compare_results(
        baseline, candidate, confidence=args.confidence, resamples=args.resamples
    )
    if not rows:
        raise UsageError(
            "candidate", f"no configuration measured in both {args.baseline} and {args.candidate}"
        )
    return compare.render_comparison(rows)


def _scaling(args: argparse.Namespace, command: str) -> dict[str, Any]:
    _check_shape(args.size, args.seq_len)
    return scaling.run(
        args.processes,
        args.size,
        args.batch_size,
        args.seq_len,
        args.steps,
        args.windows,
        args.max_warmup,
        args.threads,
        command=command,
        note=args.note,
    )


def _compile(args: argparse.Namespace, command: str) -> dict[str, Any]:
    from trainopt.perf.compilation import measure_compile

    _check_shape(args.size, args.seq_len)
    return measure_compile(
        args.size,
        args.device or ("cuda" if torch.cuda.is_available() else "cpu"),
        args.batch_size or DEFAULT_BATCH[args.size],
        args.seq_len or None,
        args.modes,
        args.compile_backend,
        args.steps,
        args.windows,
        args.warmup,
        args.max_warmup,
        command=command,
        note=args.note,
    )


def _estimate(args: argparse.Namespace, command: str) -> dict[str, Any]:
    missing = [f for f in args.families or () if f not in estimates.available_families()]
    if missing:
        raise UsageError(
            "--families",
            f"{missing[0]} needs {estimates.NEEDS[missing[0]]} (pip install 'trainopt[hf]')",
        )
    return estimates.run(args.families, command=command, note=args.note)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand, write its results file, print its summary; returns the exit status.

    Example:
        >>> import contextlib, io, json, tempfile
        >>> from pathlib import Path
        >>> from trainopt.perf.bench.cli import main
        >>> out = Path(tempfile.mkdtemp()) / "recipe.json"
        >>> with contextlib.redirect_stdout(io.StringIO()) as printed:
        ...     code = main(["recipe", "--size", "tiny", "--batch-size", "2", "--seq-len", "8",
        ...                  "--compile-backend", "eager", "--warmup", "1", "--max-warmup", "2",
        ...                  "--steps", "1",
        ...                  "--windows", "1", "--no-progress", "--out", str(out)])
        >>> code, "speed-up of" in printed.getvalue(), json.loads(out.read_text())["kind"]
        (0, True, 'bench')
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    command = shlex.join(["python", "-m", "trainopt.perf.bench", *argv])
    if args.command == "compare":
        print(_compare(args))
        return 0
    run = {
        "matrix": _matrix,
        "recipe": _recipe,
        "stability": _stability,
        "experiments": _experiments,
        "all": _all,
        "scaling": _scaling,
        "compile": _compile,
        "estimate": _estimate,
    }[args.command]
    results = run(args, command)
    if args.command != "all":
        write_results(results, args.out)
    print(summary(results), end="")
    return 0
