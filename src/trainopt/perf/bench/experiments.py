"""The measurements behind the performance pages, on the reference GPT.

Run on a GPU (about two minutes for the 124M model on an H100)::

    python -m trainopt.perf.bench.experiments --out docs/_data/perf_h100.json --size 124m

It measures, with the same model, batch and optimizer (AdamW) for every row:

- step time, tokens/s, MFU and peak memory for ``fp32``, ``tf32``, ``bf16`` and ``fp16``;
- peak memory and step time without activation checkpointing, checkpointing every block,
  every second block, and selectively (matmul and attention outputs kept);
- :func:`trainopt.perf.estimate.estimate_training_memory` beside each measured peak;
- memory per phase of one step, and the top operators of a profiled step;
- the hardware, torch/CUDA versions, command and date.

``--size tiny --device cpu`` runs the same code in seconds on a CPU (memory is then not
measured: PyTorch keeps no allocator statistics for CPU tensors).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trainopt.models import GPT, Block, gpt_config, synthetic_batch
from trainopt.perf.estimate import estimate_training_memory
from trainopt.perf.memory import (
    MemoryTracker,
    apply_activation_checkpointing,
    record_memory_history,
)
from trainopt.perf.precision import PRECISIONS, Precision, PrecisionNotSupportedError
from trainopt.perf.profiling import StepProfiler, StepTimer
from trainopt.perf.throughput import device_peak_flops, mfu

CHECKPOINT_POLICIES: dict[str, dict[str, Any]] = {
    "none": {},
    "every block": {"every": 1},
    "every 2nd block": {"every": 2},
    "selective": {"every": 1, "selective": True},
}
DEFAULT_BATCH = {"tiny": 4, "small": 8, "124m": 16, "350m": 8}


def train_step(model: GPT, optimizer: torch.optim.Optimizer, precision: Precision,
               x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One training step: forward under autocast, (scaled) backward, step, free gradients.

    Returns the loss as a tensor on the device (no host sync).

    Example:
        >>> import torch
        >>> from trainopt.models import GPT
        >>> from trainopt.models import gpt_config
        >>> from trainopt.models import synthetic_batch
        >>> from trainopt.perf.bench.experiments import train_step
        >>> from trainopt.perf.precision import Precision
        >>> model = GPT(gpt_config("tiny"))
        >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        >>> x, y = synthetic_batch(model.config, batch_size=2, seq_len=16)
        >>> loss = train_step(model, opt, Precision.from_name("bf16", "cpu"), x, y)
        >>> loss.shape, all(p.grad is None for p in model.parameters())
        (torch.Size([]), True)
    """
    with precision.autocast():
        loss = model(x, targets=y)
    precision.backward(loss)
    precision.step(optimizer)
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def _setup(size: str, device: torch.device, seed: int = 0) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    with device:  # initialise on the device: fast for the large presets
        model = GPT(gpt_config(size))
    fused = {"fused": True} if device.type == "cuda" else {}
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def measure(size: str, precision_name: str, device: torch.device, batch_size: int, seq_len: int,
            steps: int, warmup: int, policy: str = "none") -> dict[str, Any]:
    """Train ``warmup + steps`` steps of one configuration; return its timings and memory.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.experiments import measure
        >>> row = measure("tiny", "fp32", torch.device("cpu"), batch_size=2, seq_len=16,
        ...               steps=1, warmup=1, policy="every block")
        >>> row["checkpointed_layers"], row["peak_memory_bytes"], row["tokens_per_s"] > 0
        (2, None, True)
    """
    precision = Precision.from_name(precision_name, device, scaler="torch")
    model, optimizer = _setup(size, device)
    options = CHECKPOINT_POLICIES[policy]
    layers = apply_activation_checkpointing(model, Block, **options) if options else []
    x, y = synthetic_batch(model.config, batch_size, seq_len, device=device,
                           generator=torch.Generator().manual_seed(1))
    timer = StepTimer(device, warmup=warmup)
    with precision.matmul_settings():
        for i in range(warmup + steps):
            if i == warmup:  # optimizer states exist now; measure the steady state
                _free(device)
            with timer.step():
                loss = train_step(model, optimizer, precision, x, y)
    summary = timer.summary()
    tokens_per_s = batch_size * seq_len / (summary["median_ms"] / 1e3)
    cuda = device.type == "cuda"
    peak = device_peak_flops(torch.cuda.get_device_name(device), precision_name) if cuda else None
    selective = bool(options.get("selective"))
    estimate = None if selective else estimate_training_memory(
        model, precision_name, batch_size=batch_size, seq_len=seq_len,
        checkpointed_layers=len(layers)).peak
    row = {
        "precision": precision_name, "policy": policy, "checkpointed_layers": len(layers),
        "step_time_median_ms": summary["median_ms"], "step_time_p10_ms": summary["p10_ms"],
        "step_time_p90_ms": summary["p90_ms"], "tokens_per_s": tokens_per_s,
        "peak_flops": peak, "mfu": mfu(model.flops_per_token(seq_len), tokens_per_s, peak) if peak else None,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "estimate_bytes": estimate, "loss": float(loss),
    }
    del model, optimizer
    _free(device)
    return row


