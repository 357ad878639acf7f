"""The measurements behind the precision, memory, profiling and monitoring pages, on the
reference GPT.

``python -m trainopt.perf.bench experiments --size 124m --out perf_h100.json`` (about two
minutes on an H100; ``all`` runs it too) measures, with the same model, batch and fused AdamW
for every row:

- step time (median and p10–p90 after a warm-up until stable), tokens/s, MFU and peak memory
  for each precision the device runs (``fp32``, ``tf32``, ``bf16``, ``fp16``);
- peak memory and step time without activation checkpointing, checkpointing every block,
  every second block, and selectively (matmul and attention outputs kept);
- :func:`trainopt.perf.estimate.estimate_training_memory` beside each measured peak;
- memory per phase of one step, and the top operators of a profiled step.

On a CPU the same code runs, and memory is measured by counting live tensor storages
(:class:`~trainopt.perf.peak.LiveStorageTracker`) instead of CUDA's allocator statistics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trainopt.models import GPT, Block, gpt_config, synthetic_batch
from trainopt.perf.bench.mfu import mfu, peak_flops_for
from trainopt.perf.bench.results import new_results
from trainopt.perf.bench.timer import spread, warm_up
from trainopt.perf.estimate import estimate_training_memory
from trainopt.perf.memory import (
    MemoryTracker,
    apply_activation_checkpointing,
    record_memory_history,
)
from trainopt.perf.peak import LiveStorageTracker, measure_peak_memory, training_state
from trainopt.perf.precision import PRECISIONS, Precision, PrecisionNotSupportedError
from trainopt.perf.profiling import StepProfiler, StepTimer, summarize

CHECKPOINT_POLICIES: dict[str, dict[str, Any]] = {
    "none": {},
    "every block": {"every": 1},
    "every 2nd block": {"every": 2},
    "selective": {"every": 1, "selective": True},
}
DEFAULT_BATCH = {"tiny": 4, "small": 8, "124m": 16, "350m": 8}


def train_step(
    model: GPT,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    x: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
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
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(
    step: Any,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    batch: list[torch.Tensor],
    device: torch.device,
) -> int:
    """The peak of one more steady-state step: CUDA's allocator peak, or live storages on a CPU."""
    if device.type != "cuda":
        return measure_peak_memory(step, model, optimizer, batch, device)
    _free(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def measure(
    size: str,
    precision_name: str,
    device: torch.device,
    batch_size: int,
    seq_len: int,
    steps: int,
    warmup: int,
    max_warmup: int = 100,
    policy: str = "none",
) -> dict[str, Any]:
    """Warm up until stable, time ``steps`` steps, then measure one step's peak memory.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.experiments import measure
        >>> row = measure("tiny", "fp32", torch.device("cpu"), batch_size=2, seq_len=16,
        ...               steps=2, warmup=1, policy="every block")
        >>> near_estimate = row["peak_memory_bytes"] > row["estimate_bytes"] * 0.95
        >>> row["checkpointed_layers"], near_estimate, row["mfu"]
        (2, True, None)
    """
    precision = Precision.from_name(precision_name, device, scaler="torch")
    model, optimizer = _setup(size, device)
    options = CHECKPOINT_POLICIES[policy]
    layers = apply_activation_checkpointing(model, Block, **options) if options else []
    x, y = synthetic_batch(
        model.config, batch_size, seq_len, device=device, generator=torch.Generator().manual_seed(1)
    )
    step = functools.partial(train_step, model, optimizer, precision, x, y)
    timer = StepTimer(device, warmup=0)
    with precision.matmul_settings():
        warmup_record = warm_up(step, device, min_steps=warmup, window=steps, max_steps=max_warmup)
        for _ in range(steps):
            with timer.step():
                loss = step()
        peak_memory = _peak_memory(step, model, optimizer, [x, y], device)
    times = timer.times_ms()
    summary = summarize(times)
    tokens_per_s = batch_size * seq_len / (summary["median_ms"] / 1e3)
    peak, _ = peak_flops_for(device, precision_name)
    estimate = (
        None
        if options.get("selective")
        else estimate_training_memory(
            model,
            precision_name,
            batch_size=batch_size,
            seq_len=seq_len,
            checkpoint_every=options.get("every", 0),
            implementation="fused",
            device=device,
        ).peak
    )
    row = {
        "precision": precision_name,
        "policy": policy,
        "checkpointed_layers": len(layers),
        "warmup": warmup_record,
        "step_times_ms": times,
        "step_time_ms": spread(times),
        "step_time_median_ms": summary["median_ms"],
        "step_time_p10_ms": summary["p10_ms"],
        "step_time_p90_ms": summary["p90_ms"],
        "tokens_per_s": tokens_per_s,
        "peak_flops": peak,
        "mfu": mfu(model.flops_per_token(seq_len), tokens_per_s, peak) if peak else None,
        "samples_per_s": tokens_per_s / seq_len,
        "peak_memory_bytes": peak_memory,
        "estimate_bytes": estimate,
        "estimate_error": None if estimate is None else estimate / peak_memory - 1,
        "loss": float(loss),
    }
    del model, optimizer
    _free(device)
    return row


def phase_memory(
    size: str, precision_name: str, device: torch.device, batch_size: int, seq_len: int
) -> list[dict[str, Any]]:
    """Memory after each phase of a steady-state step (forward, backward, optimizer) and the peak
    in it.

    On CUDA from the allocator (:class:`~trainopt.perf.memory.MemoryTracker`: allocated,
    reserved, peak); on a CPU from live storages (allocated and peak; a CPU has no caching
    allocator, so ``reserved`` is ``None``).

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.experiments import phase_memory
        >>> rows = phase_memory("tiny", "fp32", torch.device("cpu"), batch_size=2, seq_len=16)
        >>> [r["phase"] for r in rows], rows[0]["reserved"]  # a CPU has no caching allocator
        (['forward', 'backward', 'optimizer'], None)
        >>> # zero_grad freed the gradients:
        >>> rows[2]["allocated"] < rows[1]["allocated"] <= rows[1]["peak"]
        True
    """
    precision = Precision.from_name(precision_name, device)
    model, optimizer = _setup(size, device)
    x, y = synthetic_batch(model.config, batch_size, seq_len, device=device)
    cuda_tracker, live, rows = MemoryTracker(device), LiveStorageTracker(device), []
    with precision.matmul_settings():
        train_step(model, optimizer, precision, x, y)  # AdamW creates its state
        live.count([*training_state(model, optimizer), x, y])
        phase = (
            cuda_tracker.phase
            if cuda_tracker.available
            else functools.partial(_live_phase, live, rows=rows)
        )
        with phase("forward"), precision.autocast():
            loss = model(x, targets=y)
        with phase("backward"):
            precision.backward(loss)
        with phase("optimizer"):
            precision.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
    del model, optimizer, loss
    _free(device)
    return [dataclasses.asdict(p) for p in cuda_tracker.phases] if cuda_tracker.available else rows


@contextlib.contextmanager
def _live_phase(live: LiveStorageTracker, name: str, rows: list[dict[str, Any]]) -> Iterator[None]:
    live.reset_peak()
    with live:
        yield
    rows.append({"phase": name, "allocated": live.current, "reserved": None, "peak": live.peak})


def top_operators(
    size: str, precision_name: str, device: torch.device, batch_size: int, seq_len: int, n: int = 10
) -> list[dict[str, Any]]:
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


def run(
    size: str = "124m",
    device: str | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    steps: int = 10,
    warmup: int = 3,
    max_warmup: int = 100,
    snapshot: str | Path | None = None,
    command: str | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """All measurements for one model size: a results document of kind ``"experiments"``.

    Example:
        >>> from trainopt.perf.bench.experiments import run
        >>> results = run("tiny", device="cpu", batch_size=2, seq_len=16, steps=2, warmup=1)
        >>> results["kind"], [r["precision"] for r in results["precision"] if r["supported"]]
        ('experiments', ['fp32', 'bf16'])
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config = gpt_config(size)
    batch_size = batch_size or DEFAULT_BATCH[size]
    seq_len = seq_len or config.block_size
    supported = [name for name in PRECISIONS if _supported(name, dev)]
    for name in supported:
        peak_flops_for(dev, name)  # a GPU missing from the peak table fails here, before any run
    with torch.device("meta"):
        model = GPT(config)
    common = {"size": size, "device": dev, "batch_size": batch_size, "seq_len": seq_len}
    results = new_results(
        "experiments",
        dev,
        command,
        note,
        steps=steps,
        warmup_steps=warmup,
        max_warmup_steps=max_warmup,
    )
    results.update(
        {
            "model": {
                "size": size,
                "parameters": model.num_parameters(),
                "n_layer": config.n_layer,
                "n_head": config.n_head,
                "n_embd": config.n_embd,
                "vocab_size": config.vocab_size,
                "batch_size": batch_size,
                "seq_len": seq_len,
                "tokens_per_step": batch_size * seq_len,
                "flops_per_token": model.flops_per_token(seq_len),
            },
            "optimizer": "AdamW (fused)",
            "precision": [],
        }
    )
    for name in PRECISIONS:
        if name not in supported:
            results["precision"].append(
                {"precision": name, "supported": False, "reason": _unsupported_reason(name, dev)}
            )
            continue
        row = _attempt(
            measure,
            {"precision": name, "policy": "none"},
            precision_name=name,
            steps=steps,
            warmup=warmup,
            max_warmup=max_warmup,
            **common,
        )
        results["precision"].append({"supported": True} | row)
    ok = {r["precision"]: r for r in results["precision"] if r["supported"] and "error" not in r}
    for row in ok.values():
        row["speedup_vs_fp32"] = (
            ok["fp32"]["step_time_median_ms"] / row["step_time_median_ms"] if "fp32" in ok else None
        )
    low = "bf16" if "bf16" in ok else "fp32"
    baseline = next(r for r in results["precision"] if r["precision"] == low)
    rows = [baseline | {}] + [
        _attempt(
            measure,
            {"precision": low, "policy": p},
            precision_name=low,
            steps=steps,
            warmup=warmup,
            max_warmup=max_warmup,
            policy=p,
            **common,
        )
        for p in CHECKPOINT_POLICIES
        if p != "none"
    ]
    results["checkpointing"] = {"precision": low, "rows": [_relative(r, rows[0]) for r in rows]}
    results["phases"] = {
        "precision": low,
        "rows": _attempt(phase_memory, [], precision_name=low, **common),
    }
    results["top_operators"] = {
        "precision": low,
        "rows": _attempt(top_operators, [], precision_name=low, **common),
    }
    if snapshot is not None:
        results["snapshot"] = str(write_snapshot(snapshot, precision_name=low, **common))
    return results


def _supported(name: str, device: torch.device) -> bool:
    return _unsupported_reason(name, device) is None


def _unsupported_reason(name: str, device: torch.device) -> str | None:
    try:
        Precision.from_name(name, device)
    except PrecisionNotSupportedError as exc:
        return str(exc)
    return None


def _attempt(fn: Any, fallback: Any, **kwargs: Any) -> Any:
    """``fn(**kwargs)``; on an error (out of memory, say) record it instead of losing the run."""
    try:
        return fn(**kwargs)
    except Exception as exc:  # noqa: BLE001 - one failed configuration must not lose the others
        _free(kwargs["device"])
        print(
            f"{fn.__name__} {kwargs.get('precision_name')} {kwargs.get('policy', '')} "
            f"failed: {exc!r}",
            file=sys.stderr,
        )
        if isinstance(fallback, dict):
            return fallback | {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        return fallback


def _relative(row: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    if "error" in row or "error" in base:
        return {"policy": row["policy"], "error": row.get("error") or base["error"]}
    out = {
        k: row[k]
        for k in (
            "policy",
            "checkpointed_layers",
            "step_time_median_ms",
            "step_time_ms",
            "peak_memory_bytes",
            "estimate_bytes",
            "estimate_error",
        )
    }
    out["time_change"] = row["step_time_median_ms"] / base["step_time_median_ms"] - 1
    out["memory_change"] = row["peak_memory_bytes"] / base["peak_memory_bytes"] - 1
    out["meets_goal"] = out["memory_change"] <= -0.30 and out["time_change"] <= 0.20
    return out


def write_snapshot(
    path: str | Path,
    size: str,
    precision_name: str,
    device: torch.device,
    batch_size: int,
    seq_len: int,
) -> Path:
    """Record a CUDA memory snapshot of three training steps to ``path`` (for memory_viz).

    Raises:
        ValueError: ``device`` is not a CUDA device (a CPU has no allocator history to record).
        RuntimeError: CUDA is not available (see
            :func:`~trainopt.perf.memory.record_memory_history`).

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.experiments import write_snapshot
        >>> try:
        ...     write_snapshot("snapshot.pickle", "tiny", "fp32", torch.device("cpu"), batch_size=2,
        ...                    seq_len=16)
        ... except ValueError as error:
        ...     print(error)
        write_snapshot records CUDA allocations: device must be a CUDA device, got 'cpu'

        .. skip: start if(not torch.cuda.is_available(), reason="needs CUDA")

        >>> import pickle
        >>> import tempfile
        >>> from pathlib import Path
        >>> path = Path(tempfile.mkdtemp()) / "snapshot.pickle"
        >>> out = write_snapshot(
        ...     path, "tiny", "fp32", torch.device("cuda"), batch_size=2, seq_len=16
        ... )
        >>> traces = pickle.loads(out.read_bytes())["device_traces"][0]
        >>> sum(e["action"] == "alloc" for e in traces) > 0  # three steps' allocations
        True

        .. skip: end
    """
    if torch.device(device).type != "cuda":
        raise ValueError(
            "write_snapshot records CUDA allocations: device must be a CUDA device, "
            f"got {str(device)!r}"
        )
    precision = Precision.from_name(precision_name, device)
    model, optimizer = _setup(size, device)
    x, y = synthetic_batch(model.config, batch_size, seq_len, device=device)
    with precision.matmul_settings(), record_memory_history(path, device=device) as out:
        for _ in range(3):
            train_step(model, optimizer, precision, x, y)
    del model, optimizer
    _free(device)
    return out
