"""Decisions every rank agrees on: the collectives the stabilizer makes when ranks train together.

When ``torch.distributed`` is initialised, the stabilizer agrees every decision across the ranks
of its process group (the default group unless one is given):

- the per-step skip flag, by a MAX all-reduce of a small tensor on the device (:func:`any_rank`):
  no host sync, one collective per step;
- the boundary statistics, by a MAX all-reduce before anything is decided (:func:`max_over_ranks`);
- rollbacks and resumes: every rank loads the file rank 0 picked (:func:`broadcast_from_rank0`);
- checkpoint saves: rank 0 writes, the others wait for it (:func:`is_main_process`,
  :func:`barrier`), and each rank's own random number generators and data position travel in the
  file (:func:`all_gather`).

Outside a process group every function works on the one process, so the same code runs on one
device and on many.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "all_gather",
    "any_rank",
    "barrier",
    "broadcast_from_rank0",
    "is_main_process",
    "max_over_ranks",
    "rank_and_world",
    "in_process_group",
]


def in_process_group() -> bool:
    """Whether ``torch.distributed`` is available and initialised in this process.

    Example:
        >>> from trainopt.stability.distributed import in_process_group
        >>> in_process_group()
        False
    """
    return dist.is_available() and dist.is_initialized()


def rank_and_world(group: Any = None) -> tuple[int, int]:
    """``(rank, world_size)`` in ``group``; ``(0, 1)`` outside a process group.

    Example:
        >>> from trainopt.stability.distributed import rank_and_world
        >>> rank_and_world()
        (0, 1)
    """
    if not in_process_group():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def any_rank(flag: torch.Tensor, group: Any = None) -> torch.Tensor:
    """True on every rank where ``flag`` is true on any rank: a MAX all-reduce on the device.

    ``flag`` may be a 0-d flag or a vector of flags (one all-reduce for all of them). The result
    stays on the device: no host sync. Outside a process group it is ``flag`` as bool.

    Example:
        >>> import torch
        >>> from trainopt.stability import any_rank
        >>> any_rank(torch.tensor([True, False]))
        tensor([ True, False])
    """
    if not in_process_group():
        return flag.bool()
    agreed = flag.detach().to(torch.int32).clone()
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
    return agreed.bool()


def max_over_ranks(
    values: Sequence[float], device: torch.device | str = "cpu", group: Any = None
) -> list[float]:
    """The largest value over ranks of each number (host values; NaN counts as the smallest).

    Example:
        >>> from trainopt.stability.distributed import max_over_ranks
        >>> max_over_ranks([1.0, float("nan"), 3.0])
        [1.0, nan, 3.0]
    """
    if not in_process_group():
        return [float(v) for v in values]
    packed = torch.tensor(
        [-math.inf if math.isnan(v) else float(v) for v in values],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(packed, op=dist.ReduceOp.MAX, group=group)
    return [
        math.nan if v == -math.inf and math.isnan(orig) else v
        for v, orig in zip(packed.tolist(), values)
    ]


def is_main_process(group: Any = None) -> bool:
    """True on rank 0 of ``group``, or when no process group is initialised.

    Example:
        >>> from trainopt.stability.distributed import is_main_process
        >>> is_main_process()
        True
    """
    return rank_and_world(group)[0] == 0


def barrier(group: Any = None) -> None:
    """Wait for every rank of ``group`` (nothing to wait for outside a process group).

    Example:
        >>> from trainopt.stability.distributed import barrier
        >>> barrier() is None
        True
    """
    if in_process_group():
        dist.barrier(group=group)


def broadcast_from_rank0(obj: Any, group: Any = None) -> Any:
    """Rank 0's ``obj`` on every rank (e.g. the checkpoint path to roll back to).

    Example:
        >>> from trainopt.stability import broadcast_from_rank0
        >>> broadcast_from_rank0("checkpoint_step_1000.pt")
        'checkpoint_step_1000.pt'
    """
    if not in_process_group():
        return obj
    box = [obj]
    source = dist.get_global_rank(group, 0) if group is not None else 0
    dist.broadcast_object_list(box, src=source, group=group)
    return box[0]


def _on_cpu(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(v) for v in obj)
    return obj


def all_gather(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj``, indexed by rank, on every rank (``[obj]`` outside a process group).

    Tensors inside ``obj`` travel, and come back, on the CPU.

    Example:
        >>> from trainopt.stability.distributed import all_gather
        >>> all_gather({"position": 3})
        [{'position': 3}]
    """
    if not in_process_group():
        return [_on_cpu(obj)]
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, _on_cpu(obj), group=group)
    return gathered