def phase_memory(size: str, precision_name: str, device: torch.device, batch_size: int,
                 seq_len: int) -> list[dict[str, Any]]:
    """Allocated, reserved and peak memory after forward, backward and optimizer step.

    Returns one dict per phase on CUDA; an empty list on a CPU, which keeps no allocator
    statistics.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.experiments import phase_memory
        >>> phase_memory("tiny", "fp32", torch.device("cpu"), batch_size=2, seq_len=16)
        []
    """
    precision = Precision.from_name(precision_name, device)
    model, optimizer = _setup(size, device)
    x, y = synthetic_batch(model.config, batch_size, seq_len, device=device)
    tracker = MemoryTracker(device)
    with precision.matmul_settings():
        for step in range(2):  # the second step has optimizer states
            tracker.phases.clear()
            with tracker.phase("forward"), precision.autocast():
                loss = model(x, targets=y)
            with tracker.phase("backward"):
                precision.backward(loss)
            with tracker.phase("optimizer"):
                precision.step(optimizer)
                optimizer.zero_grad(set_to_none=True)
    del model, optimizer, loss
    _free(device)
    return [dataclasses.asdict(p) for p in tracker.phases] if tracker.available else []


def top_operators(size: str, precision_name: str, device: torch.device, batch_size: int,
                  seq_len: int, n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` operators with the most self time over two profiled steps.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.experiments import top_operators
        >>> ops = top_operators("tiny", "fp32", torch.device("cpu"), batch_size=2, seq_len=16, n=5)
        >>> len(ops), sorted(ops[0]), ops[0]["self_cpu_us"] >= ops[-1]["self_cpu_us"]
        (5, ['calls', 'name', 'self_cpu_us', 'self_device_us'], True)
    """
    precision = Precision.from_name(precision_name, device)
    model, optimizer = _setup(size, device)
    x, y = synthetic_batch(model.config, batch_size, seq_len, device=device)
    with precision.matmul_settings(), StepProfiler(device, wait=1, warmup=1, active=2) as prof:
        for _ in range(prof.total_steps):
            train_step(model, optimizer, precision, x, y)
            prof.step()
    del model, optimizer
    _free(device)
    return [dataclasses.asdict(op) for op in prof.top_operators(n)]


def environment(device: torch.device) -> dict[str, Any]:
    """Hardware and software the numbers were taken with.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.experiments import environment
        >>> env = environment(torch.device("cpu"))
        >>> env["device_type"], env["cuda"], env["torch"] == torch.__version__
        ('cpu', None, True)
    """
    cuda = device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine(),
        "device_type": device.type,
        "device_memory_bytes": torch.cuda.get_device_properties(device).total_memory if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def run(size: str = "124m", device: str | None = None, batch_size: int | None = None,
        seq_len: int | None = None, steps: int = 10, warmup: int = 3,
        snapshot: str | Path | None = None) -> dict[str, Any]:
    """All measurements for one model size, as the JSON document the pages render.

    Example:
        >>> from trainopt.perf.bench.experiments import run
        >>> results = run("tiny", device="cpu", batch_size=2, seq_len=16, steps=2, warmup=1)
        >>> [r["precision"] for r in results["precision"] if r["supported"]]
        ['fp32', 'bf16']
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config = gpt_config(size)
    batch_size = batch_size or DEFAULT_BATCH[size]
    seq_len = seq_len or config.block_size
    model = GPT(config)
    common = dict(size=size, device=dev, batch_size=batch_size, seq_len=seq_len)
    results: dict[str, Any] = {
        "schema": 1,
        "environment": environment(dev),
        "model": {"size": size, "parameters": model.num_parameters(), "n_layer": config.n_layer,
                  "n_head": config.n_head, "n_embd": config.n_embd, "vocab_size": config.vocab_size,
                  "batch_size": batch_size, "seq_len": seq_len, "tokens_per_step": batch_size * seq_len,
                  "flops_per_token": model.flops_per_token(seq_len)},
        "settings": {"steps": steps, "warmup": warmup, "optimizer": "AdamW" + (" (fused)" if dev.type == "cuda" else ""),
                     "fp16_scaler": "torch.amp.GradScaler",
                     "statistic": "median over the timed steps"},
        "precision": [],
    }
    del model
    for name in PRECISIONS:
        try:
            Precision.from_name(name, dev)
        except PrecisionNotSupportedError as exc:
            results["precision"].append({"precision": name, "supported": False, "reason": str(exc)})
            continue
        row = _attempt(measure, {"precision": name, "policy": "none"},
                       precision_name=name, steps=steps, warmup=warmup, **common)
        results["precision"].append({"supported": True} | row)
    ok = {r["precision"] for r in results["precision"] if r["supported"] and "error" not in r}
    low = "bf16" if "bf16" in ok else "fp32"
    baseline = next(r for r in results["precision"] if r["precision"] == low)
    rows = [baseline | {}] + [_attempt(measure, {"precision": low, "policy": p}, precision_name=low,
                                       steps=steps, warmup=warmup, policy=p, **common)
                              for p in CHECKPOINT_POLICIES if p != "none"]
    results["checkpointing"] = {"precision": low, "rows": [_relative(r, rows[0]) for r in rows]}
    results["phases"] = {"precision": low, "rows": _attempt(phase_memory, [], precision_name=low, **common)}
    results["top_operators"] = {"precision": low, "rows": _attempt(top_operators, [], precision_name=low, **common)}
    if snapshot is not None:
        results["snapshot"] = str(write_snapshot(snapshot, precision_name=low, **common))
    return results


def _attempt(fn: Any, fallback: Any, **kwargs: Any) -> Any:
    """``fn(**kwargs)``; on an error (out of memory, say) record it instead of losing the run."""
    try:
        return fn(**kwargs)
    except Exception as exc:  # noqa: BLE001 - one failed configuration must not lose the others
        _free(kwargs["device"])
        print(f"{fn.__name__} {kwargs.get('precision_name')} {kwargs.get('policy', '')} failed: {exc!r}",
              file=sys.stderr)
        if isinstance(fallback, dict):
            return fallback | {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        return fallback


def _relative(row: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    if "error" in row or "error" in base:
        return {"policy": row["policy"], "error": row.get("error") or base["error"]}
    out = {k: row[k] for k in ("policy", "checkpointed_layers", "step_time_median_ms",
                               "peak_memory_bytes", "estimate_bytes")}
    out["time_change"] = row["step_time_median_ms"] / base["step_time_median_ms"] - 1
    measured = row["peak_memory_bytes"] is not None and base["peak_memory_bytes"]
    out["memory_change"] = row["peak_memory_bytes"] / base["peak_memory_bytes"] - 1 if measured else None
    out["meets_goal"] = (out["memory_change"] <= -0.30 and out["time_change"] <= 0.20) if measured else None
    return out


def write_snapshot(path: str | Path, size: str, precision_name: str, device: torch.device,
                   batch_size: int, seq_len: int) -> Path:
    """Record a CUDA memory snapshot of three training steps to ``path`` (for memory_viz).

    Raises:
        RuntimeError: CUDA is not available (see :func:`~trainopt.perf.memory.record_memory_history`).

    Example:
        >>> import torch
        >>> from pathlib import Path
        >>> from trainopt.perf.bench.experiments import write_snapshot
        >>> import tempfile
        >>> device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     try:
        ...         result = write_snapshot(Path(tmp, "snapshot.pickle"), "tiny", "fp32", device,
        ...                                 batch_size=2, seq_len=16).stat().st_size > 0
        ...     except RuntimeError as err:  # no CUDA here: nothing to record
        ...         result = str(err)
        >>> result in (True, "record_memory_history needs CUDA: torch.cuda.is_available() is False")
        True
    """
    precision = Precision.from_name(precision_name, device)
    model, optimizer = _setup(size, device)
    x, y = synthetic_batch(model.config, batch_size, seq_len, device=device)
    with precision.matmul_settings(), record_memory_history(path) as out:
        for _ in range(3):
            train_step(model, optimizer, precision, x, y)
    del model, optimizer
    _free(device)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m trainopt.perf.bench.experiments``.

    Example:
        >>> from trainopt.perf.bench.experiments import build_parser
        >>> args = build_parser().parse_args(["--out", "perf.json", "--size", "tiny", "--steps", "2"])
        >>> str(args.out), args.size, args.steps, args.warmup, args.device
        ('perf.json', 'tiny', 2, 3, None)
    """
    parser = argparse.ArgumentParser(prog="python -m trainopt.perf.bench.experiments", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    parser.add_argument("--size", default="124m", choices=["tiny", "small", "124m", "350m"])
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 16 for 124m, 8 for 350m")
    parser.add_argument("--seq-len", type=int, default=None, help="default: the model's block size")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--snapshot", type=Path, default=None, help="also write a CUDA memory snapshot")
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command line: measure and write the JSON results file.

    Example:
        >>> import json
        >>> from pathlib import Path
        >>> from trainopt.perf.bench.experiments import main
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     results = main(["--out", f"{tmp}/perf.json", "--size", "tiny", "--device", "cpu",
        ...                     "--batch-size", "2", "--seq-len", "16", "--steps", "1", "--warmup", "1"])
        ...     written = json.loads(Path(tmp, "perf.json").read_text())
        >>> written == results, written["model"]["size"], written["command"].endswith("--warmup 1")
        (True, 'tiny', True)
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error(f"--steps and --warmup must be >= 1, got steps={args.steps}, warmup={args.warmup}")
    results = run(args.size, args.device, args.batch_size, args.seq_len, args.steps, args.warmup, args.snapshot)
    results["command"] = "python -m trainopt.perf.bench.experiments " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    from trainopt.config.cli import run_command

    sys.exit(run_command(main))
