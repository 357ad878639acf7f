"""Tests of trainopt.stability.scaling.scaler: step-for-step agreement with torch.amp.GradScaler,
hysteresis, sync-free skipping, state round trips, and the seed's defects."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from optimizer_configs import HELD, ids

from trainopt.stability.scaling.kernels import update_scale_with_hysteresis_
from trainopt.stability.scaling.scaler import DynamicLossScaler
from trainopt.stability.syncs import HostSyncCounter


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


OPTIMIZERS = {
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
    "sgd-fused": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, fused=True),
}


def train_step(model, opt, scaler, x, y, inject: str | None, clip: bool) -> None:
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    if inject is not None:
        model[0].weight.grad[0, 0] = math.inf if inject == "inf" else math.nan
    if clip:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()


def assert_same(model_a, opt_a, model_b, opt_b) -> None:
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.equal(a, b)
    state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        for name in state_a[key]:
            assert torch.equal(
                torch.as_tensor(state_a[key][name]), torch.as_tensor(state_b[key][name])
            ), name


@pytest.mark.parametrize("config", HELD, ids=ids(HELD))
@pytest.mark.parametrize("skip_mode", ["sync", "mask"])
@pytest.mark.parametrize("init_scale", [2.0**16, 1e38])
def test_matches_grad_scaler_step_for_step(config, skip_mode, init_scale):
    """Same scale and bit-identical parameters and optimizer state after every step, for every
    optimizer configuration (overflows from step 3 on: GradScaler's fused path is right there)."""
    g = torch.Generator().manual_seed(0)
    inject = {3: "inf", 4: "nan", 9: "inf", 17: "nan", 18: "inf", 19: "inf"}
    model_a, model_b = config.model(), config.model()
    opt_a, opt_b = config.build(model_a.parameters()), config.build(model_b.parameters())
    ours = DynamicLossScaler(init_scale=init_scale, growth_interval=3, skip_mode=skip_mode)
    theirs = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=3)
    for step in range(24):
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        clip = step % 4 == 1
        for model, opt, scaler in ((model_a, opt_a, ours), (model_b, opt_b, theirs)):
            opt.zero_grad(set_to_none=True)
            scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
            if inject.get(step):
                next(model.parameters()).grad.view(-1)[0] = (
                    math.inf if inject[step] == "inf" else math.nan
                )
            if clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        assert ours.get_scale() == theirs.get_scale(), step
        assert_same(model_a, opt_a, model_b, opt_b)
        assert all(torch.isfinite(p).all() for p in model_a.parameters())


def test_grad_scaler_state_dict_loads_both_ways():
    ours = DynamicLossScaler(init_scale=1024.0, growth_interval=5)
    theirs = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=7)
    ours.load_state_dict(theirs.state_dict())
    assert ours.get_scale() == 8.0 and ours.get_growth_interval() == 7
    theirs2 = torch.amp.GradScaler("cpu")
    theirs2.load_state_dict(DynamicLossScaler(init_scale=32.0, growth_interval=3).state_dict())
    assert theirs2.get_scale() == 32.0 and theirs2.get_growth_interval() == 3


def test_state_dict_round_trip_mid_run_continues_identically():
    g = torch.Generator().manual_seed(1)
    model = make_model()
    opt = OPTIMIZERS["adamw"](model.parameters())
    scaler = DynamicLossScaler(init_scale=2.0**20, growth_interval=2, hysteresis=2)
    data = [(torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)) for _ in range(20)]
    inject = {2: "inf", 7: "inf", 8: "inf", 13: "nan"}
    for step in range(6):
        train_step(model, opt, scaler, *data[step], inject.get(step), False)
    buf = io.BytesIO()
    torch.save(scaler.state_dict(), buf)
    buf.seek(0)
    restored = DynamicLossScaler()
    restored.load_state_dict(torch.load(buf, weights_only=True))
    model2 = copy.deepcopy(model)
    opt2 = OPTIMIZERS["adamw"](model2.parameters())
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict may share tensors
    for step in range(6, 20):
        train_step(model, opt, scaler, *data[step], inject.get(step), False)
        train_step(model2, opt2, restored, *data[step], inject.get(step), False)
        assert scaler.state_dict() == restored.state_dict()
        assert_same(model, opt, model2, opt2)


# --------------------------------------------------------------------------- the rule


