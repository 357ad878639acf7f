"""Clipping checked by hand, not against clip_grad_norm_ (which clip_gradients calls, so a
comparison with it agrees by construction): norms and coefficients computed from the numbers,
for both clip_gradients and the stabilizer's clip_grads_with_norm_; a patched clip_grad_norm_
that scales small gradients up fails them."""

from __future__ import annotations

import math

import pytest
import torch

from trainopt.stability.clipping.norms import clip_gradients, clip_grads_with_norm_, total_grad_norm

# Hand-computed cases: gradients 3, 4 | 12 | 0.5, -0.5 have the global L2 norm
# sqrt(9 + 16 + 144 + 0.25 + 0.25) = sqrt(169.5), L1 norm 20 and max norm 12; clipping multiplies
# every gradient by max_norm / (norm + 1e-6) when that is below 1, and by nothing otherwise.

HAND = [([3.0, 4.0], torch.float32), ([12.0], torch.float64), ([0.5, -0.5], torch.bfloat16)]
NORMS = {2.0: math.sqrt(169.5), 1.0: 20.0, math.inf: 12.0}
TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-12, torch.bfloat16: 1e-2}


def _hand_params(dtypes: bool = True) -> list[torch.nn.Parameter]:
    params = []
    for values, dtype in HAND:
        dtype = dtype if dtypes else torch.float32
        p = torch.nn.Parameter(torch.zeros(len(values), dtype=dtype))
        p.grad = torch.tensor(values, dtype=dtype)
        params.append(p)
    return params


CLIPPERS = {
    "clip_gradients": lambda params, max_norm, norm_type: clip_gradients(
        params, max_norm, norm_type
    ),
    "clip_grads_with_norm_": lambda params, max_norm, norm_type: clip_grads_with_norm_(
        params, torch.tensor(max_norm, dtype=torch.float64), total_grad_norm(params, norm_type)
    ),
}


def _check_clipped_by_hand(clip, dtypes: bool, norm_type: float, max_norm: float) -> None:
    params = _hand_params(dtypes)
    clip(params, max_norm, norm_type)
    norm = NORMS[norm_type]
    coefficient = min(max_norm / (norm + 1e-6), 1.0)
    for p, (values, _dtype) in zip(params, HAND):
        tolerance = max(TOLERANCE[p.grad.dtype], 1e-6)  # the norm is summed from per-dtype norms
        for got, value in zip(p.grad.double().tolist(), values):
            assert got == pytest.approx(value * coefficient, rel=tolerance), (
                p.grad.dtype,
                norm_type,
                max_norm,
            )
        if coefficient == 1.0:
            assert torch.equal(
                p.grad, torch.tensor(values, dtype=p.grad.dtype)
            )  # untouched, bit for bit


@pytest.mark.parametrize("clip", CLIPPERS.values(), ids=CLIPPERS.keys())
@pytest.mark.parametrize("dtypes", [True, False], ids=["float32+float64+bfloat16", "float32"])
@pytest.mark.parametrize("norm_type", NORMS)
@pytest.mark.parametrize("max_norm", [1.0, 5.0, 12.5, 1000.0], ids=["1", "5", "12.5", "1000"])
def test_clipping_scales_every_gradient_by_max_norm_over_the_norm_computed_by_hand(
    clip, dtypes, norm_type, max_norm
):
    """max_norm 12.5 and 1000 lie above the norm for some norm types: the gradients stay as they
    are."""
    _check_clipped_by_hand(clip, dtypes, norm_type, max_norm)


def test_clip_gradients_returns_the_norm_computed_by_hand_before_clipping():
    for norm_type, norm in NORMS.items():
        assert clip_gradients(_hand_params(), 1.0, norm_type).item() == pytest.approx(
            norm, rel=1e-6
        )


def test_a_clip_grad_norm_that_scales_small_gradients_up_fails_the_hand_computed_check(monkeypatch):
    """The check can fail: without the clamp to 1, max_norm above the norm scales gradients up."""

    def scales_up(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        parameters = list(parameters)
        norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad.double(), norm_type) for p in parameters]),
            norm_type,
        )
        for p in parameters:
            p.grad.mul_((max_norm / (norm + 1e-6)).to(p.grad.dtype))  # no clamp
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", scales_up)
    _check_clipped_by_hand(CLIPPERS["clip_gradients"], True, 2.0, 1.0)  # still right below the norm
    with pytest.raises(AssertionError):
        _check_clipped_by_hand(CLIPPERS["clip_gradients"], True, 2.0, 1000.0)
