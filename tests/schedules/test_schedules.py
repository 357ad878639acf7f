"""Tests of trainopt.schedules: cross-checks against torch.optim.lr_scheduler, unit tests, registry.

Cross-checks step both schedulers through every step of sampled configurations and compare
the rates within 1e-12 relative. Torch's ``LinearLR`` can't start at 0 (``start_factor`` must be
> 0), so the warm-up reference starts at ``start_factor=1e-300``: at step 0 ours is exactly 0
and torch's is ``1e-300 * base``, which the absolute part of the tolerance (1e-290) absorbs.
The recursive (chainable) forms of ``LinearLR``, ``CosineAnnealingLR`` and ``PolynomialLR``
drift by rounding at each step; measured against the closed forms here, the largest relative
difference is ~2e-15 at 800 steps and ~4e-14 at 20,000 steps, well within 1e-12, so no test
needs torch's closed form instead.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.optim import lr_scheduler as L

from trainopt.schedules.adapters import (
    cosine_annealing_schedule,
    linear_warmup_decay_schedule,
    step_decay_schedule,
    wsd_schedule,
)
from trainopt.schedules.adaptive import AdaptiveLearningRate
from trainopt.schedules.cyclical import CyclicalLearningRate
from trainopt.schedules.debug import debug_lr_schedule
from trainopt.schedules.registry import (
    PolynomialDecaySchedule,
    SchedulerInterface,
    build_scheduler,
    register_scheduler,
    registered_schedulers,
)

REL = 1e-12
TINY = 1e-300  # torch's smallest usable LinearLR start_factor stands in for 0


def close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b)) + 1e-290


def optimizer(lrs=(1e-3,)) -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.zeros(1, dtype=torch.float64)) for _ in lrs]
    return torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)])


def trace(make, steps: int, lrs=(1e-3,)) -> list[list[float]]:
    """Rates of every group at each step 0..steps-1, stepping as a training loop does."""
    opt = optimizer(lrs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SequentialLR's epoch deprecation notices
        sched = make(opt)
        rows = []
        for _ in range(steps):
            rows.append([float(x) for x in sched.get_last_lr()])
            opt.step()
            sched.step()
    return rows


def assert_traces_match(ours, theirs) -> None:
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        for x, y in zip(a, b):
            assert close(x, y), f"step {step}: ours {x!r} vs torch {y!r}"


def torch_warmup_then(opt, warmup_steps: int, after: L.LRScheduler) -> L.LRScheduler:
    if warmup_steps == 0:
        return after
    warm = L.LinearLR(opt, start_factor=TINY, end_factor=1.0, total_iters=warmup_steps)
    return L.SequentialLR(opt, [warm, after], milestones=[warmup_steps])


runs = st.integers(2, 800).flatmap(
    lambda total: st.tuples(st.just(total), st.integers(0, total - 1))
)
group_lrs = st.lists(st.floats(1e-5, 1.0), min_size=1, max_size=3).map(tuple)


# --- cross-checks against torch.optim.lr_scheduler ---------------------------------------------


@settings(max_examples=25, deadline=None, derandomize=True)
@given(run=runs, lrs=group_lrs)
def test_linear_warmup_decay_matches_torch_linear_lr(run, lrs):
    total, warmup = run
    ours = trace(lambda o: linear_warmup_decay_schedule(o, total, warmup), total + 1, lrs)
    theirs = trace(
        lambda o: torch_warmup_then(o, warmup, L.LinearLR(o, 1.0, 0.0, total_iters=total - warmup)),
        total + 1,
        lrs,
    )
    assert_traces_match(ours, theirs)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(run=runs, lrs=group_lrs, min_fraction=st.floats(0.0, 1.0))
def test_cosine_annealing_matches_torch_cosine_annealing_lr(run, lrs, min_fraction):
    total, warmup = run
    min_lr = min(lrs) * min_fraction
    ours = trace(lambda o: cosine_annealing_schedule(o, total, warmup, min_lr), total + 1, lrs)
    theirs = trace(
        lambda o: torch_warmup_then(
            o, warmup, L.CosineAnnealingLR(o, T_max=total - warmup, eta_min=min_lr)
        ),
        total + 1,
        lrs,
    )
    assert_traces_match(ours, theirs)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(decay_steps=st.integers(1, 50), rate=st.floats(0.01, 1.0), lrs=group_lrs)
def test_step_decay_matches_torch_step_lr(decay_steps, rate, lrs):
    steps = 6 * decay_steps
    ours = trace(lambda o: step_decay_schedule(o, decay_steps, rate), steps, lrs)
    theirs = trace(lambda o: L.StepLR(o, step_size=decay_steps, gamma=rate), steps, lrs)
    assert_traces_match(ours, theirs)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    total=st.integers(3, 600),
    data=st.data(),
    lrs=group_lrs,
    min_fraction=st.floats(0.0, 1.0),
    decay=st.sampled_from(["linear", "cosine"]),
)
def test_wsd_matches_torch_sequential_lr(total, data, lrs, min_fraction, decay):
    warmup = data.draw(st.integers(0, total - 2))
    decay_steps = data.draw(st.integers(1, total - warmup - 1))
    stable = total - decay_steps - warmup
    min_lr = min(lrs) * min_fraction

    def reference(o):
        decayer = (
            L.LinearLR(o, 1.0, 0.0, total_iters=decay_steps)
            if decay == "linear" and min_lr == 0.0
            else L.CosineAnnealingLR(o, T_max=decay_steps, eta_min=min_lr)
        )
        phases, milestones = [], []
        if warmup:
            phases.append(L.LinearLR(o, TINY, 1.0, total_iters=warmup))
            milestones.append(warmup)
        phases.append(L.ConstantLR(o, factor=1.0, total_iters=stable))
        milestones.append(warmup + stable)
        phases.append(decayer)
        return L.SequentialLR(o, phases, milestones=milestones)

    if decay == "linear" and min_lr != 0.0:
        decay = "cosine"  # LinearLR has no absolute floor; compare the cosine decay instead
    ours = trace(
        lambda o: wsd_schedule(o, total, warmup, decay_steps, min_lr, decay), total + 1, lrs
    )
    theirs = trace(reference, total + 1, lrs)
    assert_traces_match(ours, theirs)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    step_size=st.integers(1, 60),
    mode=st.sampled_from(["triangular", "triangular2", "exp_range"]),
    gamma=st.floats(0.9, 1.0),
    low=st.floats(1e-6, 1e-3),
    span=st.floats(1.0, 100.0),
)
def test_cyclical_matches_torch_cyclic_lr(step_size, mode, gamma, low, span):
    high = low * span
    steps = 7 * step_size
    ours = trace(
        lambda o: CyclicalLearningRate(o, low, high, step_size, mode, gamma), steps, (0.5, 0.1)
    )
    theirs = trace(
        lambda o: L.CyclicLR(
            o, low, high, step_size_up=step_size, mode=mode, gamma=gamma, cycle_momentum=False
        ),
        steps,
        (0.5, 0.1),
    )
    assert_traces_match(ours, theirs)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(total=st.integers(1, 500), power=st.floats(0.5, 4.0), lr=st.floats(1e-5, 1.0))
def test_polynomial_decay_matches_torch_polynomial_lr(total, power, lr):
    ours = trace(
        lambda o: PolynomialDecaySchedule(lr, total, power=power).as_lr_scheduler(o),
        total + 5,
        (lr,),
    )
    theirs = trace(lambda o: L.PolynomialLR(o, total_iters=total, power=power), total + 5, (lr,))
    assert_traces_match(ours, theirs)


# --- behaviour ---------------------------------------------------------------------------------


def test_cosine_warmup_starts_at_zero_and_peaks_at_warmup_steps():
    rows = trace(lambda o: cosine_annealing_schedule(o, 100, 10, 1e-5), 12, (1e-3,))
    assert rows[0][0] == 0.0 and rows[5][0] == pytest.approx(5e-4) and rows[10][0] == 1e-3


def test_cosine_reaches_min_lr_at_total_steps():
    rows = trace(lambda o: cosine_annealing_schedule(o, 100, 10, 1e-5), 101, (1e-3,))
    assert rows[100][0] == pytest.approx(1e-5, rel=1e-12)


def test_min_lr_is_absolute_for_every_param_group():
    rows = trace(lambda o: cosine_annealing_schedule(o, 50, 5, 1e-4), 60, (1e-2, 1e-3))
    assert rows[-1] == [pytest.approx(1e-4, rel=1e-12)] * 2


def test_min_lr_above_a_group_rate_is_rejected_naming_the_group():
    with pytest.raises(ValueError, match=r"min_lr.*param_groups\[1\]"):
        cosine_annealing_schedule(optimizer((1e-2, 1e-5)), 50, 5, min_lr=1e-4)


@pytest.mark.parametrize(
    "make",
    [
        lambda o: linear_warmup_decay_schedule(o, 40, 5),
        lambda o: cosine_annealing_schedule(o, 40, 5, 1e-5),
        lambda o: wsd_schedule(o, 40, 5, 10, 1e-5, "1-sqrt"),
        lambda o: PolynomialDecaySchedule(1e-3, 40, 5, 1e-5).as_lr_scheduler(o),
        lambda o: CyclicalLearningRate(o, 1e-4, 1e-3, 7, total_steps=40),
    ],
    ids=["linear", "cosine", "wsd", "polynomial", "cyclical"],
)
def test_every_schedule_holds_its_final_value_past_total_steps(make):
    rows = trace(make, 200, (1e-3,))
    assert all(row == rows[40] for row in rows[40:])


def test_wsd_one_minus_sqrt_decay_shape():
    rows = trace(lambda o: wsd_schedule(o, 20, 0, 16, 0.0, "1-sqrt"), 21, (1.0,))
    assert rows[4 + 4][0] == pytest.approx(1 - math.sqrt(4 / 16))
    assert rows[20][0] == 0.0


@pytest.mark.parametrize(
    ("call", "field", "allowed"),
    [
        (lambda o: cosine_annealing_schedule(o, 100, 100), "warmup_steps", "less than total_steps"),
        (lambda o: cosine_annealing_schedule(o, 100, -1), "warmup_steps", ">= 0"),
        (lambda o: linear_warmup_decay_schedule(o, 10.5, 1), "total_steps", "int >= 1"),
        (lambda o: step_decay_schedule(o, 0), "decay_steps", "int >= 1"),
        (lambda o: wsd_schedule(o, 100, 10, 20, decay="exp"), "decay", "linear.*cosine.*1-sqrt"),
        (lambda o: wsd_schedule(o, 100, 50, 60), "decay_steps", "must not exceed total_steps"),
        (
            lambda o: CyclicalLearningRate(o, mode="sine"),
            "mode",
            "triangular.*triangular2.*exp_range",
        ),
        (lambda o: CyclicalLearningRate(o, base_lr=1e-2, max_lr=1e-3), "base_lr", "max_lr"),
    ],
)
def test_bad_arguments_name_the_argument_and_allowed_values(call, field, allowed):
    with pytest.raises(ValueError, match=f"{field}.*{allowed}|{allowed}.*{field}"):
        call(optimizer())


def test_lambda_schedules_survive_a_state_dict_round_trip():
    opt = optimizer()
    sched = cosine_annealing_schedule(opt, 100, 10, 1e-5)
    for _ in range(37):
        opt.step()
        sched.step()
    state = sched.state_dict()
    fresh_opt = optimizer()
    fresh = cosine_annealing_schedule(fresh_opt, 100, 10, 1e-5)
    fresh.load_state_dict(state)
    opt.step()
    sched.step()
    fresh_opt.step()
    fresh.step()
    assert fresh.get_last_lr() == sched.get_last_lr()


def test_cyclical_state_dict_resumes_the_cycle():
    opt = optimizer()
    clr = CyclicalLearningRate(opt, 1e-4, 1e-3, 5, mode="triangular2")
    for _ in range(13):
        opt.step()
        clr.step()
    other = CyclicalLearningRate(optimizer(), 1e-4, 1e-3, 5, mode="triangular2")
    other.load_state_dict(clr.state_dict())
    clr.step()
    other.step()
    assert other.get_last_lr() == clr.get_last_lr()


# --- adaptive controller -------------------------------------------------------------------


def feed(ctl: AdaptiveLearningRate, losses) -> None:
    for loss in losses:
        ctl.update_lr(loss)


def test_adaptive_lowers_the_rate_while_the_loss_rises():
    opt = optimizer()
    ctl = AdaptiveLearningRate(opt, initial_lr=1e-3, min_lr=1e-6, window=4)
    feed(ctl, [1.0, 1.1, 1.2, 1.3])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.8e-3)


def test_adaptive_never_goes_below_min_lr_or_above_initial_lr():
    opt = optimizer()
    ctl = AdaptiveLearningRate(opt, initial_lr=1e-3, min_lr=1e-4, window=2)
    feed(ctl, [float(i) for i in range(200)])  # rising for 100 windows
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-4)
    feed(ctl, [float(-i) for i in range(400)])  # falling for 200 windows
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-3)


def test_adaptive_backs_off_on_a_nan_loss():
    opt = optimizer()
    ctl = AdaptiveLearningRate(opt, initial_lr=1e-3, window=3)
    feed(ctl, [1.0, float("nan"), 0.5])
    assert opt.param_groups[0]["lr"] < 1e-3


def test_adaptive_accepts_tensor_losses_without_a_host_read_between_decisions(monkeypatch):
    opt = optimizer()
    ctl = AdaptiveLearningRate(opt, initial_lr=1e-3, window=5)

    def no_sync(*args, **kwargs):
        raise AssertionError("host read of a tensor between decisions")

    monkeypatch.setattr(torch.Tensor, "item", no_sync)
    monkeypatch.setattr(torch.Tensor, "__float__", no_sync)
    monkeypatch.setattr(torch.Tensor, "__bool__", no_sync)
    for loss in [1.0, 1.1, 1.2, 1.3]:
        ctl.update_lr(torch.tensor(loss))
    monkeypatch.undo()
    ctl.update_lr(torch.tensor(1.4))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.8e-3)


def test_adaptive_state_dict_round_trip_restores_the_rate():
    opt = optimizer((1e-3, 1e-4))
    ctl = AdaptiveLearningRate(opt, initial_lr=1e-3, window=3)
    feed(ctl, [1.0, 2.0, 3.0, 4.0])
    other_opt = optimizer((1e-3, 1e-4))
    other = AdaptiveLearningRate(other_opt, initial_lr=1e-3, window=3)
    other.load_state_dict(ctl.state_dict())
    assert other.get_last_lr() == ctl.get_last_lr()
    feed(ctl, [5.0, 6.0])
    feed(other, [5.0, 6.0])
    assert other.get_last_lr() == ctl.get_last_lr()


# --- custom schedulers, registry, debug helper ----------------------------------------------


def test_scheduler_interface_sets_base_lr():
    class Constant(SchedulerInterface):
        def get_lr(self, step):
            return self.base_lr

    assert Constant(3e-4).get_lr(10) == 3e-4


def test_build_scheduler_builds_every_builtin_by_name():
    settings_by_name = {
        "linear_warmup_decay": {"total_steps": 100, "warmup_steps": 10},
        "cosine_annealing": {"total_steps": 100, "warmup_steps": 10, "min_lr": 1e-6},
        "step_decay": {"decay_steps": 10},
        "wsd": {"total_steps": 100, "warmup_steps": 10, "decay_steps": 20},
        "cyclical": {"base_lr": 1e-4, "max_lr": 1e-3, "step_size": 10},
    }
    assert set(settings_by_name) <= set(registered_schedulers())
    for name, settings_ in settings_by_name.items():
        sched = build_scheduler(optimizer(), {"type": name, **settings_})
        assert isinstance(sched, L.LRScheduler), name


def test_build_scheduler_builds_a_registered_custom_class():
    register_scheduler("polynomial", PolynomialDecaySchedule)
    opt = optimizer((1e-3,))
    sched = build_scheduler(opt, {"type": "polynomial", "total_steps": 10, "min_lr": 1e-5})
    lrs = debug_lr_schedule(sched, 12)
    assert lrs[0] == 1e-3 and lrs[10] == pytest.approx(1e-5) and lrs[11] == lrs[10]


def test_build_scheduler_rejects_unknown_type_naming_the_allowed_types():
    with pytest.raises(ValueError, match=r"type must be one of .*cosine_annealing"):
        build_scheduler(optimizer(), {"type": "cosine"})


def test_register_scheduler_refuses_to_replace_a_different_factory():
    with pytest.raises(ValueError, match="already registered"):
        register_scheduler("cosine_annealing", linear_warmup_decay_schedule)


def test_debug_helper_leaves_scheduler_and_optimizer_as_it_found_them():
    opt = optimizer()
    sched = cosine_annealing_schedule(opt, 20, 5)
    for _ in range(3):
        opt.step()
        sched.step()
    before = (sched.last_epoch, sched.get_last_lr(), opt.param_groups[0]["lr"])
    debug_lr_schedule(sched, 15)
    assert (sched.last_epoch, sched.get_last_lr(), opt.param_groups[0]["lr"]) == before


def test_triangular2_does_not_overflow_after_many_cycles():
    opt = optimizer()
    clr = CyclicalLearningRate(opt, 1e-4, 1e-3, step_size=1, mode="triangular2")
    clr.last_epoch = 5000  # 2,500 cycles: 2.0 ** 2499 overflows a float
    opt.step()
    clr.step()
    assert clr.get_last_lr()[0] == pytest.approx(1e-4)