def reference_rule(found, init, growth, backoff, interval, hysteresis):
    """Plain-Python version of the documented update rule; returns the scale after each step."""
    scale, clean, overflows, out = init, 0, 0, []
    for f in found:
        if f:
            overflows += 1
            clean = 0
            if overflows >= hysteresis:
                scale *= backoff
        else:
            overflows = 0
            clean += 1
            if clean >= interval:
                if math.isfinite(scale * growth):
                    scale *= growth
                clean = 0
        out.append(scale)
    return out


def drive(scaler: DynamicLossScaler, found: list[bool]) -> list[float]:
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.0)
    out = []
    for f in found:
        opt.zero_grad()
        scaler.scale(w.sum()).backward()
        if f:
            w.grad.fill_(math.inf)
        scaler.step(opt)
        scaler.update()
        out.append(scaler.get_scale())
    return out


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), max_size=30), st.integers(1, 4), st.integers(1, 4))
def test_update_follows_documented_rule(found, interval, hysteresis):
    scaler = DynamicLossScaler(init_scale=2.0**10, growth_interval=interval, hysteresis=hysteresis)
    assert drive(scaler, found) == reference_rule(found, 2.0**10, 2.0, 0.5, interval, hysteresis)
    assert int(scaler.skipped_steps) == sum(found)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.booleans(), max_size=30), st.integers(1, 4))
def test_hysteresis_code_path_with_one_equals_torch_kernel(found, interval):
    """The hand-written update (used for hysteresis > 1) reduces to torch's at hysteresis 1."""
    a = torch.tensor(2.0**120), torch.zeros((), dtype=torch.int32)
    b = (
        torch.tensor(2.0**120),
        torch.zeros((), dtype=torch.int32),
        torch.zeros((), dtype=torch.int32),
    )
    for f in found:
        found_inf = torch.tensor(float(f))
        torch._amp_update_scale_(a[0], a[1], found_inf, 2.0**4, 0.5, interval)
        update_scale_with_hysteresis_(*b, found_inf, 2.0**4, 0.5, interval, 1)
        assert torch.equal(b[0], a[0]) and torch.equal(b[1], a[1])


def test_hysteresis_two_needs_two_overflows_in_a_row():
    scaler = DynamicLossScaler(init_scale=1024.0, growth_interval=100, hysteresis=2)
    assert drive(scaler, [True]) == [1024.0]  # one overflow: skipped, not backed off
    assert drive(scaler, [False, True]) == [1024.0, 1024.0]  # a clean step in between resets
    assert drive(scaler, [True, True]) == [512.0, 256.0]  # armed: each further overflow backs off


def test_seed_defect_scale_does_not_grow_on_every_clean_step():
    scaler = DynamicLossScaler(init_scale=2.0**16)  # growth_interval 2000
    assert drive(scaler, [False] * 50) == [2.0**16] * 50


def test_seed_defect_one_overflow_backs_off_by_default():
    scaler = DynamicLossScaler(init_scale=2.0**16)
    assert drive(scaler, [True]) == [2.0**15]


def test_scale_grows_after_growth_interval_clean_steps():
    scaler = DynamicLossScaler(init_scale=4.0, growth_interval=3)
    assert drive(scaler, [False] * 6) == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0]


# --------------------------------------------------------------------------- skipping


def test_the_scaler_adds_no_sync_to_momentum_sgd():
    model = make_model()
    opt = OPTIMIZERS["sgd-momentum"](model.parameters())
    scaler = DynamicLossScaler(growth_interval=3, skip_mode="mask")
    x, y = torch.randn(4, 6), torch.randn(4, 2)
    train_step(model, opt, scaler, x, y, None, False)
    with HostSyncCounter() as mode:
        for step in range(10):
            train_step(model, opt, scaler, x, y, "inf" if step == 5 else None, step % 2 == 0)
    assert mode.count == 0 and int(scaler.skipped_steps) == 1


@pytest.mark.parametrize("name", [name for name in OPTIMIZERS if not name.endswith("-fused")])
def test_sync_mode_with_a_non_fused_optimizer_syncs_like_grad_scaler(name: str):
    """Documented: the default path reads found_inf on the host once per step, as GradScaler
    does."""
    x, y = torch.randn(4, 6), torch.randn(4, 2)
    counts = []
    for scaler in (DynamicLossScaler(), torch.amp.GradScaler("cpu")):
        model = make_model()
        opt = OPTIMIZERS[name](model.parameters())
        train_step(model, opt, scaler, x, y, None, False)  # the first step creates the state
        with HostSyncCounter() as mode:
            train_step(model, opt, scaler, x, y, None, False)
        counts.append(mode.count)
    with HostSyncCounter() as mode:  # the optimizer's own syncs (AdamW reads its step count)
        opt.step()
    assert counts[0] == counts[1] == mode.count + 1, (counts, mode.count)


