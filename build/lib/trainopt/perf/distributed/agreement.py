"""Decisions and checks that must hold on every rank of a data-parallel run.

- :func:`check_gradient_scale` compares distributed gradients with the single-process gradients
  of the whole batch and names the likely cause of a constant factor (a summed loss, say).
- :func:`any_rank` makes a skip or roll-back decision the same on every rank (a MAX
  all-reduce of a flag, on the device); :func:`step_unless_any_rank_nonfinite` uses it to step
  the optimizer on every rank or on none.
- ``broadcast_from_rank0`` gives every rank rank 0's choice (the checkpoint to load), and
  ``is_main_process`` says which rank writes: both are
  :func:`trainopt.stability.distributed.broadcast_from_rank0` and
  :func:`trainopt.stability.distributed.is_main_process`, the ones the stabilizer uses.

Outside a process group every function works on the one process, so the same code runs on one
GPU and on many.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from trainopt.stability.distributed import broadcast_from_rank0, is_main_process

__all__ = [
    "GradientScaleError",
    "any_rank",
    "broadcast_from_rank0",
    "check_gradient_scale",
    "gradient_scale",
    "is_main_process",
    "nonfinite_flag",
    "step_unless_any_rank_nonfinite",
]

# ---------------------------------------------------------------------------------------------
# Loss scale: summed versus averaged
# ---------------------------------------------------------------------------------------------


class GradientScaleError(AssertionError):
    """Distributed gradients differ from the single-process ones by a constant factor.

    Example:
        >>> from trainopt.perf.distributed import GradientScaleError
        >>> issubclass(GradientScaleError, AssertionError)  # a failed check, in tests too
        True
    """


def gradient_scale(
    grads: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]
) -> tuple[float, float]:
    """``(scale, cosine)``: the factor ``s`` minimising ``‖g − s·g_ref‖`` and the cosine of the
    angle.

    Example:
        >>> import torch
        >>> from trainopt.perf.distributed.agreement import gradient_scale
        >>> g = [torch.tensor([1.0, 2.0]), torch.tensor([3.0])]
        >>> gradient_scale([4 * t for t in g], g)
        (4.0, 1.0)
    """
    g = torch.cat([t.detach().reshape(-1).double() for t in grads])
    ref = torch.cat([t.detach().reshape(-1).double() for t in reference])
    dot, ref_sq = torch.dot(g, ref), torch.dot(ref, ref)
    cosine = dot / (g.norm() * ref.norm()).clamp_min(1e-300)
    return round((dot / ref_sq.clamp_min(1e-300)).item(), 6), round(cosine.item(), 6)


def check_gradient_scale(
    grads: Sequence[torch.Tensor],
    reference: Sequence[torch.Tensor],
    *,
    world_size: int = 1,
    local_batch_size: int | None = None,
    accumulation_steps: int = 1,
    rtol: float = 1e-3,
) -> float:
    """Check that distributed gradients equal the single-process gradients of the whole batch.

    The reference is the gradient of the *mean* loss over the combined batch, computed in one
    process. DDP and FSDP average gradients over ranks, so a mean loss per rank gives the
    reference exactly. A loss summed over the local batch gives ``local_batch_size`` times the
    reference; a loss summed over the global batch and then averaged by DDP gives
    ``1/world_size`` of the summed reference; micro-batch losses not divided by the number of
    accumulation steps give ``accumulation_steps`` times it.

    Returns:
        The scale (1.0 within ``rtol`` when all is well).

    Raises:
        GradientScaleError: the scale is off; the message gives the factor and its likely cause.

    Example:
        >>> import torch
        >>> from trainopt.perf.distributed import check_gradient_scale
        >>> reference = [torch.tensor([0.5, -1.0])]
        >>> check_gradient_scale([g.clone() for g in reference], reference)
        1.0
        >>> check_gradient_scale([32 * g for g in reference], reference, local_batch_size=32)
        Traceback (most recent call last):
        ...
        trainopt.perf.distributed.agreement.GradientScaleError: gradients are 32 × the
        single-process gradients: the loss is summed over the per-rank batch ...
    """
    scale, cosine = gradient_scale(grads, reference)
    if abs(scale - 1.0) <= rtol:
        return scale
    causes = [
        (
            float(local_batch_size or 0),
            "the loss is summed over the per-rank batch "
            "(reduction='sum'); average it (reduction='mean') or divide by the local batch size",
        ),
        (
            1.0 / world_size,
            "the gradient of a global sum is averaged over ranks by DDP/FSDP; "
            "multiply the loss by world_size, or average it instead",
        ),
        (float(accumulation_steps), "micro-batch losses are not divided by accumulation_steps"),
    ]
    if accumulation_steps > 1 and local_batch_size:
        causes.append(
            (
                float(local_batch_size * accumulation_steps),
                "the loss is summed over the "
                "per-rank batch and micro-batch losses are not divided by accumulation_steps",
            )
        )
    cause = next(
        (
            text
            for factor, text in causes
            if factor > 0 and factor != 1.0 and abs(scale / factor - 1.0) <= rtol
        ),
        "no known cause matches",
    )
    direction = "" if cosine > 1 - 1e-3 else f" and point elsewhere (cosine {cosine:.4f})"
    raise GradientScaleError(
        f"gradients are {scale:g} × the single-process gradients{direction}: {cause}"
    )


# ---------------------------------------------------------------------------------------------
# Decisions every rank agrees on
# ---------------------------------------------------------------------------------------------


def any_rank(flag: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """True on every rank if ``flag`` is true on any rank: a MAX all-reduce of a 0-dim flag.

    The result stays on the device (no host sync); outside a process group it is ``flag``.

    Example:
        >>> import torch
        >>> from trainopt.perf.distributed import any_rank
        >>> any_rank(torch.tensor(True))
        tensor(True)
    """
    if not (dist.is_available() and dist.is_initialized()):
        return flag.bool()
    agreed = flag.detach().to(torch.int32).clone()
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
    return agreed.bool()


def nonfinite_flag(loss: torch.Tensor, parameters: Iterable[nn.Parameter]) -> torch.Tensor:
    """A 0-dim bool tensor: the loss or any local gradient holds an inf or NaN (no host sync).

    Example:
        >>> import torch
        >>> from trainopt.perf.distributed.agreement import nonfinite_flag
        >>> layer = torch.nn.Linear(2, 1)
        >>> loss = layer(torch.ones(1, 2)).sum()
        >>> loss.backward()
        >>> nonfinite_flag(loss, layer.parameters()), nonfinite_flag(loss * float("nan"), [])
        (tensor(False), tensor(True))
    """
    tensors = [loss.detach()] + [p.grad.detach() for p in parameters if p.grad is not None]
    tensors = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]  # FSDP2 shards
    return ~torch.stack([torch.isfinite(t).all() for t in tensors]).all()


def step_unless_any_rank_nonfinite(
    optimizer: torch.optim.Optimizer, loss: torch.Tensor, parameters: Iterable[nn.Parameter]
) -> bool:
    """Step the optimizer on every rank, or on none if any rank saw an inf or NaN.

    The flag is agreed on the device (:func:`any_rank`); the host then reads that one scalar,
    the same single read ``torch.amp.GradScaler.step`` makes. Gradients are cleared on a skip.

    Returns:
        Whether the step was taken (the same on every rank).

    Example:
        >>> import torch
        >>> from trainopt.perf.distributed import step_unless_any_rank_nonfinite
        >>> layer = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        >>> loss = layer(torch.ones(1, 2)).sum() * float("nan")
        >>> loss.backward()
        >>> before = layer.weight.detach().clone()
        >>> step_unless_any_rank_nonfinite(optimizer, loss, layer.parameters())
        False
        >>> torch.equal(layer.weight, before), layer.weight.grad is None
        (True, True)
    """
    skip = any_rank(nonfinite_flag(loss, parameters))
    if skip.item():
        optimizer.zero_grad(set_to_none=True)
        return False
    optimizer.step()
    return True
