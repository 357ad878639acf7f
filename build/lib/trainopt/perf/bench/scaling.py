"""Scaling efficiency: throughput of ``n`` data-parallel processes against ``n`` times one.

Weak scaling: every process trains on its own batch of ``B × T`` tokens, so ``n`` processes
consume ``n·B·T`` tokens per step, and

    efficiency = throughput(n) / (n · throughput(1)) = median(t_1) / median(t_n)

with ``t_k`` the step times with ``k`` processes. It falls below 1 by what the gradient
all-reduce and the wait for the slowest process cost.

:func:`run` starts ``n`` gloo processes on the CPU (processes as stand-ins for GPUs, one
thread each) once, and times windows of one process alone (a plain model, no communication;
the others wait at a barrier) interleaved with windows of all ``n`` under
``DistributedDataParallel``, so drift of the machine hits both alike. The interval of the
efficiency is the bootstrap interval of the ratio of medians
(:func:`~trainopt.perf.bench.compare.ratio_of_medians`).
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from trainopt.models import GPT, gpt_config, synthetic_batch
from trainopt.perf.bench.compare import ratio_of_medians
from trainopt.perf.bench.results import Results, new_results
from trainopt.perf.bench.timer import STABLE_WITHIN
from trainopt.perf.distributed import launch, wrap_ddp
from trainopt.validation import check_int

STAND_IN = "{n} gloo processes on a CPU, {threads} thread each, as stand-ins for GPUs"


def _windows(
    size: str,
    batch_size: int,
    seq_len: int,
    steps: int,
    windows: int,
    max_warmup_windows: int,
    threads: int,
) -> dict[str, Any]:
    """One rank's part of :func:`run`; rank 0 returns the times, the others ``{}``."""
    torch.set_num_threads(threads)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    solo = GPT(gpt_config(size))
    shared = wrap_ddp(copy.deepcopy(solo))
    optimizers = {
        1: torch.optim.AdamW(solo.parameters()),
        world: torch.optim.AdamW(shared.parameters()),
    }
    models = {1: solo, world: shared}
    generator = torch.Generator().manual_seed(rank)
    x, y = synthetic_batch(solo.config, batch_size, seq_len, generator=generator)

    def window(k: int) -> float | None:
        dist.barrier()
        seconds = None
        if rank < k:
            start = time.perf_counter()
            for _ in range(steps):
                models[k](x, targets=y).backward()
                optimizers[k].step()
                optimizers[k].zero_grad(set_to_none=True)
            seconds = (time.perf_counter() - start) / steps
        dist.barrier()
        return seconds

    warm: dict[int, list[float | None]] = {1: [], world: []}
    stable = torch.zeros(1)
    while not stable.item() and len(warm[1]) < max_warmup_windows:
        for k in warm:
            warm[k].append(window(k))
        if rank == 0 and len(warm[1]) >= 2:
            agree = [abs(t[-1] - t[-2]) <= STABLE_WITHIN * min(t[-2:]) for t in warm.values()]
            stable.fill_(float(all(agree)))
        dist.broadcast(stable, src=0)
    times: dict[int, list[float | None]] = {1: [], world: []}
    for w in range(windows):
        for k in (1, world) if w % 2 == 0 else (world, 1):
            times[k].append(window(k))
    if rank != 0:
        return {}
    return {
        "warmup": {
            "windows": len(warm[1]),
            "steps": 2 * len(warm[1]) * steps,
            "stable": bool(stable.item()),
            "window_s": {str(k): v for k, v in warm.items()},
        },
        "window_step_times_s": {str(k): v for k, v in times.items()},
    }


def run(
    processes: int = 2,
    size: str = "tiny",
    batch_size: int = 8,
    seq_len: int = 64,
    steps: int = 5,
    windows: int = 10,
    max_warmup_windows: int = 20,
    threads: int = 1,
    confidence: float = 0.95,
    command: str | None = None,
    note: str | None = None,
) -> Results:
    """Measure the scaling efficiency of ``processes`` gloo processes on the CPU; return results.

    Returns:
        A results file of kind ``"scaling"``: the raw ``window_step_times_s`` per process count,
        ``tokens_per_s`` per count (``k·B·T`` over the median step time) and ``efficiency``
        (:func:`~trainopt.perf.bench.compare.ratio_of_medians` of the one-process and the
        ``n``-process step times, with its interval).

    Example:
        >>> from trainopt.perf.bench.scaling import run
        >>> results = run(2, "tiny", batch_size=2, seq_len=16, steps=2, windows=3,
        ...               max_warmup_windows=2)
        >>> results["kind"], sorted(results["tokens_per_s"]), 0 < results["efficiency"]["ratio"] < 2
        ('scaling', ['1', '2'], True)
    """
    for name, value, least in (
        ("processes", processes, 2),
        ("batch_size", batch_size, 1),
        ("seq_len", seq_len, 1),
        ("steps", steps, 1),
        ("windows", windows, 2),
        ("max_warmup_windows", max_warmup_windows, 2),
        ("threads", threads, 1),
    ):
        check_int(name, value, least)
    begin = time.perf_counter()
    raw = launch(
        _windows,
        processes,
        size,
        batch_size,
        seq_len,
        steps,
        windows,
        max_warmup_windows,
        threads,
        backend="gloo",
    )[0]
    note = "; ".join(filter(None, [STAND_IN.format(n=processes, threads=threads), note]))
    results = new_results(
        "scaling",
        "cpu",
        command,
        note,
        size=size,
        batch_size=batch_size,
        seq_len=seq_len,
        steps_per_window=steps,
        windows=windows,
        threads=threads,
    )
    times = raw["window_step_times_s"]
    tokens = batch_size * seq_len
    results.update(
        processes=[1, processes],
        warmup=raw["warmup"],
        window_step_times_s=times,
        tokens_per_s={k: int(k) * tokens / statistics.median(v) for k, v in times.items()},
        efficiency=ratio_of_medians(times["1"], times[str(processes)], confidence=confidence),
    )
    results["meta"]["elapsed_s"] = time.perf_counter() - begin
    return results
