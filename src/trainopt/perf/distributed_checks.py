"""Checks that distributed training computes what one process computes.

Each ``*_check`` function runs on every rank of a process group (start it with
``launch(fn, 2)``, :func:`~trainopt.perf.distributed.launch`, or under ``torchrun``), trains the
tiny reference GPT on its share of a batch, trains the same model in one process on the whole
batch as a reference, and returns numbers to compare: the largest parameter difference,
all-reduce counts, gradient errors. The functions live here, in an importable module, because
spawned processes import what they run.

Run as a script, it measures the gradient error of the lossy DDP hooks and writes JSON, or runs
every equivalence check (``--equivalence``, also under ``torchrun``)::

    python -m trainopt.perf.distributed_checks --out docs/_data/distributed_compression.json
    torchrun --standalone --nproc-per-node 2 -m trainopt.perf.distributed_checks --equivalence
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from trainopt.models import GPT, gpt_config, synthetic_batch
from trainopt.perf.distributed import (
    CommCounter,
    default_backend,
    fsdp2_available,
    full_tensors,
    gradient_sync,
    launch,
    rank_device,
    register_comm_hook,
    shard_model,
    single_process_group,
    wrap_ddp,
)
from trainopt.perf.distributed_consistency import (
    GradientScaleError,
    any_rank,
    broadcast_from_rank0,
    check_gradient_scale,
    gradient_scale,
    is_main_process,
    step_unless_any_rank_nonfinite,
)

MEASURED_HOOKS: tuple[str, ...] = ("allreduce", "fp16", "bf16", "powersgd:1", "powersgd:4")


def _batches(steps: int, global_batch: int, seq_len: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    config = gpt_config("tiny")
    return [synthetic_batch(config, global_batch, seq_len, generator=torch.Generator().manual_seed(seed + s))
            for s in range(steps)]


def _local(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    return tuple(t.chunk(world)[rank].to(device) for t in batch)  # type: ignore[return-value]


def _model(device: torch.device, seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(gpt_config("tiny")).to(device)


def _optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    # SGD keeps the check linear in the gradients. Adam divides by sqrt(v), which turns fp32
    # roundoff in near-zero gradient entries into parameter differences of up to ~lr.
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def _reference(batches: Sequence[tuple[torch.Tensor, torch.Tensor]], device: torch.device, seed: int,
               lr: float) -> GPT:
    """The single-process run: the same model trained on each whole batch."""
    model = _model(device, seed)
    optimizer = _optimizer(model, lr)
    for x, y in batches:
        model(x.to(device), targets=y.to(device)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


def _max_param_diff(model: nn.Module, reference: nn.Module) -> float:
    params = full_tensors(p.detach() for p in model.parameters())
    return max((p - r.detach()).abs().max().item() for p, r in zip(params, reference.parameters()))


def _max_param_change(model: nn.Module, seed: int) -> float:
    """How far training moved the weights: a difference below this means something."""
    start = _model(torch.device("cpu"), seed)
    return max((r.detach().cpu() - p).abs().max().item() for r, p in zip(model.parameters(), start.parameters()))


def _train(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
           lr: float, accumulation_steps: int = 1, sync_every_micro_batch: bool = False) -> None:
    optimizer = _optimizer(model, lr)
    for batch in batches:
        x, y = _local(batch, device)
        for i, (xm, ym) in enumerate(zip(x.chunk(accumulation_steps), y.chunk(accumulation_steps))):
            last = i == accumulation_steps - 1
            with gradient_sync(model, enabled=last or sync_every_micro_batch):
                (model(xm, targets=ym) / accumulation_steps).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def ddp_check(steps: int = 3, bucket_cap_mb: float = 25.0, seed: int = 0, lr: float = 0.1,
              gradient_as_bucket_view: bool = True, static_graph: bool = False) -> dict[str, Any]:
    """DDP on each rank's share versus one process on the whole batch: ``max_param_diff``.

    Also returns ``max_param_change`` (how far training moved the weights) and
    ``allreduce_calls`` (the bucket all-reduces of the run: one per bucket per step).

    Example:
        >>> with single_process_group():
        ...     result = ddp_check(steps=2)
        >>> result["max_param_diff"] <= 1e-5, result["allreduce_calls"]
        (True, 2)
    """
    device = rank_device()
    batches = _batches(steps, 8, 16, seed)
    model = wrap_ddp(_model(device, seed), bucket_cap_mb=bucket_cap_mb,
                     gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph)
    counter = CommCounter()
    register_comm_hook(model, "allreduce", counter=counter)
    _train(model, batches, device, lr)
    reference = _reference(batches, device, seed, lr)
    return {"max_param_diff": _max_param_diff(model.module, reference),
            "max_param_change": _max_param_change(reference, seed), "allreduce_calls": counter.calls}


def fsdp_check(steps: int = 3, seed: int = 0, lr: float = 0.1) -> dict[str, Any]:
    """FSDP2 (blocks, then root) versus one fp32 process on the whole batch.

    Returns ``max_param_diff`` (fp32 throughout) and ``max_param_diff_bf16``: with
    ``param_dtype=torch.bfloat16`` forward, backward and the reduce-scatter run in bf16 while the
    sharded weights and the optimizer stay fp32, so the difference is rounding, not zero.

    Example:
        >>> with single_process_group():
        ...     result = fsdp_check(steps=1)
        >>> result["max_param_diff"] <= 1e-5 < result["max_param_diff_bf16"]
        True
    """
    device = rank_device()
    batches = _batches(steps, 8, 16, seed)
    reference = _reference(batches, device, seed, lr)
    result = {}
    for key, param_dtype in (("max_param_diff", None), ("max_param_diff_bf16", torch.bfloat16)):
        model = _model(device, seed)
        shard_model(model, model.blocks, param_dtype=param_dtype)
        _train(model, batches, device, lr)
        result[key] = _max_param_diff(model, reference)
    return result


def accumulation_check(accumulation_steps: int = 4, steps: int = 2, seed: int = 0,
                       lr: float = 0.1, sharded: bool = False) -> dict[str, Any]:
    """Accumulation over micro-batches versus the full batch, with and without ``no_sync``.

    Returns ``max_param_diff`` (accumulating with communication only on the last micro-batch,
    against one process on the whole batch); for DDP also ``allreduce_calls_no_sync`` and
    ``allreduce_calls_every_micro_batch``, the all-reduce counts of the two ways.

    Example:
        >>> with single_process_group():
        ...     result = accumulation_check(accumulation_steps=2, steps=1)
        >>> result["allreduce_calls_no_sync"], result["allreduce_calls_every_micro_batch"]
        (1, 2)
    """
    device = rank_device()
    batches = _batches(steps, 8, 16, seed)
    reference = _reference(batches, device, seed, lr)
    if sharded:
        model = _model(device, seed)
        shard_model(model, model.blocks)
        _train(model, batches, device, lr, accumulation_steps)
        return {"max_param_diff": _max_param_diff(model, reference)}
    result: dict[str, Any] = {}
    for every_micro_batch in (False, True):
        model, counter = wrap_ddp(_model(device, seed)), CommCounter()
        register_comm_hook(model, "allreduce", counter=counter)
        _train(model, batches, device, lr, accumulation_steps, sync_every_micro_batch=every_micro_batch)
        key = "every_micro_batch" if every_micro_batch else "no_sync"
        result[f"allreduce_calls_{key}"] = counter.calls
        result[f"max_param_diff_{key}"] = _max_param_diff(model.module, reference)
    result["max_param_diff"] = result.pop("max_param_diff_no_sync")
    return result


def summed_loss_check(seed: int = 0) -> dict[str, Any]:
    """One backward of a loss summed over the local batch, judged by ``check_gradient_scale``.

    Returns ``scale`` (DDP gradient over the single-process gradient of the mean loss),
    ``error`` (the message raised) and ``local_tokens`` (targets per rank).

    Example:
        >>> with single_process_group():
        ...     result = summed_loss_check()
        >>> round(result["scale"]), result["local_tokens"]  # one rank: the whole batch of 8 x 16
        (128, 128)
    """
    device = rank_device()
    (batch,) = _batches(1, 8, 16, seed)
    model = wrap_ddp(_model(device, seed))
    x, y = _local(batch, device)
    F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").backward()
    reference = _model(device, seed)
    reference(batch[0].to(device), targets=batch[1].to(device)).backward()
    grads = [p.grad for p in model.module.parameters()]
    reference_grads = [p.grad for p in reference.parameters()]
    scale, _ = gradient_scale(grads, reference_grads)
    try:
        check_gradient_scale(grads, reference_grads, world_size=dist.get_world_size(),
                             local_batch_size=y.numel())
        error = ""
    except GradientScaleError as exc:
        error = str(exc)
    return {"scale": scale, "error": error, "local_tokens": y.numel()}


def compression_check(hooks: Sequence[str] = MEASURED_HOOKS, iterations: int = 8, seed: int = 0,
                      start_powersgd_iter: int = 2) -> dict[str, Any]:
    """Relative gradient error ``‖g_hook − g_exact‖ / ‖g_exact‖`` of DDP hooks, per iteration.

    Weights stay fixed; each iteration is a new batch. The exact gradient is the single-process
    gradient of the whole batch. ``"powersgd:R"`` is PowerSGD of rank ``R``, measured once it
    has started (it all-reduces exactly before). ``cumulative`` is the relative error of the
    sum over the measured iterations: error feedback carries what one step drops into the next,
    so the sum is far more accurate than any single step.

    Returns:
        ``{hook: {"errors": [...], "mean": e, "max": e, "cumulative": e}}``, or
        ``{hook: {"unsupported": reason}}`` where the backend refuses the hook.

    Example:
        >>> with single_process_group("gloo"):
        ...     result = compression_check(["fp16", "bf16"], iterations=2)
        >>> result["fp16"]["mean"] < 1e-2, "unsupported" in result["bf16"]
        (True, True)
    """
    if any(h.startswith("powersgd") for h in hooks) and iterations <= start_powersgd_iter:
        raise ValueError(f"iterations must exceed start_powersgd_iter to measure PowerSGD, got "
                         f"{iterations=}, {start_powersgd_iter=}")
    device = rank_device()
    batches = _batches(iterations, 8, 16, seed)
    reference = _model(device, seed)
    exact = []
    for x, y in batches:
        reference.zero_grad(set_to_none=True)
        reference(x.to(device), targets=y.to(device)).backward()
        exact.append(torch.cat([p.grad.reshape(-1) for p in reference.parameters()]))
    result: dict[str, Any] = {}
    for spec in hooks:
        name, _, rank = spec.partition(":")
        model = wrap_ddp(_model(device, seed))
        try:
            state = register_comm_hook(model, name, powersgd_rank=int(rank or 1),
                                       start_powersgd_iter=start_powersgd_iter)
        except ValueError as exc:
            result[spec] = {"unsupported": str(exc)}
            continue
        errors, got_sum, exact_sum = [], torch.zeros_like(exact[0]), torch.zeros_like(exact[0])
        for i, batch in enumerate(batches):
            model.zero_grad(set_to_none=True)
            x, y = _local(batch, device)
            model(x, targets=y).backward()
            if name == "powersgd" and i < start_powersgd_iter:
                continue
            got = torch.cat([p.grad.reshape(-1) for p in model.module.parameters()])
            errors.append(((got - exact[i]).norm() / exact[i].norm()).item())
            got_sum += got
            exact_sum += exact[i]
        if state is not None:  # PowerSGD's own count of elements before and after compression
            _, before, after = state.compression_stats()
            sent = after / before
        else:
            sent = 0.5 if name in ("fp16", "bf16") else 1.0  # bytes: 2 per element instead of 4
        result[spec] = {"errors": errors, "mean": sum(errors) / len(errors), "max": max(errors),
                        "cumulative": ((got_sum - exact_sum).norm() / exact_sum.norm()).item(),
                        "sent_fraction": sent}
    return result


def rank_consistent_skip_check(steps: int = 3, bad_rank: int = 1, bad_step: int = 1,
                               seed: int = 0) -> dict[str, Any]:
    """Rank ``bad_rank`` sees a NaN loss at ``bad_step``; each rank decides whether to skip it.

    Runs three times: ``"agreed"``, where the decision is
    :func:`~trainopt.perf.distributed_consistency.any_rank` of the local flags; ``"local"``, where each
    rank trusts its own loss; ``"helper"``, where
    :func:`~trainopt.perf.distributed_consistency.step_unless_any_rank_nonfinite` decides and steps. Each run returns the local flags, the
    decisions, and the parameters as one flat tensor (to compare ranks).

    Example:
        >>> with single_process_group():
        ...     result = rank_consistent_skip_check(bad_rank=0)
        >>> result["agreed"]["decisions"], result["helper"]["decisions"]
        ([False, True, False], [False, True, False])
    """
    device = rank_device()
    batches = _batches(steps, 8, 16, seed)
    result = {}
    for mode in ("agreed", "local", "helper"):
        model = wrap_ddp(_model(device, seed))
        optimizer = _optimizer(model, lr=0.1)
        local_flags, decisions = [], []
        for step, batch in enumerate(batches):
            x, y = _local(batch, device)
            loss = model(x, targets=y)
            if dist.get_rank() == bad_rank and step == bad_step:
                loss = loss * float("nan")
            loss.backward()  # every rank runs backward, so the collectives stay matched
            local = ~torch.isfinite(loss)
            local_flags.append(bool(local.item()))
            if mode == "helper":
                decisions.append(not step_unless_any_rank_nonfinite(optimizer, loss, model.parameters()))
            else:
                skip = any_rank(local) if mode == "agreed" else local
                decisions.append(bool(skip.item()))
                if not decisions[-1]:
                    optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        params = torch.cat([p.detach().reshape(-1) for p in model.module.parameters()]).cpu()
        result[mode] = {"local_flags": local_flags, "decisions": decisions, "params": params}
    return result


def raise_on_rank(bad_rank: int = 1) -> int:
    """Raise ``ValueError`` on ``bad_rank`` while the other ranks wait in a barrier.

    Example:
        >>> with single_process_group():
        ...     raise_on_rank(bad_rank=1)  # rank 0 of 1 waits in the barrier, alone
        0
    """
    if dist.get_rank() == bad_rank:
        raise ValueError(f"rank {bad_rank} raises on purpose")
    dist.barrier()
    return dist.get_rank()


def all_checks(sharded: bool | None = None) -> dict[str, Any]:
    """Every check above in one process group (start-up of a process costs seconds).

    Example:
        >>> with single_process_group():
        ...     results = all_checks(sharded=False)
        >>> sorted(results)[:3], results["ddp"]["max_param_diff"] <= 1e-5
        (['accumulation', 'broadcast', 'compression'], True)
    """
    sharded = fsdp2_available() if sharded is None else sharded
    results: dict[str, Any] = {
        "ddp": ddp_check(),
        "ddp_small_buckets": ddp_check(bucket_cap_mb=0.01),
        "ddp_static_graph_no_view": ddp_check(gradient_as_bucket_view=False, static_graph=True),
        "accumulation": accumulation_check(),
        "summed_loss": summed_loss_check(),
        "compression": compression_check(),
        "skip": rank_consistent_skip_check(),
        "broadcast": broadcast_from_rank0(f"checkpoint chosen by rank {dist.get_rank()}"),
        "is_main_process": is_main_process(),
    }
    if sharded:
        results["fsdp"] = fsdp_check()
        results["fsdp_accumulation"] = accumulation_check(sharded=True)
    return results


def measure_compression(nprocs: int = 2, iterations: int = 8, backend: str | None = None) -> dict[str, Any]:
    """Run :func:`compression_check` on ``nprocs`` processes; return a JSON-ready record.

    Example:
        >>> record = measure_compression(nprocs=1, iterations=3)
        >>> record["world_size"], sorted(record["hooks"]) == sorted(MEASURED_HOOKS)
        (1, True)
    """
    per_rank = launch(compression_check, nprocs, MEASURED_HOOKS, iterations, backend=backend)
    model = GPT(gpt_config("tiny"))
    return {
        "what": "relative gradient error of lossy DDP communication hooks versus exact all-reduce",
        "model": f"GPT tiny ({model.num_parameters()} parameters), batch 8 x 16 tokens",
        "world_size": nprocs,
        "backend": backend or default_backend(nprocs),
        "iterations": iterations,
        "powersgd": {"start_powerSGD_iter": 2, "use_error_feedback": True, "warm_start": True},
        "hooks": per_rank[0],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
    }


def compression_table(path: str | Path) -> str:
    """A Markdown table of a :func:`measure_compression` JSON file.

    Example:
        >>> path = Path(__file__).parents[3] / "docs/_data/distributed_compression.json"
        >>> compression_table(path).splitlines()[0]
        '| hook | data sent | error per step (mean) | error per step (max) | error of the sum |'
    """
    data = json.loads(Path(path).read_text())
    lines = ["| hook | data sent | error per step (mean) | error per step (max) | error of the sum |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for spec, record in data["hooks"].items():
        name = spec.replace("powersgd:", "PowerSGD, rank ")
        if "unsupported" in record:
            lines.append(f"| {name} | — | not supported by {data['backend']} | — | — |")
            continue
        lines.append(f"| {name} | {record['sent_fraction']:.1%} | {record['mean']:.1e} | "
                     f"{record['max']:.1e} | {record['cumulative']:.1e} |")
    lines += ["", f"Measured with torch {data['torch']}, {data['backend']}, {data['world_size']} processes, "
              f"{data['model']}, on {data['date']}."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``--out FILE`` measures the lossy hooks, ``--equivalence`` runs the checks.

    Example:
        >>> main([])  # neither --out nor --equivalence
        Traceback (most recent call last):
        ...
        SystemExit: 2
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="measure the lossy hooks and write this JSON file")
    parser.add_argument("--equivalence", action="store_true",
                        help="run every equivalence check and print the results (works under torchrun)")
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=8)
    args = parser.parse_args(argv)
    if args.out is None and not args.equivalence:
        parser.error("give --out FILE, --equivalence, or both")
    if args.equivalence:
        if "RANK" in os.environ:  # started by torchrun: this process is one rank
            dist.init_process_group()
            results = all_checks()
            dist.destroy_process_group()
        else:
            results = launch(all_checks, args.nprocs)[0]
        if int(os.environ.get("RANK", "0")) == 0:
            for name, record in results.items():
                if "max_param_diff" in record:
                    print(f"{name}: max parameter difference {record['max_param_diff']:.1e}")
    if args.out is not None:
        record = measure_compression(args.nprocs, args.iterations)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
