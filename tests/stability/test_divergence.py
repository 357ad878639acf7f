"""Divergence is the loss and the gradient norm growing together, not a loss that rises alone.

A KL warm-up, a longer sequence, a new data mixture or a plateau raise the loss above an earlier
window while the gradient norm stays in its range: :class:`StabilityChecker` must not call that
diverging. A learning rate far too high grows both: it must. And the spike score behind the
skips works on negative losses and keeps flagging after a first spike in the window.
"""

from __future__ import annotations

import math

import torch

from trainopt.stability.monitoring.checker import StabilityChecker
from trainopt.stability.monitoring.loss import LossSpikeDetector


def _windows(losses, norms, check_every: int = 100) -> list[dict]:
    """Feed ``losses`` and gradient ``norms`` to a checker, checking and accepting as the stabilizer
    does."""
    model = torch.nn.Linear(1, 1, bias=False)
    checker = StabilityChecker(model, check_every=check_every)
    reports = []
    for step, (loss, norm) in enumerate(zip(losses, norms), start=1):
        model.weight.grad = torch.full_like(model.weight, norm)
        checker.update(torch.tensor(loss))
        if step % check_every == 0:
            report = checker.check()
            if report["is_stable"]:
                checker.accept(report)
            reports.append(report)
    return reports


def _noise(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def test_a_rising_loss_with_a_steady_gradient_norm_is_not_diverging() -> None:
    # a beta warm-up: the loss climbs from 20 to 26 over 500 steps, above every earlier window,
    # with little noise; the gradient norm stays around 3
    steps = 600
    losses = [20 + 6 * min(1, s / 500) + 0.05 * e for s, e in enumerate(_noise(steps, 0).tolist())]
    norms = [3 + 0.3 * e for e in _noise(steps, 1).tolist()]
    reports = _windows(losses, norms)
    assert [r["loss"]["recent_median"] > r["loss"]["reference"] for r in reports[2:]] == [True] * 4
    assert [r["loss"]["diverging"] for r in reports] == [0] * 6
    assert all(r["is_stable"] for r in reports)


def test_a_negative_rising_loss_with_a_steady_gradient_norm_is_not_diverging() -> None:
    steps = 400  # an RL objective: minus the reward, -1 rising towards -0.5
    losses = [-1 + 0.5 * s / steps + 0.01 * e for s, e in enumerate(_noise(steps, 2).tolist())]
    norms = [0.5 + 0.05 * e for e in _noise(steps, 3).tolist()]
    reports = _windows(losses, norms)
    assert [r["loss"]["diverging"] for r in reports] == [0] * 4 and all(
        r["is_stable"] for r in reports
    )


def test_a_loss_and_gradient_norm_growing_together_is_diverging_and_the_reason_says_both() -> None:
    # healthy for 300 steps, then both grow 2 % a step: a learning rate far too high
    steps = 400
    growth = [1.02 ** max(0, s - 300) for s in range(steps)]
    losses = [(1 + 0.02 * e) * g for e, g in zip(_noise(steps, 4).tolist(), growth)]
    norms = [(2 + 0.2 * e) * g for e, g in zip(_noise(steps, 5).tolist(), growth)]
    reports = _windows(losses, norms)
    assert [r["loss"]["diverging"] for r in reports] == [0, 0, 0, 1]
    reason = next(r for r in reports[3]["reasons"] if r.startswith("diverging"))
    grads = reports[3]["gradients"]
    assert grads["recent_median"] > 2 * grads["reference"]
    assert (
        f"{reports[3]['loss']['recent_median']:.4g}" in reason
        and f"{grads['recent_median']:.4g}" in reason
    )


def test_a_gradient_norm_growing_alone_is_not_diverging() -> None:
    steps = 400  # a loss that keeps falling while the gradient norm grows (a sharpening phase)
    losses = [2 * 0.995**s * (1 + 0.01 * e) for s, e in enumerate(_noise(steps, 6).tolist())]
    norms = [1.01 ** max(0, s - 300) for s in range(steps)]
    assert [r["loss"]["diverging"] for r in _windows(losses, norms)] == [0] * 4


def test_negative_losses_raise_no_spike_where_the_window_is_flat() -> None:
    # a flat negative window: the unit is floored at 1 % of |median| (tail_score's abs()); without
    # the abs() the floor is negative and every wiggle scores in the millions
    detector = LossSpikeDetector(window_size=50, min_history=20)
    flags = [bool(detector.update(torch.tensor(-5.0 + 0.001 * (i % 2)))) for i in range(60)]
    assert not any(flags)
    assert abs(float(detector.last_z)) < 1
    assert bool(detector.update(torch.tensor(-4.0)))  # 20 % of |median| above it: a spike


def test_two_spikes_in_one_window_are_both_flagged() -> None:
    # the first spike enters the window as NaN; the window's maximum must ignore it (nanmax), or
    # the unit turns NaN and nothing after the first spike is flagged until the NaN leaves
    detector = LossSpikeDetector(window_size=100, min_history=20)
    losses = [1.0 + 0.01 * math.sin(i) for i in range(30)] + [10.0] + [1.0] * 5 + [10.0] + [1.0] * 5
    flags = [bool(detector.update(torch.tensor(x))) for x in losses]
    assert [i for i, f in enumerate(flags) if f] == [30, 36]
    assert int(detector.num_spikes) == 2


def test_a_loss_back_at_chance_with_collapsed_gradients_is_diverging() -> None:
    # SGD at 30 times its rate from step 200 (the corpus's miss): the network dies, its loss climbs
    # back to chance (2.5) while its gradient norm collapses (2 -> 0.2) instead of growing
    steps = 300
    losses = [
        (2.3 * math.exp(-s / 40) + 0.01 + 0.002 * abs(e)) if s < 200 else 2.5 + 0.05 * e
        for s, e in enumerate(_noise(steps, 7).tolist())
    ]
    norms = [
        (2 + 0.3 * e) if s < 200 else 0.2 + 0.02 * e
        for s, e in enumerate(_noise(steps, 8).tolist())
    ]
    reports = _windows(losses, norms)
    assert [r["loss"]["diverging"] for r in reports] == [0, 0, 1]
    reason = next(r for r in reports[2]["reasons"] if r.startswith("diverging"))
    assert "below 1/4 of its largest" in reason
    assert reports[2]["gradients"]["recent_median"] * 4 < reports[2]["gradients"]["reference"]


def test_a_falling_loss_with_collapsing_gradients_is_not_diverging() -> None:
    # convergence: the gradient norm falls to a tenth while the loss keeps falling
    steps = 400
    losses = [2 * 0.99**s * (1 + 0.01 * e) for s, e in enumerate(_noise(steps, 9).tolist())]
    norms = [2 * 0.99**s * (1 + 0.05 * e) for s, e in enumerate(_noise(steps, 10).tolist())]
    reports = _windows(losses, norms)
    assert reports[-1]["gradients"]["recent_median"] * 4 < reports[-1]["gradients"]["reference"]
    assert [r["loss"]["diverging"] for r in reports] == [0] * 4
