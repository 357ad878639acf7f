"""Tests of trainopt.perf.rounding: stochastic rounding to bf16 is unbiased and exact where it can
be."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.perf.rounding import stochastic_round_to_bf16


@settings(max_examples=60, deadline=None)
@given(value=st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_result_is_one_of_the_two_bf16_neighbours(value):
    x = torch.full((64,), value)
    rounded = stochastic_round_to_bf16(x, torch.Generator().manual_seed(0))
    bits = rounded.float().view(torch.int32)
    toward_zero = x.view(torch.int32) & -(1 << 16)  # the bf16 neighbour of smaller magnitude
    away = (
        toward_zero + (1 << 16) if bool((x.view(torch.int32) != toward_zero).all()) else toward_zero
    )
    assert bool(((bits == toward_zero) | (bits == away)).all())


def test_values_bf16_holds_are_returned_unchanged():
    exact = (
        torch.tensor([0.0, -0.0, 1.0, -2.5, 2.0**-130, 3.0e38, float("inf"), -float("inf")])
        .bfloat16()
        .float()
    )
    assert torch.equal(stochastic_round_to_bf16(exact).float(), exact)
    assert torch.isnan(stochastic_round_to_bf16(torch.tensor([float("nan")]))).all()


def test_rounding_is_unbiased_on_average():
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(200_000, generator=generator) * 4 - 2
    rounded = stochastic_round_to_bf16(x, generator).float()
    error = (rounded - x).mean().item()
    nearest_error = (x.bfloat16().float() - x).abs().mean().item()
    assert abs(error) < 0.01 * nearest_error


def test_tiny_updates_to_bf16_weights_survive_in_expectation_not_with_round_to_nearest():
    generator = torch.Generator().manual_seed(0)
    nearest = torch.ones(10_000, dtype=torch.bfloat16)
    stochastic = nearest.clone()
    for _ in range(500):
        nearest = (nearest.float() + 1e-4).bfloat16()  # 1e-4 < half of bf16's gap at 1 (2**-8)
        stochastic = stochastic_round_to_bf16(stochastic.float() + 1e-4, generator)
    assert bool((nearest == 1).all())
    assert abs(stochastic.float().mean().item() - 1.05) < 0.002
