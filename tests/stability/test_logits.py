"""z-loss and QK-norm: the formulas by hand, and what each one bounds."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trainopt.stability import qk_norm, z_loss


def test_z_loss_is_the_weight_times_the_mean_squared_log_normaliser_computed_by_hand() -> None:
    logits = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)) * 3
    by_hand = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in logits.tolist()) / 6
    assert z_loss(logits, weight=1e-3).item() == pytest.approx(1e-3 * by_hand, rel=1e-5)


def test_z_loss_sees_the_drift_that_cross_entropy_is_blind_to() -> None:
    logits = torch.randn(8, 10, generator=torch.Generator().manual_seed(1))
    labels = torch.arange(8)
    assert torch.allclose(
        F.cross_entropy(logits + 30, labels), F.cross_entropy(logits, labels), atol=1e-5
    )
    assert z_loss(logits + 30) > 100 * z_loss(logits)


def test_z_loss_gradient_pulls_the_log_normaliser_towards_zero() -> None:
    logits = (torch.randn(4, 10, generator=torch.Generator().manual_seed(2)) + 20).requires_grad_()
    before = torch.logsumexp(logits, -1).detach()
    optimizer = torch.optim.SGD([logits], lr=1.0)
    for _ in range(50):
        optimizer.zero_grad()
        z_loss(logits, weight=1.0).backward()
        optimizer.step()
    after = torch.logsumexp(logits, -1).detach()
    assert bool((after.abs() < before.abs() / 2).all())


def test_z_loss_refuses_a_negative_weight() -> None:
    with pytest.raises(ValueError, match="weight"):
        z_loss(torch.zeros(2, 3), weight=-1.0)


@pytest.mark.parametrize("scale", [0.1, 1.0, 1e4])
def test_qk_norm_bounds_every_attention_logit_by_the_root_of_the_head_dimension(
    scale: float,
) -> None:
    generator = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, 4, 12, 32, generator=generator) * scale for _ in range(2))
    q, k = qk_norm(q, k)
    logits = q @ k.transpose(-2, -1) / math.sqrt(32)
    assert logits.abs().max() <= math.sqrt(32) * (1 + 1e-5)
    assert torch.allclose(q.norm(dim=-1), torch.full(q.shape[:-1], math.sqrt(32)), rtol=1e-4)


def test_qk_norm_is_rms_normalisation_over_the_last_dimension() -> None:
    q = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(4))
    by_hand = q / q.square().mean(-1, keepdim=True).add(1e-6).sqrt()
    assert torch.allclose(qk_norm(q, q)[0], by_hand, atol=1e-6)
