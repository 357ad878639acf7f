"""Tests of trainopt.stability.clipping.norms: agreement with torch, the adaptive rules, AGC, no
host sync."""

from __future__ import annotations

import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.stability.clipping.norms import (
    AdaptiveGradientClipper,
    ZScoreClipper,
    clip_gradients,
    total_grad_norm,
)
from trainopt.stability.clipping.unitwise import adaptive_clip_grad_
from trainopt.stability.syncs import HostSyncCounter


def make_params(seed: int = 0, scale: float = 1.0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2, 2), (1,)]
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=g))
        p.grad = torch.randn(shape, generator=g) * scale
        params.append(p)
    return params


def clone_params(params):
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = None if p.grad is None else p.grad.clone()
        out.append(q)
    return out


def set_norm(w: torch.nn.Parameter, value: float) -> None:
    w.grad = torch.tensor([value])


# --------------------------------------------------------------------------- clip_gradients


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
@pytest.mark.parametrize("max_norm", [0.1, 1.0, 100.0])
def test_clip_gradients_forwards_to_clip_grad_norm_with_its_arguments(norm_type, max_norm):
    """Forwarding only: clip_gradients calls clip_grad_norm_, so this agrees by construction.
    The hand-computed cases in test_clipping_by_hand.py are the ones that check the clipping."""
    ours, theirs = make_params(), make_params()
    n1 = clip_gradients(ours, max_norm=max_norm, norm_type=norm_type)
    n2 = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type)
    assert torch.equal(n1, n2)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad, b.grad)


def test_clip_gradients_returns_pre_clip_norm_and_clips_to_max_norm():
    params = make_params(scale=10.0)
    expected = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in params]))
    norm = clip_gradients(params, max_norm=1.0)
    assert torch.allclose(norm, expected)
    assert torch.allclose(total_grad_norm(params), torch.tensor(1.0), atol=1e-5)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_clip_gradients_forwards_non_finite_gradients_as_clip_grad_norm_does(bad):
    ours, theirs = make_params(), make_params()
    for ps in (ours, theirs):
        ps[0].grad[0, 0] = bad if bad != -1.0 else math.inf
    n1 = clip_gradients(ours, max_norm=1.0)
    n2 = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert not torch.isfinite(n1)
    assert torch.equal(n1, n2) or (n1.isnan() and n2.isnan())
    for a, b in zip(ours, theirs):
        assert torch.equal(a.grad.isnan(), b.grad.isnan())
        assert torch.allclose(a.grad, b.grad, equal_nan=True)


def test_clip_gradients_error_if_nonfinite_raises():
    params = make_params()
    params[1].grad[0] = math.nan
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_gradients(params, error_if_nonfinite=True)


def test_clip_gradients_forwards_a_module_a_generator_or_a_tensor():
    model = torch.nn.Linear(3, 2)
    model(torch.ones(4, 3)).sum().backward()
    ref = torch.nn.utils.clip_grad_norm_(clone_params(model.parameters()), 0.5)
    assert torch.equal(clip_gradients(clone_params(model.parameters()), 0.5), ref)
    assert torch.equal(clip_gradients((p for p in clone_params(model.parameters())), 0.5), ref)
    assert torch.equal(clip_gradients(model, 0.5), ref)
    w = model.weight
    assert torch.equal(clip_gradients(w, 1e9), torch.linalg.vector_norm(w.grad))


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan])
def test_clip_gradients_rejects_bad_max_norm_naming_it(value):
    with pytest.raises(ValueError, match="max_norm"):
        clip_gradients(make_params(), max_norm=value)


def test_clip_gradients_rejects_non_tensor_items():
    with pytest.raises(TypeError, match="model_or_params"):
        clip_gradients([1.0, 2.0])


# --------------------------------------------------------------------------- running statistics


def reference_adaptive(norms, factor, beta, warmup, initial=math.inf):
    """Plain-Python version of AdaptiveGradientClipper's documented rule."""
    mean, count, out = 0.0, 0, []
    for x in norms:
        warm = count >= max(warmup, 1)
        tau = factor * mean if warm else initial
        out.append((tau, min(x, tau) if warm else x))
        if math.isfinite(x):
            obs = min(x, tau) if warm else x
            alpha = max(1.0 / (count + 1), 1 - beta)
            mean += alpha * (obs - mean)
            count += 1
    return out


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(0.01, 100.0), min_size=1, max_size=40),
    st.floats(1.1, 5.0),
    st.floats(0.0, 0.99),
    st.integers(0, 10),
)
def test_adaptive_clipper_follows_documented_rule(norms, factor, beta, warmup):
    clipper = AdaptiveGradientClipper(factor=factor, beta=beta, warmup_steps=warmup)
    w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    for x, (tau, _) in zip(norms, reference_adaptive(norms, factor, beta, warmup)):
        w.grad = torch.tensor([x], dtype=torch.float64)
        norm = clipper.clip([w])
        assert norm.item() == pytest.approx(x)
        assert clipper.threshold.item() == pytest.approx(tau, rel=1e-5)
        assert w.grad.item() == pytest.approx(min(x, tau * x / (x + 1e-6)), rel=1e-5)