# --------------------------------------------------------------------------- interface details


def test_disabled_scaler_is_a_pass_through():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = DynamicLossScaler(enabled=False)
    loss = model(torch.ones(2, 6)).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    before = model[0].weight.detach().clone()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(before, model[0].weight)
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {} and not scaler.is_enabled()


def test_scale_handles_nested_outputs():
    scaler = DynamicLossScaler(init_scale=4.0)
    out = scaler.scale([torch.ones(1), (torch.full((1,), 2.0),)])
    assert torch.equal(out[0], torch.tensor([4.0])) and torch.equal(out[1][0], torch.tensor([8.0]))


def test_misuse_raises_clear_errors():
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = DynamicLossScaler()
    with pytest.raises(RuntimeError, match="scale the loss first"):
        scaler.unscale_(opt)
    scaler.scale(w.sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already"):
        scaler.step(opt)
    scaler.update()
    with pytest.raises(RuntimeError, match="without step"):
        scaler.update()


def test_fp16_gradients_are_refused_like_grad_scaler():
    w = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = DynamicLossScaler()
    scaler.scale(w.float().sum()).backward()
    with pytest.raises(ValueError, match="FP16"):
        scaler.unscale_(opt)


def test_update_with_new_scale_sets_it():
    w = torch.nn.Parameter(torch.ones(1))
    scaler = DynamicLossScaler()
    scaler.scale(w.sum())
    scaler.update(128.0)
    assert scaler.get_scale() == 128.0
    scaler.update(torch.tensor(64.0))
    assert scaler.get_scale() == 64.0


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"init_scale": 0.0}, "init_scale"),
        ({"growth_factor": 1.0}, "growth_factor"),
        ({"backoff_factor": 1.0}, "backoff_factor"),
        ({"growth_interval": 0}, "growth_interval"),
        ({"hysteresis": 0}, "hysteresis"),
        ({"skip_mode": "maybe"}, "skip_mode"),
    ],
)
def test_bad_arguments_raise_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DynamicLossScaler(**kwargs)


# ---------------------------------------------------------------------- CUDA (run by make test-gpu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["fused", "capturable-mask"])
def test_cuda_fp16_matches_grad_scaler_and_never_syncs(kind):
    """fp16 autocast on CUDA: same scale and bit-identical weights as torch.amp.GradScaler, and
    torch.cuda.set_sync_debug_mode("error") sees no sync in the scaler's steady state."""
    device = "cuda"
    if kind == "fused":
        make_opt = lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)  # noqa: E731
        ours = DynamicLossScaler(growth_interval=3)
    else:
        make_opt = lambda ps: torch.optim.AdamW(ps, lr=1e-3, capturable=True)  # noqa: E731
        ours = DynamicLossScaler(growth_interval=3, skip_mode="mask")
    theirs = torch.amp.GradScaler("cuda", growth_interval=3)
    model_a = make_model().to(device)
    model_b = copy.deepcopy(model_a)
    opt_a, opt_b = make_opt(model_a.parameters()), make_opt(model_b.parameters())
    g = torch.Generator(device).manual_seed(0)

    def step(model, opt, scaler, x, y, inject):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        if inject:
            model[0].weight.grad.view(-1)[:1].fill_(math.inf)
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()

    for i in range(12):
        x, y = (
            torch.randn(16, 6, device=device, generator=g),
            torch.randn(16, 2, device=device, generator=g),
        )
        if i == 0:
            step(model_a, opt_a, ours, x, y, False)  # lazy set-up happens here
        else:
            torch.cuda.set_sync_debug_mode("error")
            try:
                step(model_a, opt_a, ours, x, y, i in (4, 5))
            finally:
                torch.cuda.set_sync_debug_mode("default")
        step(model_b, opt_b, theirs, x, y, i in (4, 5))
        assert ours.get_scale() == theirs.get_scale(), i
        for a, b in zip(model_a.parameters(), model_b.parameters()):
            assert torch.equal(a, b)
    assert int(ours.skipped_steps) == 2
