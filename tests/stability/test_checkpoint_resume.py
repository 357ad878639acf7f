"""Proof: a run saved at step k, rebuilt from scratch and resumed, is bit-identical to a run
that never stopped (parameters, optimizer, scheduler, scaler, clipper, and the next random
numbers of Python, NumPy and torch)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from trainopt.models import digits_data, digits_mlp
from trainopt.stability.checkpointing.checkpoint import CheckpointManager
from trainopt.stability.clipping.norms import ZScoreClipper
from trainopt.stability.scaling.scaler import DynamicLossScaler

N_STEPS = 24
X, Y, _, _ = digits_data()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def warmup_then_decay(step: int) -> float:
    return min(1.0, (step + 1) / 5) * 0.97**step


def build(model_seed: int):
    """Everything a run owns, built from scratch."""
    model = digits_mlp(hidden=32, seed=model_seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_then_decay)
    scaler = DynamicLossScaler(init_scale=2.0**10, growth_interval=3)
    clipper = ZScoreClipper(warmup_steps=4)
    return model, opt, sched, scaler, clipper


def train(run, start: int, stop: int) -> None:
    """Steps use all three generators: torch (batch, input noise), Python and NumPy (weighting)."""
    model, opt, sched, scaler, clipper = run
    for step in range(start, stop):
        idx = torch.randint(0, len(X), (64,))
        xb = X[idx] + 0.1 * torch.randn(64, X.shape[1])
        weight = 1.0 + 0.1 * random.random() + 0.1 * float(np.random.rand())
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), Y[idx]) * weight
        scaler.scale(loss).backward()
        if step == 7:  # an overflowing step: skipped, scale backed off
            next(model.parameters()).grad.view(-1)[0] = float("inf")
        scaler.unscale_(opt)
        clipper(model)
        scaler.step(opt)
        scaler.update()
        sched.step()


def next_random_numbers():
    return torch.randn(8), random.random(), float(np.random.rand())


def assert_equal_state(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_equal_state(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_equal_state(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("k", [1, 9])
def test_resume_from_checkpoint_is_bitwise_identical(tmp_path, k):
    seed_everything(0)
    straight = build(model_seed=0)
    train(straight, 0, N_STEPS)
    expected_random = next_random_numbers()

    seed_everything(0)
    first = build(model_seed=0)
    train(first, 0, k)
    model, opt, sched, scaler, clipper = first
    CheckpointManager(tmp_path).save_checkpoint(
        model, opt, k, 0.0, scheduler=sched, scaler=scaler, extra={"clipper": clipper}
    )
    del first, model, opt, sched, scaler, clipper

    seed_everything(1234)  # a fresh process would start from other generator states
    resumed = build(model_seed=7)
    model, opt, sched, scaler, clipper = resumed
    step, _ = CheckpointManager(tmp_path).load_latest(
        model, opt, scheduler=sched, scaler=scaler, extra={"clipper": clipper}
    )
    assert step == k
    train(resumed, k, N_STEPS)

    for a, b in zip(straight[0].parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert_equal_state(straight[1].state_dict(), opt.state_dict())
    assert_equal_state(straight[2].state_dict(), sched.state_dict())
    assert straight[3].state_dict() == scaler.state_dict()
    assert int(scaler.skipped_steps) == 1  # the injected overflow, counted once
    assert_equal_state(straight[4].state_dict(), clipper.state_dict())
    got_random = next_random_numbers()
    assert torch.equal(got_random[0], expected_random[0])
    assert got_random[1:] == expected_random[1:]


def test_resume_without_rng_restore_diverges(tmp_path):
    """Control: the RNG states are what makes the resumed run identical."""
    seed_everything(0)
    straight = build(model_seed=0)
    train(straight, 0, 12)

    seed_everything(0)
    first = build(model_seed=0)
    train(first, 0, 6)
    model, opt, sched, scaler, clipper = first
    manager = CheckpointManager(tmp_path)
    manager.save_checkpoint(
        model, opt, 6, 0.0, scheduler=sched, scaler=scaler, extra={"clipper": clipper}
    )
    seed_everything(1234)
    resumed = build(model_seed=7)
    manager.load_latest(
        resumed[0],
        resumed[1],
        scheduler=resumed[2],
        scaler=resumed[3],
        extra={"clipper": resumed[4]},
        restore_rng=False,
    )
    train(resumed, 6, 12)
    assert not all(
        torch.equal(a, b) for a, b in zip(straight[0].parameters(), resumed[0].parameters())
    )