def test_adaptive_clipper_spike_does_not_raise_threshold():
    clipper = AdaptiveGradientClipper(factor=2.0, beta=0.9, warmup_steps=5)
    w = torch.nn.Parameter(torch.zeros(1))
    for _ in range(10):
        set_norm(w, 1.0)
        clipper.clip([w])
    before = clipper._threshold().clone()
    set_norm(w, 1e6)
    clipper.clip([w])
    assert w.grad.item() == pytest.approx(2.0, rel=1e-5)
    # the clipped norm (2.0) entered the mean: threshold moved by at most (1-beta)*(factor-1)
    assert clipper._threshold().item() <= before.item() * (1 + 0.1 * 1.0) + 1e-6
    assert int(clipper.num_clipped) == 1


def test_adaptive_clipper_warmup_only_observes():
    clipper = AdaptiveGradientClipper(warmup_steps=5)
    w = torch.nn.Parameter(torch.zeros(1))
    for x in [1.0, 100.0, 1.0, 50.0, 3.0]:
        set_norm(w, x)
        clipper.clip([w])
        assert w.grad.item() == x
    assert clipper.mean.item() == pytest.approx(sum([1.0, 100.0, 1.0, 50.0, 3.0]) / 5)


@pytest.mark.parametrize("cls", [AdaptiveGradientClipper, ZScoreClipper])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_norm_never_enters_statistics(cls, bad):
    clipper = cls(warmup_steps=3)
    w = torch.nn.Parameter(torch.zeros(1))
    for x in [1.0, 2.0, 3.0, 2.0]:
        set_norm(w, x)
        clipper([w])
    state = clipper.state_dict()
    set_norm(w, bad)
    norm = clipper([w])
    assert not torch.isfinite(norm)
    for key in ("mean", "var", "count"):
        assert torch.equal(clipper.state_dict()[key], state[key]), key
    assert torch.isfinite(clipper.mean) and torch.isfinite(clipper.var)


def reference_zscore(norms, z, beta, warmup, eps):
    mean = var = 0.0
    count, out = 0, []
    for x in norms:
        std = max(math.sqrt(max(var, 0.0)), eps * abs(mean))
        tau = mean + z * std if count >= max(warmup, 2) else math.inf
        out.append(tau)
        if math.isfinite(x):
            obs = min(x, tau)
            alpha = max(1.0 / (count + 1), 1 - beta)
            delta = obs - mean
            mean += alpha * delta
            var = (1 - alpha) * (var + alpha * delta * delta)
            count += 1
    return out


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.one_of(st.floats(0.01, 100.0), st.just(math.nan), st.just(math.inf)),
        min_size=1,
        max_size=40,
    ),
    st.floats(0.5, 4.0),
    st.floats(0.0, 0.99),
    st.integers(0, 10),
)
def test_zscore_clipper_follows_documented_rule(norms, z, beta, warmup):
    clipper = ZScoreClipper(z_threshold=z, beta=beta, warmup_steps=warmup)
    w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    for x, tau in zip(norms, reference_zscore(norms, z, beta, warmup, 1e-3)):
        w.grad = torch.tensor([x], dtype=torch.float64)
        clipper([w])
        if math.isfinite(tau):
            assert clipper.threshold.item() == pytest.approx(tau, rel=1e-4, abs=1e-6)
        else:
            assert math.isinf(clipper.threshold.item())
        if math.isfinite(x):
            assert w.grad.item() == pytest.approx(min(x, tau * x / (x + 1e-6)), rel=1e-4)


def test_zscore_clipper_clips_only_outliers_after_warmup():
    clipper = ZScoreClipper(z_threshold=3.0, warmup_steps=10)
    w = torch.nn.Parameter(torch.zeros(1))
    g = torch.Generator().manual_seed(0)
    set_norm(w, 1000.0)  # an outlier during warm-up is not clipped
    clipper([w])
    assert w.grad.item() == 1000.0
    clipper = ZScoreClipper(z_threshold=3.0, warmup_steps=10)
    for _ in range(50):
        set_norm(w, 1.0 + 0.1 * torch.randn((), generator=g).item())
        clipper([w])
    clipped_normal = int(clipper.num_clipped)
    set_norm(w, 10.0)
    clipper([w])
    assert bool(clipper.last_clipped)
    assert w.grad.item() < 2.0
    assert clipped_normal <= 2
    assert clipper.z_score(torch.tensor(10.0)).item() > 3.0


