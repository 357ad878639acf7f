"""What the stability stack costs per step: bare step vs :class:`TrainingStabilizer` vs a seed-style stack.

One run times three variants of the same training step on the reference GPT
(:mod:`trainopt.models`), in interleaved windows so that clock drift and thermal state hit all
three alike:

- ``bare``: autocast forward, backward, fused AdamW step;
- ``stabilizer``: the same step through :class:`~trainopt.stability.stabilizer.TrainingStabilizer`
  (monitors, clipping, on-device skip, boundaries every ``check_every`` steps);
- ``seed_style``: the bare step plus what the seed's monitors do: a ``.item()`` per parameter
  for the gradient norm, ``loss.item()`` for the loss history, and a host-side overflow test.

Each window is timed with CUDA events on a GPU (``time.perf_counter`` on a CPU) after a
warm-up; the per-step time of a variant is the median over its windows. A second check runs 50
steady-state stabilizer steps under ``torch.cuda.set_sync_debug_mode("error")`` on a GPU (under
:class:`~trainopt.stability.syncs.HostSyncCounter` on a CPU): any host sync fails it.

Run it with ``python -m trainopt.perf.bench.stability --out docs/_data/stability_bench.json``
(``--size 124m`` on a GPU, the default there; ``--compile`` to compile the model).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainopt.models import GPT, gpt_config, synthetic_batch
from trainopt.stability.stabilizer import TrainingStabilizer
from trainopt.stability.syncs import HostSyncCounter

VARIANTS = ("bare", "stabilizer", "seed_style")


def bare_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              compute_loss: Callable[[], torch.Tensor], dtype: torch.dtype | None) -> torch.Tensor:
    """(a) The step with nothing added: autocast forward, backward, optimizer step.

    Example:
        >>> import torch
        >>> from trainopt.models import GPT
        >>> from trainopt.models import gpt_config
        >>> from trainopt.models import synthetic_batch
        >>> from trainopt.perf.bench.stability import bare_step
        >>> model = GPT(gpt_config("tiny"))
        >>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        >>> x, y = synthetic_batch(model.config, batch_size=2, seq_len=16)
        >>> before = model.lm_head.weight.clone()
        >>> loss = bare_step(model, optimizer, lambda: model(x, targets=y), dtype=None)
        >>> loss.shape, loss.requires_grad, torch.equal(before, model.lm_head.weight)
        (torch.Size([]), False, False)
    """
    optimizer.zero_grad(set_to_none=True)
    with torch.amp.autocast(model_device(model).type, dtype=dtype, enabled=dtype is not None):
        loss = compute_loss()
    loss.backward()
    optimizer.step()
    return loss.detach()


def seed_style_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    compute_loss: Callable[[], torch.Tensor], dtype: torch.dtype | None,
                    history: list[float], max_norm: float = 1.0) -> torch.Tensor:
    """(c) The seed's monitoring: one ``.item()`` per parameter, ``loss.item()``, a host overflow test.

    Every ``.item()`` waits for the GPU to finish the work queued so far, so the host cannot run
    ahead and the GPU idles while the host queues the next kernels.

    Example:
        >>> import torch
        >>> from trainopt.models import GPT
        >>> from trainopt.models import gpt_config
        >>> from trainopt.models import synthetic_batch
        >>> from trainopt.perf.bench.stability import seed_style_step
        >>> model = GPT(gpt_config("tiny"))
        >>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        >>> x, y = synthetic_batch(model.config, batch_size=2, seq_len=16)
        >>> history = []
        >>> loss = seed_style_step(model, optimizer, lambda: model(x, targets=y), None, history)
        >>> len(history), history[0] == loss.item()  # the loss went to the host
        (1, True)
    """
    optimizer.zero_grad(set_to_none=True)
    with torch.amp.autocast(model_device(model).type, dtype=dtype, enabled=dtype is not None):
        loss = compute_loss()
    loss.backward()
    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += p.grad.norm(2).item() ** 2
    history.append(loss.item())
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if math.isfinite(total):
        optimizer.step()
    return loss.detach()


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.stability import model_device
        >>> model_device(torch.nn.Linear(2, 2))
        device(type='cpu')
    """
    return next(model.parameters()).device


def _timer(device: torch.device) -> tuple[Callable[[], Any], Callable[[Any, Any], float]]:
    """``(mark, elapsed_ms)`` pair: CUDA events on a GPU, perf_counter elsewhere."""
    if device.type == "cuda":
        def mark() -> Any:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        def elapsed(start: Any, end: Any) -> float:
            end.synchronize()
            return start.elapsed_time(end)
        return mark, elapsed
    return time.perf_counter, lambda start, end: (end - start) * 1e3


