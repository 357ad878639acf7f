"""Runs that a restart must reproduce bit for bit: every scheduler of ``scheduler_configs`` on a
small model with dropout (the torch generator is drawn from on every step), two param groups,
SGD with momentum, and data that is a function of the step.

Shared by ``test_checkpoint_schedulers.py`` and the process it SIGKILLs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from scheduler_configs import SCHEDULERS
from torch.optim import lr_scheduler as ls

from trainopt.schedules import AdaptiveLearningRate
from trainopt.stability.checkpointing.checkpoint import CheckpointManager

STEPS = 40  # within every config's total_steps (OneCycleLR stops at 60)
METRIC_STEPPED = (ls.ReduceLROnPlateau, AdaptiveLearningRate)


def metric(step: int) -> float:
    """A loss that falls, sits on a plateau, then rises: ReduceLROnPlateau and AdaptiveLearningRate
    move."""
    return 1.0 / (1 + step) if step < 10 else (0.1 if step < 25 else 0.1 + 0.01 * (step - 25))


def build(name: str, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """Model, optimizer and scheduler ``name``, from scratch; reseeds torch's generator with
    ``seed``."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 3)
    )
    params = list(model.parameters())
    opt = torch.optim.SGD(
        [{"params": params[:2], "lr": 0.1}, {"params": params[2:], "lr": 0.05}],
        lr=0.1,
        momentum=0.9,
    )
    return model, opt, SCHEDULERS[name](opt)


def loss_at(model: torch.nn.Module, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
    return F.cross_entropy(model(x), y)


def advance(scheduler: Any, step: int) -> None:
    if isinstance(scheduler, ls.ReduceLROnPlateau):
        scheduler.step(metric(step))
    elif isinstance(scheduler, AdaptiveLearningRate):
        scheduler.update_lr(metric(step))
    else:
        scheduler.step()


def rates(opt: torch.optim.Optimizer) -> list[float]:
    return [float(group["lr"]) for group in opt.param_groups]


def train_plain(run: tuple, start: int, stop: int) -> list[list[float]]:
    """Plain torch steps ``start`` to ``stop``; the rates after each."""
    model, opt, sched = run
    seen = []
    for step in range(start, stop):
        opt.zero_grad(set_to_none=True)
        loss_at(model, step).backward()
        opt.step()
        advance(sched, step)
        seen.append(rates(opt))
    return seen


def stabilized(name: str, folder: str | Path, seed: int) -> dict[str, Any]:
    """The lower-level composition: a stabilizer whose recovery holds a checkpoint manager.

    A scheduler stepped with a metric is stepped by the stabilizer at each boundary, with the
    window's median loss.
    """
    from trainopt.stability.recovery.rollback import TrainingRecovery
    from trainopt.stability.stabilizer import TrainingStabilizer

    model, opt, sched = build(name, seed)
    recovery = TrainingRecovery(
        model, opt, CheckpointManager(folder, save_every=10), scheduler=sched
    )
    stabilizer = TrainingStabilizer(model, opt, sched, recovery=recovery, check_every=10)
    return {"model": model, "optimizer": opt, "scheduler": sched, "stabilizer": stabilizer}


def train_stabilized(run: dict[str, Any], start: int, stop: int) -> list[list[float]]:
    model, seen = run["model"], []
    for step in range(start, stop):
        run["stabilizer"].step(lambda: loss_at(model, step))  # noqa: B023 - called at once
        seen.append(rates(run["optimizer"]))
    return seen
