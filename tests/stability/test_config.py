"""The settings' groups: checked when built, one name per knob, old names warn and still work."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch

import trainopt.stability as stability
from trainopt.stability import (
    CheckpointManager,
    Detection,
    LossStabilityMonitor,
    Rollback,
    TrainingRecovery,
    TrainingStabilizer,
)
from trainopt.stability.config import RENAMED
from trainopt.stability.integrations import GuardedOptimizer
from trainopt.stability.monitoring.checker import StabilityChecker
from trainopt.stability.monitoring.loss import LossSpikeDetector

BAD = {
    "spike_factor": 0,
    "explosion_factor": math.inf,
    "window_size": 1,
    "min_history": 1,
    "skip_unstable": "yes",
    "save_every": 0,
    "keep_last": 0,
    "lr_factor": 1.5,
    "max_rollbacks": 0,
    "patience": 0,
    "skip_batches": -1,
}
GOOD = {
    "spike_factor": 3.0,
    "explosion_factor": 5.0,
    "window_size": 50,
    "min_history": 10,
    "skip_unstable": False,
    "save_every": 7,
    "keep_last": 2,
    "lr_factor": 0.25,
    "max_rollbacks": 2,
    "patience": 4,
    "skip_batches": 3,
}


def _group(name: str) -> type:
    return Detection if name in {f.name for f in dataclasses.fields(Detection)} else Rollback


def _built(front, name: str):
    """Where the knob ended up in the objects a front door built."""
    core = front.core
    where = {
        "spike_factor": lambda: core.checker.loss_monitor.detector.spike_factor,
        "explosion_factor": lambda: core.checker.gradient_monitor.explosion_factor,
        "window_size": lambda: core.checker.loss_monitor.detector.window_size,
        "min_history": lambda: core.checker.min_history,
        "skip_unstable": lambda: core.skip_unstable,
        "save_every": lambda: core.recovery.checkpoint_manager.save_every,
        "keep_last": lambda: core.recovery.checkpoint_manager.keep_last,
        "lr_factor": lambda: core.recovery.lr_factor,
        "max_rollbacks": lambda: core.recovery.max_rollbacks,
        "patience": lambda: core.recovery.patience,
        "skip_batches": lambda: core.recovery.skip_batches,
    }
    return where[name]()


def _door(kind: str, tmp_path, **kwargs):
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if kind == "stabilizer":
        return TrainingStabilizer(model, opt, checkpoint_dir=tmp_path, check_every=5, **kwargs)
    return GuardedOptimizer(opt, model=model, checkpoint_dir=tmp_path, check_every=5, **kwargs)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_setting_is_refused_naming_its_group_and_field(name: str) -> None:
    group = _group(name)
    with pytest.raises(ValueError, match=rf"^{group.__name__}\.{name} must be .*, got {name}="):
        group(**{name: BAD[name]})


def test_min_history_above_the_window_is_refused() -> None:
    with pytest.raises(ValueError, match="Detection.min_history must be <= window_size"):
        Detection(window_size=10, min_history=20)


@pytest.mark.parametrize("kind", ["stabilizer", "guard"])
@pytest.mark.parametrize("name", sorted(GOOD))
def test_each_knob_of_a_group_reaches_what_it_sets_through_both_doors(kind, name, tmp_path) -> None:
    group = _group(name)
    front = _door(kind, tmp_path, **{group.__name__.lower(): group(**{name: GOOD[name]})})
    assert _built(front, name) == GOOD[name]


@pytest.mark.parametrize("kind", ["stabilizer", "guard"])
@pytest.mark.parametrize("name", sorted(GOOD))
def test_a_flat_keyword_warns_and_still_works(kind, name, tmp_path) -> None:
    group = _group(name).__name__
    with pytest.warns(
        DeprecationWarning,
        match=rf"\({name}=\.\.\.\) is deprecated: say "
        rf"{group.lower()}={group}\({name}=\.\.\.\)",
    ):
        front = _door(kind, tmp_path, **{name: GOOD[name]})
    assert _built(front, name) == GOOD[name]


def test_a_flat_keyword_and_its_group_together_are_refused(tmp_path) -> None:
    with pytest.raises(TypeError, match="both detection= and spike_factor="):
        _door("stabilizer", tmp_path, detection=Detection(), spike_factor=3.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'spike_threshold'"):
        _door("guard", tmp_path, spike_threshold=3.0)
    with pytest.raises(TypeError, match="must be a Detection"):
        _door("guard", tmp_path, detection={"spike_factor": 3.0})


@pytest.mark.parametrize(
    "build, old, new, read",
    [
        (
            lambda **k: TrainingRecovery(torch.nn.Linear(1, 1), None, None, **k),
            "max_recovery_attempts",
            "max_rollbacks",
            lambda r: r.max_rollbacks,
        ),
        (
            lambda **k: CheckpointManager(k.pop("folder"), **k),
            "save_frequency",
            "save_every",
            lambda m: m.save_every,
        ),
        (lambda **k: LossSpikeDetector(**k), "threshold", "spike_factor", lambda d: d.spike_factor),
        (
            lambda **k: LossStabilityMonitor(**k),
            "threshold",
            "spike_factor",
            lambda m: m.detector.spike_factor,
        ),
    ],
)
def test_a_second_name_warns_works_and_clashes_with_the_first(
    build, old, new, read, tmp_path
) -> None:
    extra = {"folder": tmp_path} if old == "save_frequency" else {}
    with pytest.warns(DeprecationWarning, match=rf"\({old}=\.\.\.\) is deprecated: say {new}="):
        built = build(**{old: 2}, **extra)
    assert read(built) == 2
    with pytest.raises(TypeError, match=rf"both {old}= and {new}="):
        build(**{old: 2, new: 5}, **extra)


def test_one_name_per_knob_in_every_public_constructor() -> None:
    """No public class takes a second name of a knob except as a deprecated keyword (default
    None)."""
    for name in stability.__all__:
        obj = getattr(stability, name)
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        for param in inspect.signature(obj).parameters.values():
            if param.name in RENAMED:
                assert param.kind is param.KEYWORD_ONLY and param.default is None, (
                    name,
                    param.name,
                )
    knobs = {f.name for group in (Detection, Rollback) for f in dataclasses.fields(group)}
    for door in (TrainingStabilizer, GuardedOptimizer):
        assert knobs.isdisjoint(inspect.signature(door).parameters), door.__name__


@pytest.mark.parametrize("kind", ["stabilizer", "guard"])
def test_the_old_check_and_total_skipped_warn_and_agree_with_the_new_names(kind, tmp_path) -> None:
    front = _door(kind, tmp_path)
    with pytest.warns(DeprecationWarning, match=r"check\(\) is deprecated: say end_window\(\)"):
        report = front.check()
    assert report["step"] == front.end_window()["step"] == 0
    with pytest.warns(DeprecationWarning, match="total_skipped is deprecated: say skipped_steps"):
        assert front.total_skipped == front.skipped_steps == 0


def test_states_written_by_trainopt_0_4_still_load() -> None:
    """The checker's gradient reference, the detector's ``threshold`` and ``total_skipped``."""
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    front = TrainingStabilizer(model, opt, check_every=5)
    state = front.state_dict()
    checker = dict(state["checker"])
    for key in (
        "grad_reference",
        "last_window_max_grad",
        "grad_growth",
        "recent_grads",
        "first_grads",
    ):
        checker.pop(key)
    detector = dict(checker["loss_monitor"]["detector"])
    detector["threshold"] = detector.pop("spike_factor")
    checker["loss_monitor"] = {**checker["loss_monitor"], "detector": detector}
    old = {**state, "checker": checker, "total_skipped": 2}
    old.pop("skipped_steps")
    again = TrainingStabilizer(model, opt, check_every=5)
    again.load_state_dict(old)
    assert again.skipped_steps == 2
    assert (
        math.isnan(again.checker.grad_reference) and torch.isnan(again.checker.recent_grads).all()
    )
    fresh = StabilityChecker(opt, check_every=5)
    assert again.checker.grad_growth == fresh.grad_growth
    assert again.checker.loss_monitor.detector.spike_factor == 4.0
