"""The reference update rules of trainopt.concepts agree with torch.optim, clip_grad_norm_ and
GradScaler."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.concepts.rules import (
    AdamState,
    RMSPropState,
    SGDState,
    adam_step_size_factor,
    adam_update,
    adamw_update,
    clip_by_global_norm,
    next_loss_scale,
    rmsprop_update,
    scale_loss,
    sgd_update,
    unscale_gradients,
    warmup_cosine_lr,
)

STEPS = 100
SHAPES = [(7,), (5, 3), (2, 3, 4)]
RTOL = 1e-10  # the brief asks for 1e-6; the float64 rules agree far more tightly than that


def _problem(seed: int) -> tuple[list[torch.Tensor], callable]:
    """Parameters of several shapes and a random non-quadratic loss over them (float64)."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in SHAPES]
    targets = [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in SHAPES]
    weights = [torch.rand(shape, generator=gen, dtype=torch.float64) * 3 for shape in SHAPES]

    def loss_fn(ps: list[torch.Tensor]) -> torch.Tensor:
        return sum(
            (w * (p - t) ** 2).sum() + 0.1 * torch.cos(3 * p).sum()
            for p, t, w in zip(ps, targets, weights)
        )

    return params, loss_fn


def _grads(params: list[torch.Tensor], loss_fn) -> list[torch.Tensor]:
    leaves = [p.detach().clone().requires_grad_(True) for p in params]
    return list(torch.autograd.grad(loss_fn(leaves), leaves))


def _run_torch(optimizer_cls, hyper: dict, seed: int) -> list[torch.Tensor]:
    params, loss_fn = _problem(seed)
    leaves = [p.clone().requires_grad_(True) for p in params]
    opt = optimizer_cls(leaves, **hyper)
    for _ in range(STEPS):
        opt.zero_grad()
        loss_fn(leaves).backward()
        opt.step()
    return [p.detach() for p in leaves]


def _run_reference(update, init_state, hyper: dict, seed: int) -> list[torch.Tensor]:
    params, loss_fn = _problem(seed)
    states = [init_state(p) for p in params]
    for _ in range(STEPS):
        grads = _grads(params, loss_fn)
        stepped = [update(p, g, s, **hyper) for p, g, s in zip(params, grads, states)]
        params, states = [p for p, _ in stepped], [s for _, s in stepped]
    return params


def _assert_close(ours: list[torch.Tensor], theirs: list[torch.Tensor], start_seed: int) -> None:
    start, _ = _problem(start_seed)
    for a, b, p0 in zip(ours, theirs, start):
        assert not torch.equal(b, p0), "the optimizer did not move the parameters"
        torch.testing.assert_close(a, b, rtol=RTOL, atol=1e-12)