def _sync_check(stabilizer: TrainingStabilizer, compute_loss: Callable[[], torch.Tensor],
                steps: int = 50) -> dict[str, Any]:
    """Run ``steps`` stabilizer steps between boundaries; report any host sync."""
    stabilizer.check_every = 10**9  # no boundary inside the checked steps
    device = stabilizer.device
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(steps):
                stabilizer.step(compute_loss)
            result = {"method": 'torch.cuda.set_sync_debug_mode("error")', "steps": steps,
                      "passed": True, "error": None}
        except RuntimeError as exc:
            result = {"method": 'torch.cuda.set_sync_debug_mode("error")', "steps": steps,
                      "passed": False, "error": str(exc)[:500]}
        finally:
            torch.cuda.set_sync_debug_mode(0)
        return result
    with HostSyncCounter() as counter:
        for _ in range(steps):
            stabilizer.step(compute_loss)
    return {"method": "HostSyncCounter (aten._local_scalar_dense)", "steps": steps,
            "passed": counter.count == 0, "syncs": counter.count, "error": None}


def run(
    size: str | None = None,
    device: str | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    steps_per_window: int = 10,
    windows: int = 10,
    warmup_steps: int = 5,
    check_every: int = 100,
    compile: bool = False,
    dtype: str = "bf16",
    seed: int = 0,
) -> dict[str, Any]:
    """Time the three variants in one run; return a JSON-ready result.

    Args:
        size: GPT preset (``"tiny"`` on a CPU, ``"124m"`` on a GPU by default).
        device: ``"cuda"`` or ``"cpu"``; the GPU when present by default.
        batch_size: Sequences per step (16 for the GPU presets, 4 for tiny by default).
        seq_len: Tokens per sequence (the preset's block size by default).
        steps_per_window: Steps per timed window.
        windows: Timed windows per variant (interleaved).
        warmup_steps: Untimed steps per variant first (compilation, allocator, kernels).
        check_every: The stabilizer's boundary interval.
        compile: Wrap each model copy in ``torch.compile``.
        dtype: ``"bf16"`` (autocast) or ``"fp32"``.
        seed: Seed of the model and batch.

    Returns:
        A dict with the configuration, the per-step medians (ms), the ratios to ``bare``, the
        sync check, and the hardware and software versions.

    Example:
        >>> from trainopt.perf.bench.stability import run
        >>> result = run(size="tiny", device="cpu", steps_per_window=2, windows=2, warmup_steps=1,
        ...              seq_len=16, batch_size=2)
        >>> sorted(result["ms_per_step"]), result["sync_check"]["passed"]
        (['bare', 'seed_style', 'stabilizer'], True)
    """
    device_ = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = size or ("124m" if device_.type == "cuda" else "tiny")
    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"dtype must be 'bf16' or 'fp32', got {dtype=}")
    for name, value in (("steps_per_window", steps_per_window), ("windows", windows)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    autocast_dtype = torch.bfloat16 if dtype == "bf16" else None
    config = gpt_config(size)
    batch_size = batch_size or (16 if size != "tiny" else 4)
    seq_len = seq_len or config.block_size
    torch.manual_seed(seed)
    base = GPT(config).to(device_)
    x, y = synthetic_batch(config, batch_size, seq_len, device=device_,
                           generator=torch.Generator().manual_seed(seed))
    models = {name: copy.deepcopy(base) for name in VARIANTS}
    del base
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
                  for name, m in models.items()}
    forward = {name: (torch.compile(m) if compile else m) for name, m in models.items()}
    losses = {name: (lambda f=f: f(x, targets=y)) for name, f in forward.items()}
    stabilizer = TrainingStabilizer(models["stabilizer"], optimizers["stabilizer"], dtype=autocast_dtype,
                                    max_grad_norm=1.0, check_every=check_every)
    history: list[float] = []
    steps = {
        "bare": lambda: bare_step(models["bare"], optimizers["bare"], losses["bare"], autocast_dtype),
        "stabilizer": lambda: stabilizer.step(losses["stabilizer"]),
        "seed_style": lambda: seed_style_step(models["seed_style"], optimizers["seed_style"],
                                              losses["seed_style"], autocast_dtype, history),
    }
    for name in VARIANTS:
        for _ in range(warmup_steps):
            steps[name]()
    mark, elapsed = _timer(device_)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for window in range(windows):
        order = VARIANTS[window % 3:] + VARIANTS[:window % 3]  # rotate who goes first
        for name in order:
            if device_.type == "cuda":
                torch.cuda.synchronize()
            start = mark()
            for _ in range(steps_per_window):
                steps[name]()
            end = mark()
            times[name].append(elapsed(start, end) / steps_per_window)
    medians = {name: statistics.median(t) for name, t in times.items()}
    sync = _sync_check(stabilizer, losses["stabilizer"])
    return {
        "benchmark": "stability",
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"),
        "hardware": {
            "device": device_.type,
            "name": torch.cuda.get_device_name(device_) if device_.type == "cuda" else platform.processor() or platform.machine(),
        },
        "software": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()},
        "config": {
            "model": f"GPT {size}", "parameters": models["bare"].num_parameters(), "batch_size": batch_size,
            "seq_len": seq_len, "dtype": dtype, "compile": compile, "optimizer": "AdamW(fused=True)",
            "steps_per_window": steps_per_window, "windows": windows, "warmup_steps": warmup_steps,
            "check_every": check_every,
        },
        "ms_per_step": medians,
        "ms_per_step_all_windows": times,
        "ratios": {
            "stabilizer/bare": medians["stabilizer"] / medians["bare"],
            "seed_style/bare": medians["seed_style"] / medians["bare"],
        },
        "sync_check": sync,
    }


