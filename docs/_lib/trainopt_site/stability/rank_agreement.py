"""The multi-process check of the stability page: ranks that each see their own trouble decide
alike.

:func:`rank_agreement_check` runs on every rank of a process group (start it with
``trainopt.perf.distributed.launch(rank_agreement_check, 2, folder)`` or under ``torchrun``). It
trains the digits MLP under DistributedDataParallel through a :class:`TrainingStabilizer` built
with no distributed argument, while trouble hits one rank only:

- step 25: rank 1 alone sees a loss spike (its loss jumps by 50; its gradients are normal);
- step 27: rank 0 alone sees a NaN loss (the value only; its gradients are finite);
- steps 41 to 50: rank 1 alone sees a loss spike on every step, ten in a row: the stabilizer's
  ``patience``, so the boundary at step 50 rolls back to step 40.

It runs twice, on the same batches: with the stabilizer's default agreement over the world,
and, as the control, with each rank agreeing only with itself (a process group of one). Each
run returns the decisions and the final weights of its rank.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainopt.models import digits_data, digits_mlp
from trainopt.stability.checkpointing.checkpoint import CheckpointManager
from trainopt.stability.recovery.rollback import TrainingRecovery
from trainopt.stability.stabilizer import TrainingStabilizer

__all__ = ["LOSS_SPIKES", "NAN_LOSSES", "rank_agreement_check"]

# step -> the rank that alone sees the trouble
LOSS_SPIKES = {25: 1, **{step: 1 for step in range(41, 51)}}
NAN_LOSSES = {27: 0}


class _CountingManager(CheckpointManager):
    """A checkpoint manager that counts the files this process wrote."""

    writes = 0

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> Path:
        self.writes += 1
        return super().save_checkpoint(*args, **kwargs)


def _train(folder: str, calls: int, process_group: Any) -> dict[str, Any]:
    rank = dist.get_rank()
    x, y, _, _ = digits_data()
    model = torch.nn.parallel.DistributedDataParallel(digits_mlp(hidden=32, seed=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    manager = _CountingManager(folder, save_every=10)
    recovery = TrainingRecovery(model, optimizer, manager, lr_factor=0.5)
    kwargs = {} if process_group is None else {"process_group": process_group}
    stabilizer = TrainingStabilizer(model, optimizer, check_every=10, recovery=recovery, **kwargs)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for call in range(calls):  # as many batches on every rank: DDP's all-reduces must pair up
        index = torch.randint(0, len(x), (32,), generator=generator)
        shift = 0.0
        if LOSS_SPIKES.get(call) == rank:
            shift = 50.0
        if NAN_LOSSES.get(call) == rank:
            shift = math.nan
        stabilizer.step(lambda: F.cross_entropy(model(x[index]), y[index]) + shift)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {
        "weights": weights,
        "skip_events": stabilizer.skip_events,
        "reports": [
            {
                "step": r["step"],
                "flagged": r["flagged_steps"],
                "skipped": r["skipped_steps"],
                "spikes": r["loss"]["spikes"],
                "nonfinite": r["loss"]["nonfinite"],
                "recovered": r["recovered"] is not None,
            }
            for r in stabilizer.reports
        ],
        "rollbacks": [h["restored_step"] for h in recovery.history],
        "lr": float(optimizer.param_groups[0]["lr"]),
        "writes": manager.writes,
        "steps": stabilizer.steps,
    }


def rank_agreement_check(folder: str | None = None, calls: int = 70) -> dict[str, Any]:
    """Run the scenario with agreement (the default) and without; return this rank's results.

    Args:
        folder: A directory every rank can read and write (the checkpoints go below it).
        calls: Batches of each run (the agreed run rolls back once: it ends at step ``calls - 10``).

    Returns:
        ``{"agreed": {...}, "rank_local": {...}}``: each with the final ``weights``, the
        ``skip_events``, one entry per boundary report, the ``rollbacks``, the learning rate, and
        the number of checkpoint files this rank ``writes``.

    Example:
        >>> from trainopt_site.stability.rank_agreement import LOSS_SPIKES, NAN_LOSSES
        >>> # each rank has its own trouble
        >>> sorted(set(LOSS_SPIKES.values()) | set(NAN_LOSSES.values()))
        [0, 1]
    """
    folder = folder or tempfile.mkdtemp(prefix="trainopt-agreement-")
    rank = dist.get_rank()
    agreed = _train(str(Path(folder) / "agreed"), calls, None)
    own_groups = [
        dist.new_group([r]) for r in range(dist.get_world_size())
    ]  # every rank creates every group
    local = _train(str(Path(folder) / f"rank_local_{rank}"), calls, own_groups[rank])
    return {"agreed": agreed, "rank_local": local}