@pytest.mark.parametrize(
    "hyper",
    [
        dict(lr=0.01),
        dict(lr=0.01, momentum=0.9),
        dict(lr=0.02, momentum=0.8, dampening=0.3, weight_decay=0.05),
        dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=0.01),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_sgd_matches_torch_over_100_steps(hyper: dict, seed: int) -> None:
    ours = _run_reference(sgd_update, lambda p: SGDState(), hyper, seed)
    _assert_close(ours, _run_torch(torch.optim.SGD, hyper, seed), seed)


@pytest.mark.parametrize(
    "hyper",
    [
        dict(lr=0.01),
        dict(lr=0.005, alpha=0.9, eps=1e-6, momentum=0.9),
        dict(lr=0.003, alpha=0.95, centered=True, weight_decay=0.1),
        dict(lr=0.002, alpha=0.99, centered=True, momentum=0.5),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_rmsprop_matches_torch_over_100_steps(hyper: dict, seed: int) -> None:
    def init(p: torch.Tensor) -> RMSPropState:
        return RMSPropState.zeros_like(
            p, centered=hyper.get("centered", False), momentum=hyper.get("momentum", 0.0)
        )

    ours = _run_reference(rmsprop_update, init, hyper, seed)
    _assert_close(ours, _run_torch(torch.optim.RMSprop, hyper, seed), seed)


@pytest.mark.parametrize(
    "hyper",
    [
        dict(lr=0.01),
        dict(lr=0.05, betas=(0.8, 0.99), eps=1e-6),
        dict(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_adam_matches_torch_over_100_steps(hyper: dict, seed: int) -> None:
    ours = _run_reference(adam_update, AdamState.zeros_like, hyper, seed)
    _assert_close(ours, _run_torch(torch.optim.Adam, hyper, seed), seed)


@pytest.mark.parametrize(
    "hyper",
    [
        dict(lr=0.01),
        dict(lr=0.02, betas=(0.9, 0.95), weight_decay=0.1),
        dict(lr=0.005, eps=1e-5, weight_decay=1.0),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_adamw_matches_torch_over_100_steps(hyper: dict, seed: int) -> None:
    hyper = {"weight_decay": 1e-2, **hyper}  # torch.optim.AdamW's default decay
    ours = _run_reference(adamw_update, AdamState.zeros_like, hyper, seed)
    _assert_close(ours, _run_torch(torch.optim.AdamW, hyper, seed), seed)


def test_adam_bias_correction_changes_the_first_step_by_the_predicted_factor() -> None:
    param, grad = (
        torch.zeros(3, dtype=torch.float64),
        torch.tensor([0.5, -2.0, 4.0], dtype=torch.float64),
    )
    corrected, _ = adam_update(param, grad, AdamState.zeros_like(param), lr=1e-3, eps=0.0)
    uncorrected, _ = adam_update(
        param, grad, AdamState.zeros_like(param), lr=1e-3, eps=0.0, bias_correction=False
    )
    torch.testing.assert_close(corrected, -1e-3 * grad.sign())
    torch.testing.assert_close(
        uncorrected / corrected, torch.full_like(param, adam_step_size_factor(1))
    )


def test_l2_in_adam_differs_from_adamw_decoupled_decay() -> None:
    param, grad = torch.ones(2, dtype=torch.float64), torch.tensor([10.0, 0.0], dtype=torch.float64)
    adam_l2, _ = adam_update(param, grad, AdamState.zeros_like(param), lr=0.1, weight_decay=0.01)
    adamw, _ = adamw_update(param, grad, AdamState.zeros_like(param), lr=0.1, weight_decay=0.01)
    # The coordinate with no loss gradient: L2 through Adam is normalised to a full lr step;
    # AdamW shrinks it by lr * weight_decay only.
    assert adam_l2[1].item() == pytest.approx(1 - 0.1, rel=1e-6)
    assert adamw[1].item() == pytest.approx(1 - 0.1 * 0.01, rel=1e-12)


@pytest.mark.parametrize("max_norm", [0.1, 1.0, 100.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clip_by_global_norm_matches_clip_grad_norm_(max_norm: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in SHAPES]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64) * 3
    grads = [p.grad.clone() for p in params]
    ours, our_norm = clip_by_global_norm(grads, max_norm)
    torch_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    torch.testing.assert_close(our_norm, torch_norm, rtol=1e-14, atol=0)
    for a, p in zip(ours, params):
        torch.testing.assert_close(a, p.grad, rtol=1e-14, atol=0)


@settings(max_examples=50, deadline=None)
@given(scale=st.floats(1e-6, 1e6), max_norm=st.floats(1e-3, 1e3))
def test_clipping_never_grows_a_gradient_and_caps_the_norm(scale: float, max_norm: float) -> None:
    grads = [
        torch.tensor([1.0, -2.0], dtype=torch.float64) * scale,
        torch.tensor([0.5], dtype=torch.float64) * scale,
    ]
    clipped, norm = clip_by_global_norm(grads, max_norm)
    new_norm = torch.linalg.vector_norm(torch.cat(clipped))
    assert new_norm <= norm * (1 + 1e-12)
    assert new_norm <= max_norm * (1 + 1e-9)


def test_clipping_rejects_a_non_positive_max_norm() -> None:
    with pytest.raises(ValueError, match="max_norm"):
        clip_by_global_norm([torch.ones(2)], 0.0)


def test_loss_scaling_rescues_an_fp16_gradient_that_would_underflow() -> None:
    tiny = 1e-8  # below fp16's smallest subnormal (~6e-8)
    assert torch.tensor(tiny, dtype=torch.float16) == 0
    scaled = scale_loss(torch.tensor(tiny, dtype=torch.float32), 65536.0).half()
    (unscaled,), found_inf = unscale_gradients([scaled], 65536.0)
    assert not found_inf
    assert unscaled.item() == pytest.approx(tiny, rel=1e-3)


def test_unscale_flags_an_overflowed_gradient() -> None:
    _, found_inf = unscale_gradients([torch.tensor([1.0]), torch.tensor([float("inf")])], 2.0)
    assert bool(found_inf)


def test_next_loss_scale_follows_gradscaler_update() -> None:
    pattern = [False] * 5 + [True] + [False] * 7 + [True, True] + [False] * 4
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    param = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([param], lr=0.0)
    scale, tracker = 1024.0, 0
    for overflow in pattern:
        opt.zero_grad()
        scaler.scale(param.sum() * (float("inf") if overflow else 1.0)).backward()
        scaler.step(opt)
        scaler.update()
        scale, tracker = next_loss_scale(scale, tracker, overflow, growth_interval=3)
        assert scaler.get_scale() == scale


@settings(max_examples=60, deadline=None)
@given(warmup=st.integers(0, 50), extra=st.integers(1, 500), step=st.integers(0, 1000))
def test_warmup_cosine_stays_between_min_and_max_and_holds_min_past_the_end(
    warmup: int, extra: int, step: int
) -> None:
    total = warmup + extra
    lr = warmup_cosine_lr(step, max_lr=1.0, warmup_steps=warmup, total_steps=total, min_lr=0.1)
    if step < warmup:
        assert lr == pytest.approx(step / warmup)
    else:
        assert 0.1 - 1e-12 <= lr <= 1.0 + 1e-12
    if step >= total:
        assert lr == pytest.approx(0.1)


def test_warmup_cosine_is_monotone_after_warmup() -> None:
    lrs = [
        warmup_cosine_lr(t, max_lr=3e-4, warmup_steps=10, total_steps=100, min_lr=3e-5)
        for t in range(10, 200)
    ]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert lrs[0] == 3e-4 and lrs[-1] == pytest.approx(3e-5)


def test_warmup_cosine_rejects_bad_arguments_naming_the_field() -> None:
    with pytest.raises(ValueError, match="warmup_steps"):
        warmup_cosine_lr(0, max_lr=1.0, warmup_steps=-1, total_steps=10)
    with pytest.raises(ValueError, match="total_steps"):
        warmup_cosine_lr(0, max_lr=1.0, warmup_steps=10, total_steps=10)


def test_step_size_factor_tends_to_one() -> None:
    assert adam_step_size_factor(1) == pytest.approx(0.1 / math.sqrt(0.001))
    assert adam_step_size_factor(100_000) == pytest.approx(1.0, abs=1e-12)


def test_nesterov_without_momentum_is_rejected() -> None:
    with pytest.raises(ValueError, match="nesterov"):
        sgd_update(torch.ones(1), torch.ones(1), SGDState(), lr=0.1, nesterov=True)