def stability_bench_table(path: str | Path) -> str:
    """MyST Markdown for the page: the measured table, or a note that no GPU run exists yet.

    Example:
        >>> from trainopt.perf.bench.stability import stability_bench_table
        >>> print(stability_bench_table("no/such/file.json").splitlines()[0])
        *Not yet measured on a GPU.* ...
    """
    path = Path(path)
    command = "`python -m trainopt.perf.bench.stability --out docs/_data/stability_bench.json`"
    if not path.exists():
        return f"*Not yet measured on a GPU.* Run {command} on a CUDA machine to fill this table.\n"
    data = json.loads(path.read_text())
    if data.get("hardware", {}).get("device") != "cuda":
        return (f"*Not yet measured on a GPU.* The recorded run is a CPU smoke test "
                f"({data['config']['model']}, {data['date']}); run {command} on a CUDA machine.\n")
    ms, ratios, cfg = data["ms_per_step"], data["ratios"], data["config"]
    sync = data["sync_check"]
    rows = [
        "| variant | ms per step (median) | ratio to bare |",
        "| --- | ---: | ---: |",
        f"| (a) bare step | {ms['bare']:.2f} | 1.000 |",
        f"| (b) TrainingStabilizer | {ms['stabilizer']:.2f} | {ratios['stabilizer/bare']:.3f} |",
        f"| (c) seed-style `.item()` monitoring | {ms['seed_style']:.2f} | {ratios['seed_style/bare']:.3f} |",
        "",
        f"{data['hardware']['name']}, torch {data['software']['torch']} (CUDA {data['software']['cuda']}), "
        f"{data['date']}; {cfg['model']} ({cfg['parameters'] / 1e6:.0f}M parameters), batch "
        f"{cfg['batch_size']} × {cfg['seq_len']} tokens, {cfg['dtype']} autocast, {cfg['optimizer']}, "
        f"{'compiled' if cfg['compile'] else 'eager'}; median of {cfg['windows']} interleaved windows of "
        f"{cfg['steps_per_window']} steps; stabilizer boundary every {cfg['check_every']} steps.",
        "",
        f"Sync check ({sync['method']}, {sync['steps']} steady-state stabilizer steps): "
        f"{'no host sync' if sync['passed'] else 'FAILED: ' + str(sync['error'])}.",
    ]
    return "\n".join(rows) + "\n"


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m trainopt.perf.bench.stability``.

    Example:
        >>> from trainopt.perf.bench.stability import build_parser
        >>> args = build_parser().parse_args(["--out", "bench.json", "--size", "tiny", "--windows", "2"])
        >>> str(args.out), args.size, args.windows, args.steps_per_window, args.compile
        ('bench.json', 'tiny', 2, 10, False)
    """
    parser = argparse.ArgumentParser(prog="python -m trainopt.perf.bench.stability", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--size", choices=["tiny", "small", "124m", "350m"], default=None)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--steps-per-window", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, write the JSON, print the medians; exit 1 if the sync check failed.

    Example:
        >>> import json
        >>> from pathlib import Path
        >>> from trainopt.perf.bench.stability import main
        >>> import contextlib, io, tempfile
        >>> with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()) as out:
        ...     code = main(["--out", f"{tmp}/bench.json", "--size", "tiny", "--device", "cpu",
        ...                  "--batch-size", "2", "--seq-len", "16", "--windows", "1",
        ...                  "--steps-per-window", "1"])
        ...     written = json.loads(Path(tmp, "bench.json").read_text())
        >>> code, json.loads(out.getvalue())["sync_check"], written["config"]["model"]
        (0, True, 'GPT tiny')
    """
    args = build_parser().parse_args(argv)
    result = run(size=args.size, device=args.device, compile=args.compile, windows=args.windows,
                 steps_per_window=args.steps_per_window, batch_size=args.batch_size, seq_len=args.seq_len)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"ms_per_step": result["ms_per_step"], "ratios": result["ratios"],
                      "sync_check": result["sync_check"]["passed"]}, indent=2))
    return 0 if result["sync_check"]["passed"] else 1


if __name__ == "__main__":
    from trainopt.config.cli import run_command

    sys.exit(run_command(main))
