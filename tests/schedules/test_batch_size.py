"""trainopt.schedules.batch_size: the batch-size ramp-up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainopt.schedules import batch_size_rampup, rampup_steps


def test_rampup_matches_megatron_steps() -> None:
    schedule = batch_size_rampup(start=16, end=64, increment=16, ramp_samples=300)
    assert [schedule(s) for s in (0, 99, 100, 199, 200, 299, 300)] == [16, 16, 32, 32, 48, 48, 64]


def test_rampup_holds_end_past_the_ramp_and_with_no_ramp() -> None:
    assert batch_size_rampup(8, 32, 8, 100)(10**12) == 32
    assert batch_size_rampup(8, 32, 8, 0)(0) == 32
    assert batch_size_rampup(32, 32, 8, 100)(0) == 32


@given(
    start=st.integers(1, 64),
    increments=st.integers(0, 8),
    increment=st.integers(1, 64),
    ramp=st.integers(0, 10_000),
    samples=st.lists(st.integers(0, 20_000), min_size=2, max_size=20),
)
def test_rampup_never_falls_and_stays_on_the_grid(
    start: int, increments: int, increment: int, ramp: int, samples: list[int]
) -> None:
    end = start + increments * increment
    schedule = batch_size_rampup(start, end, increment, ramp)
    sizes = [schedule(s) for s in sorted(samples)]
    assert sizes == sorted(sizes)
    assert all(start <= b <= end and (b - start) % increment == 0 for b in sizes)


def test_rampup_steps_consume_exactly_the_samples() -> None:
    sizes = rampup_steps(batch_size_rampup(4, 12, 4, 40), total_samples=101)
    assert sum(sizes) == 101 and sizes[0] == 4 and max(sizes) == 12


@pytest.mark.parametrize(
    "args, field",
    [
        ((0, 8, 4, 10), "start"),
        ((8, 4, 4, 10), "end"),
        ((4, 10, 4, 10), "end"),
        ((4, 8, 4, -1), "ramp_samples"),
        ((4, 8, 0, 10), "increment"),
    ],
)
def test_rampup_rejects_bad_arguments_naming_them(
    args: tuple[int, int, int, int], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        batch_size_rampup(*args)
