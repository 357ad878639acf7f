"""Property tests (hypothesis) of the pure schedules in trainopt.schedules."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.schedules.functions import (
    cosine_annealing,
    cyclical_scale,
    linear_warmup_decay,
    polynomial_decay,
    warmup_stable_decay,
)

runs = st.integers(2, 5000).flatmap(
    lambda total: st.tuples(st.just(total), st.integers(0, total - 1))
)
ratios = st.floats(0.0, 1.0)
decays = st.sampled_from(["linear", "cosine", "1-sqrt"])


def wsd_args(total: int, warmup: int, data) -> dict:
    decay_steps = data.draw(st.integers(1, total - warmup))
    return {"total_steps": total, "warmup_steps": warmup, "decay_steps": decay_steps}


def all_schedules(total: int, warmup: int, ratio: float, data, wsd: dict | None = None):
    """Every warm-up schedule as ``(name, step -> multiplier, floor)``."""
    wsd = wsd or wsd_args(total, warmup, data)
    decay = data.draw(decays)
    power = data.draw(st.floats(0.5, 4.0))
    return [
        ("linear", lambda s: linear_warmup_decay(s, total, warmup), 0.0),
        ("cosine", lambda s: cosine_annealing(s, total, warmup, ratio), ratio),
        ("wsd", lambda s: warmup_stable_decay(s, **wsd, min_ratio=ratio, decay=decay), ratio),
        ("polynomial", lambda s: polynomial_decay(s, total, warmup, ratio, power), ratio),
    ]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(run=runs, ratio=ratios, data=st.data())
def test_warmup_rises_monotonically_from_zero_to_the_peak(run, ratio, data):
    total, warmup = run
    for name, schedule, _ in all_schedules(total, warmup, ratio, data):
        values = [schedule(s) for s in range(warmup + 1)]
        assert values[0] == (0.0 if warmup else 1.0), name
        assert all(a <= b for a, b in zip(values, values[1:])), name
        assert values[-1] == 1.0, name


@settings(max_examples=60, deadline=None, derandomize=True)
@given(run=runs, ratio=ratios, data=st.data())
def test_schedules_are_continuous_at_phase_boundaries(run, ratio, data):
    """The formulas accept real-valued steps: just before and after a boundary they agree."""
    total, warmup = run
    wsd = wsd_args(total, warmup, data)
    boundaries = {b for b in (warmup, total, total - wsd["decay_steps"]) if b > 0}
    for name, schedule, _ in all_schedules(total, warmup, ratio, data, wsd):
        for b in boundaries:
            for side in (b - 1e-9, b + 1e-9):
                assert abs(schedule(side) - schedule(b)) < 1e-3, (name, b, side)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(run=runs, ratio=ratios, data=st.data())
def test_never_below_min_lr_after_warmup_and_finite_everywhere(run, ratio, data):
    total, warmup = run
    steps = sorted(
        set(data.draw(st.lists(st.integers(0, 3 * total), min_size=1, max_size=50)))
        | {warmup, total, total + 1}
    )
    for name, schedule, floor in all_schedules(total, warmup, ratio, data):
        for s in steps:
            value = schedule(s)
            assert math.isfinite(value) and value <= 1.0, (name, s, value)
            if s >= warmup:
                assert value >= floor * (1 - 1e-15), (name, s, value, floor)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(run=runs, ratio=ratios, data=st.data(), later=st.integers(1, 10**9))
def test_every_schedule_holds_its_final_value_past_total_steps(run, ratio, data, later):
    total, warmup = run
    for name, schedule, floor in all_schedules(total, warmup, ratio, data):
        assert schedule(total + later) == schedule(total), name
        assert math.isclose(schedule(total), floor, rel_tol=1e-12, abs_tol=1e-300), name


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    step=st.integers(0, 10**6),
    step_size=st.integers(1, 5000),
    mode=st.sampled_from(["triangular", "triangular2", "exp_range"]),
    gamma=st.floats(0.0, 1.0),
)
def test_cyclical_height_stays_in_unit_interval(step, step_size, mode, gamma):
    value = cyclical_scale(step, step_size, mode, gamma)
    assert 0.0 <= value <= 1.0 and math.isfinite(value)
