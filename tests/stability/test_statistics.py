"""The tail score the monitors compute every step equals its definition through nanmedian and
nanmax."""

from __future__ import annotations

import math

import pytest
import torch

from trainopt.stability.monitoring.statistics import nanmax, nanmedian, tail_score


def _by_definition(value: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    median = nanmedian(window)
    unit = torch.maximum(nanmax(window) - median, 1e-2 * median.abs()).clamp_min(1e-8)
    return (value.to(window.dtype) - median) / unit


@pytest.mark.parametrize("size", [1, 2, 3, 20, 100])
def test_the_one_sort_tail_score_is_the_definitions_bit_for_bit(size: int) -> None:
    """Break caught: a wrong middle or largest index (NaN counted, an off-by-one, no clamp)."""
    g = torch.Generator().manual_seed(size)
    for trial in range(200):
        scale = (1e-3, 1.0, 1e3)[trial % 3]
        window = torch.randn(size, generator=g) * scale + (-5.0, 0.0, 5.0)[trial % 3]
        missing = torch.randperm(size, generator=g)[: trial % (size + 1)]
        window[missing] = math.nan  # from none to every entry
        value = torch.randn((), generator=g) * 3
        got, want = tail_score(value, window), _by_definition(value, window)
        assert torch.equal(got, want) or (got.isnan() and want.isnan()), (trial, window, got, want)