@pytest.mark.parametrize("cls", [AdaptiveGradientClipper, ZScoreClipper])
def test_state_dict_round_trip_continues_identically(cls):
    g = torch.Generator().manual_seed(1)
    norms = (torch.rand(60, generator=g) * 3 + 1).tolist()
    norms[40] = 500.0
    a = cls(warmup_steps=5)
    w = torch.nn.Parameter(torch.zeros(1))
    for x in norms[:30]:
        set_norm(w, x)
        a([w])
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    b = cls()
    b.load_state_dict(torch.load(buf, weights_only=True))
    for x in norms[30:]:
        set_norm(w, x)
        ga = a([w]), w.grad.clone()
        set_norm(w, x)
        gb = b([w]), w.grad.clone()
        assert torch.equal(ga[1], gb[1])
        assert torch.equal(a.threshold, b.threshold)


def test_load_state_dict_rejects_incomplete_state():
    with pytest.raises(KeyError, match="missing"):
        ZScoreClipper().load_state_dict({"mean": torch.zeros(())})


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: AdaptiveGradientClipper(factor=1.0), "factor"),
        (lambda: AdaptiveGradientClipper(beta=1.0), "beta"),
        (lambda: AdaptiveGradientClipper(warmup_steps=-1), "warmup_steps"),
        (lambda: ZScoreClipper(z_threshold=0.0), "z_threshold"),
        (lambda: ZScoreClipper(eps=-1.0), "eps"),
        (lambda: adaptive_clip_grad_(make_params(), clip_factor=0.0), "clip_factor"),
    ],
)
def test_bad_arguments_raise_naming_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


# --------------------------------------------------------------------------- AGC


def agc_reference(params, clip_factor, eps):
    """Per-unit loop, written directly from Brock et al. (2021)."""
    for p in params:
        g, w = p.grad, p.detach()
        if w.ndim <= 1:
            units = [(slice(None),)]
        else:
            units = [(i,) for i in range(w.shape[0])]
        for u in units:
            wn = w[u].norm().clamp_min(eps).item()
            gn = g[u].norm().item()
            max_norm = clip_factor * wn
            if gn > max_norm:
                g[u] = g[u] * (max_norm / max(gn, 1e-6))


@pytest.mark.parametrize("clip_factor", [0.01, 0.1, 1.0])
def test_agc_matches_per_unit_loop(clip_factor):
    ours = make_params(seed=3, scale=0.3)
    ours[1].data.zero_()  # a zero bias: eps keeps it trainable
    ref = clone_params(ours)
    adaptive_clip_grad_(ours, clip_factor=clip_factor)
    agc_reference(ref, clip_factor, 1e-3)
    for a, b in zip(ours, ref):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-8)


def test_agc_leaves_small_gradients_untouched_and_bounds_large_ones():
    model = torch.nn.Conv2d(3, 4, 3)
    model.weight.grad = torch.full_like(model.weight, 1e-9)
    model.bias.grad = torch.full_like(model.bias, 100.0)
    before = model.weight.grad.clone()
    adaptive_clip_grad_(model, clip_factor=0.01)
    assert torch.equal(model.weight.grad, before)
    allowed = 0.01 * max(model.bias.detach().norm().item(), 1e-3)
    assert model.bias.grad.norm().item() == pytest.approx(allowed, rel=1e-5)


def test_agc_skips_parameters_without_grad():
    p = torch.nn.Parameter(torch.ones(3))
    adaptive_clip_grad_([p])
    assert p.grad is None


# --------------------------------------------------------------------------- no host sync


def test_clipping_makes_no_host_sync():
    params = make_params(scale=5.0)
    adaptive, zscore = AdaptiveGradientClipper(warmup_steps=2), ZScoreClipper(warmup_steps=2)
    adaptive(params), zscore(params)  # lazy set-up outside the counted region
    with HostSyncCounter() as mode:
        for _ in range(10):
            clip_gradients(params, 1.0)
            adaptive(params)
            zscore.clip(params, total_norm=total_grad_norm(params))
            adaptive_clip_grad_(params)
    assert mode.count == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_clipping_never_syncs_on_cuda():
    params = [p.cuda().detach().requires_grad_() for p in make_params()]
    for p, q in zip(params, make_params(scale=5.0)):
        p.grad = q.grad.cuda()
    adaptive, zscore = AdaptiveGradientClipper(warmup_steps=2), ZScoreClipper(warmup_steps=2)
    adaptive(params), zscore(params)  # state moves to the device on the first call
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            norm = clip_gradients(params, 1.0)
            adaptive(params)
            zscore.clip(params, total_norm=total_grad_norm(params))
            adaptive_clip_grad_(params)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert norm.device.type == "cuda" and adaptive.mean.device.type == "cuda"
