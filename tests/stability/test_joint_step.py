"""The checker's one pass over both monitors ends where the monitors' own updates end, bit for bit.

:class:`~trainopt.stability.monitoring.checker.StabilityChecker` updates the loss and the gradient
monitor together when their windows match (one sort for both, views into shared tensors). These run
the same sequence of losses and gradients through that pass and through the monitors' own ``update``
methods, and compare every flag, every report and the final state.
"""

from __future__ import annotations

import io
import math

import pytest
import torch

from trainopt.stability.monitoring.checker import StabilityChecker
from trainopt.stability.syncs import HostSyncCounter


def _events(seed: int, steps: int) -> list[tuple[float, float]]:
    """(loss, gradient scale) per step: a noisy decline with spikes, NaNs, infs and explosions."""
    g = torch.Generator().manual_seed(seed)
    events = []
    for t in range(steps):
        loss = (
            2.0 * math.exp(-t / 150)
            + 0.05 * float(torch.rand((), generator=g))
            - (3.0 if seed % 2 else 0.0)
        )
        scale = 1.0 + 0.2 * float(torch.rand((), generator=g))
        r = float(torch.rand((), generator=g))
        if r < 0.03:
            loss += 40.0  # a spike
        elif r < 0.05:
            loss = math.nan
        elif r < 0.06:
            loss = math.inf
        elif r < 0.09:
            scale *= 1e4  # an explosion
        elif r < 0.10:
            scale = math.nan
        events.append((loss, scale))
    return events


def _run(
    joint: bool, seed: int, steps: int, check_every: int, groups: int, reload_at: int | None = None
) -> tuple[list[bool], list[dict], dict]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 4)) for _ in range(2 * groups)]
    opt = torch.optim.SGD([{"params": params[2 * i : 2 * i + 2]} for i in range(groups)], lr=0.1)
    checker = StabilityChecker(opt, check_every=check_every)
    if not joint:
        checker._joint = False
    flags, reports = [], []
    for t, (loss, scale) in enumerate(_events(seed, steps)):
        for i, p in enumerate(params):
            p.grad = torch.full_like(p, scale * (1 + i / 10))
        flags.append(bool(checker.update(torch.tensor(loss))))
        if (t + 1) % check_every == 0:
            report = checker.check()
            reports.append(report)
            if report["is_stable"]:
                checker.accept(report)
        if reload_at is not None and t == reload_at:
            buffer = io.BytesIO()
            torch.save(checker.state_dict(), buffer)
            buffer.seek(0)
            checker.load_state_dict(torch.load(buffer, weights_only=True))
    return flags, reports, checker.state_dict()


def _same(a: object, b: object) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
            and torch.equal(a.isnan(), b.isnan())
        )
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


@pytest.mark.parametrize(
    ("seed", "groups", "reload_at"), [(0, 1, None), (1, 1, 137), (2, 2, None), (3, 2, 61)]
)
def test_the_joint_pass_and_the_monitors_own_updates_agree_bitwise(
    seed: int, groups: int, reload_at: int | None
):
    joint = _run(True, seed, 400, 50, groups, reload_at)
    separate = _run(False, seed, 400, 50, groups, reload_at)
    assert sum(joint[0]) > 10  # the sequence flags steps of every kind
    assert joint[0] == separate[0]
    assert _same(joint[1], separate[1])
    assert _same(joint[2], separate[2])


def test_the_joint_pass_is_taken_and_reads_nothing():
    params = [torch.nn.Parameter(torch.randn(3))]
    checker = StabilityChecker(torch.optim.SGD(params, lr=0.1), check_every=100)
    params[0].grad = torch.ones(3)
    for _ in range(30):
        checker.update(torch.tensor(1.0))
    with HostSyncCounter() as counter:
        for _ in range(30):
            checker.update(torch.tensor(1.0))
    assert checker._joint not in (None, False) and checker._joint.bound()
    assert counter.count == 0


def test_monitors_with_different_windows_take_the_separate_updates():
    from trainopt.stability.monitoring.gradients import GradientMonitor
    from trainopt.stability.monitoring.loss import LossStabilityMonitor

    params = [torch.nn.Parameter(torch.randn(3))]
    opt = torch.optim.SGD(params, lr=0.1)
    checker = StabilityChecker(
        opt, LossStabilityMonitor(window_size=50), GradientMonitor(opt, window_size=80)
    )
    params[0].grad = torch.ones(3)
    checker.update(torch.tensor(1.0))
    assert checker._joint is False and checker.steps == 1
