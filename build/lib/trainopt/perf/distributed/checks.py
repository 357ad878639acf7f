"""Checks that distributed training computes what one process computes.

Each ``*_check`` function runs on every rank of a process group (start it with
``launch(fn, 2)``, :func:`~trainopt.perf.distributed.processes.launch`, or under ``torchrun``),
trains the tiny reference GPT on its share of a batch, trains the same model in one process on
the whole batch as a reference, and returns numbers to compare: the largest parameter difference,
all-reduce counts, gradient errors. The functions live here, in an importable module, because
spawned processes import what they run.

The Distributed Training page's command (``trainopt_site.perf.distributed``, run from a checkout
of the repository) runs every check in one group, also under ``torchrun``:

.. code-block:: console

    $ torchrun --standalone --nproc-per-node 2 -m trainopt_site.perf.distributed --equivalence
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from trainopt.models import GPT, gpt_config, synthetic_batch
from trainopt.perf.distributed.agreement import (
    GradientScaleError,
    any_rank,
    check_gradient_scale,
    gradient_scale,
    step_unless_any_rank_nonfinite,
)
from trainopt.perf.distributed.checkpoint import load_sharded, save_sharded
from trainopt.perf.distributed.ddp import (
    CommCounter,
    gradient_sync,
    register_comm_hook,
    wrap_ddp,
)
from trainopt.perf.distributed.fsdp import full_tensors, shard_model
from trainopt.perf.distributed.loss import IGNORE_INDEX, global_token_count, token_normalized_loss
from trainopt.perf.distributed.processes import rank_device

# Real tokens per sequence of the masked batch: micro-batches and ranks count different numbers.
LENGTHS: tuple[int, ...] = (16, 16, 12, 16, 2, 5, 1, 9)


def _batches(
    steps: int, global_batch: int, seq_len: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    config = gpt_config("tiny")
    return [
        synthetic_batch(
            config, global_batch, seq_len, generator=torch.Generator().manual_seed(seed + s)
        )
        for s in range(steps)
    ]


def _local(
    batch: tuple[torch.Tensor, torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    return tuple(t.chunk(world)[rank].to(device) for t in batch)  # type: ignore[return-value]


def _model(device: torch.device, seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(gpt_config("tiny")).to(device)


def _optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    # SGD keeps the check linear in the gradients. Adam divides by sqrt(v), which turns fp32
    # roundoff in near-zero gradient entries into parameter differences of up to ~lr.
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def _reference(
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]], device: torch.device, seed: int, lr: float
) -> GPT:
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
    return max(
        (r.detach().cpu() - p).abs().max().item()
        for r, p in zip(model.parameters(), start.parameters())
    )


def _train(
    model: nn.Module,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    lr: float,
    accumulation_steps: int = 1,
    sync_every_micro_batch: bool = False,
) -> None:
    optimizer = _optimizer(model, lr)
    for batch in batches:
        x, y = _local(batch, device)
        for i, (xm, ym) in enumerate(zip(x.chunk(accumulation_steps), y.chunk(accumulation_steps))):
            last = i == accumulation_steps - 1
            with gradient_sync(model, enabled=last or sync_every_micro_batch):
                (model(xm, targets=ym) / accumulation_steps).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def ddp_check(
    steps: int = 3,
    bucket_cap_mb: float = 25.0,
    seed: int = 0,
    lr: float = 0.1,
    gradient_as_bucket_view: bool = True,
    static_graph: bool = False,
) -> dict[str, Any]:
    """DDP on each rank's share versus one process on the whole batch: ``max_param_diff``.

    Also returns ``max_param_change`` (how far training moved the weights) and
    ``allreduce_calls`` (the bucket all-reduces of the run: one per bucket per step).

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt.perf.distributed.checks import ddp_check
        >>> with single_process_group():
        ...     result = ddp_check(steps=2)
        >>> result["max_param_diff"] <= 1e-5, result["allreduce_calls"]
        (True, 2)
    """
    device = rank_device()
    batches = _batches(steps, 8, 16, seed)
    model = wrap_ddp(
        _model(device, seed),
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        static_graph=static_graph,
    )
    counter = CommCounter()
    register_comm_hook(model, "allreduce", counter=counter)
    _train(model, batches, device, lr)
    reference = _reference(batches, device, seed, lr)
    return {
        "max_param_diff": _max_param_diff(model.module, reference),
        "max_param_change": _max_param_change(reference, seed),
        "allreduce_calls": counter.calls,
    }


def fsdp_check(steps: int = 3, seed: int = 0, lr: float = 0.1) -> dict[str, Any]:
    """FSDP2 (blocks, then root) versus one fp32 process on the whole batch.

    Returns ``max_param_diff`` (fp32 throughout), ``max_param_diff_bf16``
    (``param_dtype=torch.bfloat16``: forward, backward and, since ``reduce_dtype`` is ``None``,
    the gradient reduce-scatter run in bf16) and ``max_param_diff_bf16_fp32_reduce``
    (``reduce_dtype=torch.float32``: bf16 compute, fp32 reduce-scatter) and
    ``max_param_diff_hsdp`` (fp32 on a 2-D ``("replicate", "shard")`` mesh of shape
    ``(world_size, 1)``). The sharded weights and the optimizer stay fp32 in every case, so
    the bf16 differences are rounding, not zero.

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt.perf.distributed.checks import fsdp_check
        >>> with single_process_group():
        ...     result = fsdp_check(steps=1)
        >>> result["max_param_diff"] <= 1e-5 < result["max_param_diff_bf16"]
        True
    """
    device = rank_device()
    batches = _batches(steps, 8, 16, seed)
    reference = _reference(batches, device, seed, lr)
    hsdp = init_device_mesh(
        device.type, (dist.get_world_size(), 1), mesh_dim_names=("replicate", "shard")
    )
    result = {}
    for key, param_dtype, reduce_dtype, mesh in (
        ("max_param_diff", None, None, None),
        ("max_param_diff_bf16", torch.bfloat16, None, None),
        ("max_param_diff_bf16_fp32_reduce", torch.bfloat16, torch.float32, None),
        ("max_param_diff_hsdp", None, None, hsdp),
    ):
        model = _model(device, seed)
        shard_model(
            model, model.blocks, param_dtype=param_dtype, reduce_dtype=reduce_dtype, mesh=mesh
        )
        _train(model, batches, device, lr)
        result[key] = _max_param_diff(model, reference)
    return result


def accumulation_check(
    accumulation_steps: int = 4,
    steps: int = 2,
    seed: int = 0,
    lr: float = 0.1,
    sharded: bool = False,
) -> dict[str, Any]:
    """Accumulation over micro-batches versus the full batch, with and without ``no_sync``.

    Returns ``max_param_diff`` (accumulating with communication only on the last micro-batch,
    against one process on the whole batch); for DDP also ``allreduce_calls_no_sync`` and
    ``allreduce_calls_every_micro_batch``, the all-reduce counts of the two ways.

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt.perf.distributed.checks import accumulation_check
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
        _train(
            model, batches, device, lr, accumulation_steps, sync_every_micro_batch=every_micro_batch
        )
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
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt.perf.distributed.checks import summed_loss_check
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
        check_gradient_scale(
            grads, reference_grads, world_size=dist.get_world_size(), local_batch_size=y.numel()
        )
        error = ""
    except GradientScaleError as exc:
        error = str(exc)
    return {"scale": scale, "error": error, "local_tokens": y.numel()}


