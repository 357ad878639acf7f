"""A rollback's learning-rate cut multiplies the whole later schedule, for every scheduler.

Each scheduler of the installed ``torch.optim.lr_scheduler`` and of ``trainopt.schedules`` runs
twice in lockstep on two param groups: once plain (the twin), once with
``scale_learning_rate(optimizer, 0.5, scheduler)`` after step 3 and ``0.3`` after step 17. After
every later step each group's rate must be 0.5 (then 0.15) times the twin's: floors (``eta_min``,
``min_lr``, cyclic bounds), milestones, restarts and plateaus included. The runs are long enough
to reach each schedule's floor and end. A scheduler that cannot hold this is refused at the call.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from scheduler_configs import SCHEDULERS, STEPS, TORCH, two_groups
from torch.optim import lr_scheduler as ls

from trainopt.schedules import AdaptiveLearningRate
from trainopt.stability.recovery.rates import (
    UnsupportedSchedulerError,
    check_scalable,
    lr_scale,
    scale_learning_rate,
)

CUTS = {3: 0.5, 17: 0.3}


def _metric(step: int) -> float:
    """A loss that falls, then sits on a plateau (ReduceLROnPlateau cuts, then hits min_lr), then
    rises and falls again (AdaptiveLearningRate backs off to its floor, then recovers)."""
    return 1.0 / (1 + step) if step < 10 else (0.1 if step < 35 else 0.1 + 0.01 * math.sin(step))


def _advance(optimizer: torch.optim.Optimizer, scheduler: Any, step: int) -> None:
    optimizer.step()
    if isinstance(scheduler, ls.ReduceLROnPlateau):
        scheduler.step(_metric(step))
    elif isinstance(scheduler, AdaptiveLearningRate):
        scheduler.update_lr(_metric(step) if step < 20 or step > 40 else 0.1 + 0.01 * step)
    else:
        scheduler.step()


def _lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(g["lr"]) for g in optimizer.param_groups]


@pytest.mark.parametrize("make", SCHEDULERS.values(), ids=SCHEDULERS.keys())
def test_after_a_cut_every_later_rate_is_the_cut_times_the_twin_run_floors_included(make) -> None:
    opt, twin = two_groups(), two_groups()
    sched, twin_sched = make(opt), make(twin)
    factor, seen = 1.0, set()
    for step in range(STEPS):
        if step in CUTS:
            scale_learning_rate(opt, CUTS[step], sched)
            factor *= CUTS[step]
        _advance(opt, sched, step)
        _advance(twin, twin_sched, step)
        for ours, theirs in zip(_lrs(opt), _lrs(twin)):
            assert ours == pytest.approx(factor * theirs, rel=1e-9, abs=1e-15), (step, ours, theirs)
        seen.add(tuple(round(lr, 12) for lr in _lrs(twin)))
    assert lr_scale(opt) == pytest.approx(0.15)
    assert len(seen) > 1  # the schedule moved: the comparison is not between two constants


def test_every_scheduler_class_of_torch_is_covered() -> None:
    classes = {
        name
        for name, cls in vars(ls).items()
        if isinstance(cls, type)
        and issubclass(cls, ls.LRScheduler)
        and cls not in (ls.LRScheduler, ls._LRScheduler)
    }
    assert classes == set(TORCH)


def test_the_floors_are_reached_and_cut_too() -> None:
    """Without the floors scaled, the cut run would sit on the twin's floor: the cases above
    bite."""
    opt, twin = two_groups(), two_groups()
    sched = ls.CosineAnnealingLR(opt, T_max=5, eta_min=0.01)
    twin_sched = ls.CosineAnnealingLR(twin, T_max=5, eta_min=0.01)
    scale_learning_rate(opt, 0.5, sched)
    for step in range(5):
        _advance(opt, sched, step)
        _advance(twin, twin_sched, step)
    assert _lrs(twin)[0] == pytest.approx(0.01) and _lrs(opt)[0] == pytest.approx(0.005)


def test_a_scheduler_it_does_not_know_is_refused_by_name_and_nothing_changes() -> None:
    class Halving(ls.StepLR):
        def get_lr(self):  # keeps its own rates: scaling base_lrs would not reach them
            return [0.1 * 0.5 ** (self.last_epoch // 5) for _ in self.optimizer.param_groups]

    opt = two_groups()
    sched = Halving(opt, step_size=5)
    before = (_lrs(opt), list(sched.base_lrs))
    with pytest.raises(UnsupportedSchedulerError, match="Halving"):
        scale_learning_rate(opt, 0.5, sched)
    assert (_lrs(opt), list(sched.base_lrs)) == before
    nested = ls.SequentialLR(opt, [ls.ConstantLR(opt), Halving(opt, step_size=5)], milestones=[3])
    with pytest.raises(UnsupportedSchedulerError, match="Halving"):
        check_scalable(nested)


def test_the_cut_survives_a_checkpoint_of_optimizer_and_scheduler() -> None:
    opt, twin = two_groups(), two_groups()
    sched, twin_sched = TORCH["CyclicLR"](opt), TORCH["CyclicLR"](twin)
    scale_learning_rate(opt, 0.5, sched)
    restored_opt = two_groups()
    restored = TORCH["CyclicLR"](restored_opt)
    restored_opt.load_state_dict(opt.state_dict())
    restored.load_state_dict(sched.state_dict())
    for step in range(12):
        _advance(restored_opt, restored, step)
        _advance(twin, twin_sched, step)
        assert _lrs(restored_opt)[1] == pytest.approx(0.5 * _lrs(twin)[1], rel=1e-12)
    assert lr_scale(restored_opt) == 0.5
