"""Record real training runs with injected faults, for the troubleshooting page and its tests.

Each run trains :func:`trainopt.models.digits_mlp` on scikit-learn's digits and logs one JSON
record per step in the schema :func:`trainopt.diagnostics.symptoms.diagnose` reads. One fault is
injected per run; ``healthy`` injects none. The faults:

- ``healthy``: Adam, lr 2e-3: the reference run
- ``diverging``: Adam whose learning rate ramps up to 100 times the healthy one
- ``slow_convergence``: plain SGD with a learning rate far too small (0.01)
- ``plateau``: plain SGD with a learning rate of 1e-6: the loss never moves
- ``oscillating``: Adam with a learning rate 10 times the healthy one
- ``loss_explosion``: the healthy run, with the learning rate 300 times too high for 3 steps
- ``gradient_explosion``: clipped training where a few batches carry unnormalised features
- ``nan_inf``: one batch with a NaN feature (corrupt data) and no guard
- ``out_of_memory``: every step keeps its evaluation outputs with their autograd graph
- ``slow_training``: from mid-run, batches jittered pixel by pixel in a Python loop
- ``comm_overhead``: gradients all-reduced one small message at a time (a 1-process gloo group)

Write them all with ``python -m trainopt_site.diagnostics.runs --out src/trainopt/data/runs``
(from a clone of the repository, in its development environment).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainopt.config.cli import ArgumentParser, device, output_folder, positive_int, run_command
from trainopt.models import digits_data, digits_mlp
from trainopt.validation import check_int

FAULTS = (
    "healthy",
    "diverging",
    "slow_convergence",
    "plateau",
    "oscillating",
    "loss_explosion",
    "gradient_explosion",
    "nan_inf",
    "out_of_memory",
    "slow_training",
    "comm_overhead",
)


FAULT_DESCRIPTIONS: dict[str, str] = {
    "healthy": "none (Adam, lr 2e-3)",
    "diverging": "Adam, lr ramps to 100x",
    "slow_convergence": "plain SGD, lr 0.01",
    "plateau": "plain SGD, lr 1e-6",
    "oscillating": "Adam, lr 10x",
    "loss_explosion": "lr 300x at steps 150-152",
    "gradient_explosion": "every 40th batch x30",
    "nan_inf": "a NaN feature at step 200",
    "out_of_memory": "graphs kept each step",
    "slow_training": "slow data from step 150",
    "comm_overhead": "~1,000 all-reduces a step",
}
"""What each fault does, in a few words (the page's table); the module docstring says more."""


def _optimizer(fault: str, params: Any) -> tuple[torch.optim.Optimizer, float]:
    if fault == "slow_convergence":
        return torch.optim.SGD(params, lr=0.01), 0.01
    if fault == "plateau":
        return torch.optim.SGD(params, lr=1e-6), 1e-6
    if fault == "oscillating":
        return torch.optim.Adam(params, lr=0.02), 0.02
    return torch.optim.Adam(params, lr=2e-3), 2e-3


def _lr_at(fault: str, step: int, steps: int, base_lr: float) -> float:
    if fault == "diverging":  # a warm-up whose peak is 100x too high
        return base_lr * (1 + 99 * step / steps)
    if fault == "loss_explosion" and steps // 2 <= step < steps // 2 + 3:
        return base_lr * 300
    return base_lr


def _process_memory() -> int | None:
    """Resident set size of this process in bytes (Linux), or None."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _jitter_in_python(batch: torch.Tensor) -> torch.Tensor:
    """Add pixel noise one Python float at a time: the slow data pipeline of ``slow_training``."""
    rng = random.Random(0)
    rows = [[value + rng.gauss(0.0, 0.01) for value in row] for row in batch.tolist()]
    return torch.tensor(rows, dtype=batch.dtype, device=batch.device)


def _all_reduce_mean(grads: list[torch.Tensor], bucketed: bool) -> None:
    """Average gradients across the process group: one flat bucket, or ~1,000 small messages."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    if bucketed:
        dist.all_reduce(flat)
    else:
        for chunk in flat.split(max(1, flat.numel() // 1000)):
            dist.all_reduce(chunk)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def record_run(
    fault: str = "healthy",
    steps: int = 300,
    batch_size: int = 64,
    seed: int = 0,
    device: str = "cpu",
    memory_budget_mb: float = 256.0,
) -> list[dict[str, Any]]:
    """Train the digits MLP for ``steps`` steps with one injected ``fault``; return the step
    records.

    Each record holds ``step``, ``loss``, ``grad_norm`` (before clipping), ``lr``, ``step_time``
    (seconds, data loading included: wall-clock on CUDA, process CPU time on a CPU, on one
    thread), ``tokens_per_s`` (samples per second here), ``comm_time`` (seconds spent
    all-reducing gradients), and memory: on CUDA the allocator's
    ``memory_allocated`` / ``memory_reserved`` and the device's total as ``max_memory``; on a
    CPU the process's resident memory as both, and ``max_memory`` = resident memory at the
    start + ``memory_budget_mb`` (a budget, like a container's limit).

    Example:
        >>> from trainopt_site.diagnostics.runs import record_run
        >>> records = record_run("healthy", steps=5)
        >>> len(records), sorted(records[0])[:4]
        (5, ['comm_time', 'grad_norm', 'loss', 'lr'])
    """
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}, got {fault=}")
    check_int("steps", steps, 1)
    owns_group = not dist.is_initialized()
    if owns_group:
        backend = (
            "nccl" if torch.device(device).type == "cuda" and dist.is_nccl_available() else "gloo"
        )
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core: step times comparable from run to run
    try:
        return _train(fault, steps, batch_size, seed, device, memory_budget_mb)
    finally:
        torch.set_num_threads(threads)
        if owns_group:
            dist.destroy_process_group()


def _train(
    fault: str, steps: int, batch_size: int, seed: int, device: str, memory_budget_mb: float
) -> list[dict]:
    cuda = torch.device(device).type == "cuda"
    # On a CPU, time in process CPU seconds: the recorded files then don't depend on what else
    # the machine runs. On CUDA, wall-clock time (after a synchronize) is the right measure.
    clock = time.perf_counter if cuda else time.process_time
    x_train, y_train, _, _ = digits_data(seed=seed)
    x_train, y_train = x_train.to(device), y_train.to(device)
    model = digits_mlp(seed=seed).to(device)
    params = list(model.parameters())
    opt, base_lr = _optimizer(fault, params)
    max_norm = 1.0 if fault == "gradient_explosion" else math.inf
    gen = torch.Generator().manual_seed(seed)
    kept: list[torch.Tensor] = []  # the out_of_memory fault's leak
    baseline = _process_memory() or 0
    capacity = (
        torch.cuda.get_device_properties(device).total_memory
        if cuda
        else baseline + int(memory_budget_mb * 2**20)
    )
    records: list[dict[str, Any]] = []
    for step in range(steps):
        start = clock()
        idx = torch.randint(0, len(x_train), (batch_size,), generator=gen).to(device)
        xb, yb = x_train[idx], y_train[idx]
        if fault == "slow_training" and step >= steps // 2:
            xb = _jitter_in_python(xb)  # the data pipeline turns into a Python loop
        if fault == "gradient_explosion" and step % 40 == 39:
            xb = xb * 30.0  # a shard that skipped normalisation
        if fault == "nan_inf" and step == (2 * steps) // 3:
            xb = xb.clone()
            xb[0, 0] = float("nan")
        lr = _lr_at(fault, step, steps, base_lr)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        comm_start = clock()
        _all_reduce_mean([p.grad for p in params], bucketed=fault != "comm_overhead")
        comm_time = clock() - comm_start
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        opt.step()
        if fault == "out_of_memory":
            kept.append(model(x_train[: 6 * batch_size]))  # outputs kept with their graph
        if cuda:
            torch.cuda.synchronize(device)
        step_time = clock() - start
        memory = (
            (torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))
            if cuda
            else ((_process_memory(),) * 2)
        )
        records.append(
            {
                "step": step,
                "loss": loss.detach(),
                "grad_norm": grad_norm.detach(),
                "lr": lr,
                "step_time": step_time,
                "tokens_per_s": batch_size / step_time,
                "comm_time": comm_time,
                "memory_allocated": memory[0],
                "memory_reserved": memory[1],
                "max_memory": capacity,
            }
        )
    for record in records:  # read the losses on the host once, at the end
        record["loss"] = float(record["loss"])
        record["grad_norm"] = float(record["grad_norm"])
    return records


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Write records as JSON Lines, floats to 7 significant digits (non-finite as ``NaN`` /
    ``Infinity``).

    Example:
        >>> from trainopt_site.diagnostics.runs import write_jsonl
        >>> import tempfile, os
        >>> path = write_jsonl([{"step": 0, "loss": 2.302585093}], os.path.join(tempfile.mkdtemp(),
        ...                                                                     "r.jsonl"))
        >>> path.read_text()
        '{"loss": 2.302585, "step": 0}\\n'
    """
    records = [
        {k: float(f"{v:.7g}") if isinstance(v, float) else v for k, v in r.items()} for r in records
    ]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return path


def main(argv: list[str] | None = None) -> None:
    """Command line: record the runs of ``--faults`` (all by default) as ``<out>/<fault>.jsonl``.

    Example:
        >>> from trainopt_site.diagnostics.runs import main
        >>> import tempfile
        >>> main(["--out", tempfile.mkdtemp(), "--steps", "3",
        ...       "--faults", "plateau"])  # doctest: +ELLIPSIS
        wrote .../plateau.jsonl
    """
    parser = ArgumentParser(
        prog="python -m trainopt_site.diagnostics.runs", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--out", type=output_folder, required=True, help="folder for the <fault>.jsonl files"
    )
    parser.add_argument(
        "--steps", type=positive_int, default=300, help="training steps of each run (default 300)"
    )
    parser.add_argument(
        "--device", type=device, default="cpu", help="cpu, cuda or cuda:N (default cpu)"
    )
    parser.add_argument(
        "--faults",
        nargs="*",
        default=list(FAULTS),
        choices=FAULTS,
        metavar="FAULT",
        help=f"the runs to record (default: all): {', '.join(FAULTS)}",
    )
    args = parser.parse_args(argv)
    for fault in args.faults:
        path = write_jsonl(
            record_run(fault, steps=args.steps, device=args.device),
            Path(args.out) / f"{fault}.jsonl",
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(run_command(main))