def sharded_checkpoint_check(directory: str, steps: int = 2, seed: int = 0) -> dict[str, Any]:
    """Train FSDP2 with AdamW, save with DCP from every rank, and resume a fresh sharded copy.

    Returns ``max_param_diff`` (resumed against saved weights, gathered), ``resumed_step``
    (AdamW's step count after loading) and ``weights`` (the full weights by name, to compare
    with a load into another layout).

    Example:
        >>> import tempfile
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt.perf.distributed.checks import sharded_checkpoint_check
        >>> with single_process_group():
        ...     result = sharded_checkpoint_check(tempfile.mkdtemp())
        >>> result["max_param_diff"], result["resumed_step"]
        (0.0, 2.0)
    """
    device = rank_device()
    models = []
    for offset in (0, 1):  # the trained model, and a differently initialised one to resume
        model = _model(device, seed + offset)
        shard_model(model, model.blocks)
        models.append((model, torch.optim.AdamW(model.parameters(), lr=1e-3)))
    (model, optimizer), (resumed, resumed_optimizer) = models
    for batch in _batches(steps, 8, 16, seed):
        x, y = _local(batch, device)
        model(x, targets=y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    save_sharded(directory, model, optimizer)
    load_sharded(directory, resumed, resumed_optimizer)
    names = [name for name, _ in model.named_parameters()]
    saved = full_tensors(p.detach() for p in model.parameters())
    loaded = full_tensors(p.detach() for p in resumed.parameters())
    step = next(iter(resumed_optimizer.state.values()))["step"]
    return {
        "max_param_diff": max((a - b).abs().max().item() for a, b in zip(saved, loaded)),
        "resumed_step": float(full_tensors([step])[0]),
        "weights": {name: t.cpu() for name, t in zip(names, saved)},
    }


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def token_loss_check(
    accumulation_steps: int = 2, seed: int = 0, lengths: Sequence[int] = LENGTHS
) -> dict[str, Any]:
    """Padded sequences of different lengths: mean losses per rank or micro-batch against the
    token mean.

    Sequence ``i`` of the batch counts its first ``lengths[i]`` targets; the rest are
    ``IGNORE_INDEX`` (padding). The reference is one process's gradient of the mean over every
    counted target of the whole batch. Each entry is a relative gradient error
    ``‖g − g_ref‖ / ‖g_ref‖`` under DDP: ``naive_ranks`` (each rank's mean loss),
    ``helper_ranks`` (:func:`~trainopt.perf.distributed.loss.token_normalized_loss`), and the
    same with ``accumulation_steps`` micro-batches per rank (``naive_accumulation`` divides
    each micro-batch's mean by the number of micro-batches). ``tokens_per_rank`` is this
    rank's count.

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt.perf.distributed.checks import token_loss_check
        >>> with single_process_group():
        ...     result = token_loss_check()
        >>> result["naive_accumulation"] > 1e-2, result["helper_accumulation"] < 1e-5
        (True, True)
    """
    device = rank_device()
    (batch,) = _batches(1, len(lengths), 16, seed)
    x_all, y_all = batch
    padding = torch.arange(y_all.shape[1]) >= torch.tensor(lengths)[:, None]
    y_all = y_all.masked_fill(padding, IGNORE_INDEX)
    reference = _model(device, seed)
    reference(x_all.to(device), targets=y_all.to(device)).backward()
    exact = _flat_grad(reference)
    x, y = _local((x_all, y_all), device)
    result: dict[str, Any] = {"tokens_per_rank": int((y != IGNORE_INDEX).sum())}
    for name, steps in (("ranks", 1), ("accumulation", accumulation_steps)):
        for kind in ("naive", "helper"):
            model = wrap_ddp(_model(device, seed))
            micro_batches = list(zip(x.chunk(steps), y.chunk(steps)))
            tokens = global_token_count([ym for _, ym in micro_batches])
            for i, (xm, ym) in enumerate(micro_batches):
                with gradient_sync(model, enabled=i == steps - 1):
                    if kind == "naive":
                        loss = model(xm, targets=ym) / steps
                    else:
                        loss = token_normalized_loss(model(xm), ym, tokens)
                    loss.backward()
            error = (_flat_grad(model.module) - exact).norm() / exact.norm()
            result[f"{kind}_{name}"] = error.item()
    return result


def rank_consistent_skip_check(
    steps: int = 3, bad_rank: int = 1, bad_step: int = 1, seed: int = 0
) -> dict[str, Any]:
    """Rank ``bad_rank`` sees a NaN loss at ``bad_step``; each rank decides whether to skip it.

    Runs three times: ``"agreed"``, where the decision is
    :func:`~trainopt.perf.distributed.agreement.any_rank` of the local flags; ``"local"``, where
    each rank trusts its own loss; ``"helper"``, where
    :func:`~trainopt.perf.distributed.agreement.step_unless_any_rank_nonfinite` decides and
    steps. Each run returns the local flags, the decisions, and the parameters as one flat tensor
    (to compare ranks).

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt.perf.distributed.checks import rank_consistent_skip_check
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
                decisions.append(
                    not step_unless_any_rank_nonfinite(optimizer, loss, model.parameters())
                )
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
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt.perf.distributed.checks import raise_on_rank
        >>> with single_process_group():
        ...     raise_on_rank(bad_rank=1)  # rank 0 of 1 waits in the barrier, alone
        0
    """
    if dist.get_rank() == bad_rank:
        raise ValueError(f"rank {bad_rank} raises on purpose")
    dist.barrier()
    return dist.get_rank()
