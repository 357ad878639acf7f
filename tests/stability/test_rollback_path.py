"""The rollback path, tested like the skip path, through both front doors of the one core.

Each test names the break it catches (checked by making the break in ``trainopt.stability.core``):

- the window not reopened after a rollback (the first window runs at the uncut rate);
- a window with two flagged steps in a row taken as a rollback target;
- averaged models left out of the rollback;
- ``check()`` between boundaries advancing the schedule by ``check_every`` minus the skips;
- a window whose only flags were isolated skipped steps refused as a checkpoint (starvation);
- ``ReduceLROnPlateau`` through the guard;
- skips and rollbacks not logged.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F

from trainopt.stability import Rollback, TrainingStabilizer
from trainopt.stability.integrations import GuardedOptimizer

CHECK = 10


def _schedule(step: int) -> float:
    return 0.97**step


def _model_and_data(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    generator = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(16, 6, generator=generator), torch.randint(0, 3, (16,), generator=generator))
        for _ in range(80)
    ]
    return model, data


class _Door:
    """One front door: the stabilizer (its own loop) or the guard (a framework's loop)."""

    def __init__(
        self, kind: str, tmp_path, averaged: bool = False, scheduler: str = "lambda", **options
    ):
        self.model, self.data = _model_and_data()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        if scheduler == "lambda":
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _schedule)
        else:
            self.scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer, patience=0, factor=0.5, threshold=0.5
            )
        self.average = torch.optim.swa_utils.AveragedModel(self.model) if averaged else None
        self.kind = kind
        if kind == "stabilizer":
            self.front = TrainingStabilizer(
                self.model,
                self.optimizer,
                self.scheduler,
                check_every=CHECK,
                checkpoint_dir=tmp_path,
                averaged=self.average,
                **options,
            )
        else:
            self.front = GuardedOptimizer(
                self.optimizer,
                self.scheduler,
                model=self.model,
                check_every=CHECK,
                checkpoint_dir=tmp_path,
                **options,
            )
        self.core = self.front.core

    def step(self, i: int, bad: bool = False) -> None:
        x, y = self.data[i % len(self.data)]
        factor = math.nan if bad else 1.0
        if self.kind == "stabilizer":
            self.front.step(lambda: F.cross_entropy(self.model(x), y) * factor)
        else:
            self.front.zero_grad()
            loss = F.cross_entropy(self.model(x), y) * factor
            loss.backward()
            self.front.step(lambda: loss)
            self.front.scheduler.step()

    def rate(self) -> float:
        return float(self.core.window.applied_rates()[0][0])


DOORS = ["stabilizer", "guard"]


def _diverge(door: _Door, start: int, length: int = CHECK) -> None:
    for i in range(start, start + length):
        door.step(i, bad=True)


@pytest.mark.parametrize("kind", DOORS)
def test_after_a_rollback_each_step_runs_at_lr_factor_times_the_schedule_at_the_restored_position(
    kind: str, tmp_path
) -> None:
    """Break caught: ``self.window.reopen()`` dropped from ``GuardedUpdate.roll_back``."""
    door = _Door(kind, tmp_path)
    for i in range(CHECK):
        door.step(i)
    _diverge(door, CHECK)  # 10 NaN steps in a row: patience 10, a rollback at step 20 to step 10
    assert door.core.recovery.history and door.core.recovery.history[-1]["restored_step"] == CHECK
    for j in range(2 * CHECK):  # two windows after the rollback, the first of them the one at risk
        door.step(100 + j)
        position = (
            CHECK + j + ((j + 1) % CHECK == 0)
        )  # after a boundary: the next window's first rate
        assert door.rate() == pytest.approx(0.5 * 0.1 * _schedule(position), rel=1e-6), j


@pytest.mark.parametrize("kind", DOORS)
def test_a_window_with_two_flagged_steps_in_a_row_is_no_rollback_target(
    kind: str, tmp_path
) -> None:
    """Break caught: ``is_safe`` taking any window that did not roll back."""
    door = _Door(kind, tmp_path)
    for i in range(CHECK):
        door.step(i)
    saved = door.core.last_save
    for i in range(CHECK, 2 * CHECK):
        door.step(i, bad=i in (13, 14))
    assert door.core.last_save == saved == CHECK  # not step 20: two flags in a row


@pytest.mark.parametrize("kind", DOORS)
def test_one_isolated_skip_in_every_window_still_checkpoints(kind: str, tmp_path) -> None:
    """Break caught: only windows that flagged nothing saved (the only file would be step 0)."""
    door = _Door(kind, tmp_path)
    for i in range(5 * CHECK):
        door.step(i, bad=i % CHECK == 4)
    assert door.core.last_save == 5 * CHECK and door.core.skipped_steps == 5


def test_a_rollback_restores_the_averaged_model(tmp_path) -> None:
    """Break caught: ``averaged_i`` left out of the checkpoint's extras on a rollback."""
    door = _Door("stabilizer", tmp_path, averaged=True, rollback=Rollback(patience=5))
    for i in range(2 * CHECK):
        door.step(i)
    saved = {k: v.clone() for k, v in door.average.state_dict().items()}  # as written at step 20
    for i in range(2 * CHECK, 2 * CHECK + 5):  # applied: the average moves on
        door.step(i)
    assert not torch.equal(door.average.state_dict()["module.0.weight"], saved["module.0.weight"])
    _diverge(door, 2 * CHECK + 5, 5)  # 5 flagged in a row: patience 5, a rollback at 30 to 20
    assert door.core.recovery.history[-1]["restored_step"] == 2 * CHECK
    for name, value in door.average.state_dict().items():
        assert torch.equal(value, saved[name]), name


@pytest.mark.parametrize("kind", DOORS)
def test_check_between_boundaries_leaves_the_schedule_where_plain_torch_has_it(
    kind: str, tmp_path
) -> None:
    """Break caught: ``boundary`` closing the window with ``check_every - skipped`` applied
    steps."""
    door = _Door(kind, tmp_path)
    for i in range(25):
        door.step(i, bad=i == 22)
    door.front.end_window()  # 5 steps since the boundary at 20, one of them skipped: 24 applied
    assert door.scheduler.last_epoch == 24
    door.step(25)
    assert door.rate() == pytest.approx(0.1 * _schedule(24), rel=1e-6)


def test_reduce_lr_on_plateau_through_the_guard(tmp_path) -> None:
    """Break caught: the guard's window built with a metric scheduler (``step()`` needs
    ``metrics``)."""
    door = _Door("guard", tmp_path, scheduler="plateau")
    door.data = [door.data[0]] * 80  # one batch: the loss falls, then plateaus
    for i in range(6 * CHECK):
        door.step(i)
    assert door.optimizer.param_groups[0]["lr"] < 0.1  # the plateau cut it at a boundary
    assert len(door.core.reports) == 6


@pytest.mark.parametrize("kind", DOORS)
def test_skips_and_rollbacks_are_logged_with_their_step_and_reason(
    kind: str, tmp_path, caplog
) -> None:
    """Break caught: ``_log_skips`` or the rollback's ``logger.warning`` removed."""
    door = _Door(kind, tmp_path)
    with caplog.at_level(logging.INFO, logger="trainopt.stability"):
        for i in range(CHECK):
            door.step(i, bad=i == 6)
        _diverge(door, CHECK)
    messages = [r.getMessage() for r in caplog.records if r.name == "trainopt.stability"]
    assert "step 7: skipped (non-finite loss, non-finite gradient norm)" in messages
    assert any(m.startswith("step 20: rolled back to step 10") for m in messages), messages
