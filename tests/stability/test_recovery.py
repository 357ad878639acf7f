"""Tests of trainopt.stability.recovery.rollback: when to roll back, rollback, a rate cut the
scheduler keeps."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

from trainopt.schedules.adapters import cosine_annealing_schedule
from trainopt.stability.recovery.rates import scale_learning_rate
from trainopt.stability.recovery.rollback import TrainingInstabilityError, TrainingRecovery


def _model_and_optimizer(seed: int = 0, lr: float = 0.1):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=lr)


# -- the learning-rate cut survives the scheduler (seed defect) ----------------------------------


def test_seed_style_lr_halving_is_undone_by_the_next_scheduler_step() -> None:
    _, opt = _model_and_optimizer()
    sched = cosine_annealing_schedule(opt, total_steps=100, warmup_steps=0)
    for group in opt.param_groups:
        group["lr"] *= 0.5  # what the seed's recovery does
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(
        0.1 * sched.lr_lambdas[0](1)
    )  # the cut is gone


def test_scale_learning_rate_scales_tensor_learning_rates_in_place() -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.01), fused=True)
    lr = opt.param_groups[0]["lr"]
    scale_learning_rate(opt, 0.5)
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(0.005)


def test_scale_learning_rate_rejects_a_bad_factor() -> None:
    _, opt = _model_and_optimizer()
    with pytest.raises(ValueError, match="factor"):
        scale_learning_rate(opt, 0.0)


# -- the decision ------------------------------------------------------------------------------


def _recovery(**kwargs) -> TrainingRecovery:
    model, opt = _model_and_optimizer()
    return TrainingRecovery(model, opt, None, **kwargs)


def test_recovery_scores_nothing_itself_the_monitors_do_on_the_device() -> None:
    """One tail score: a spike is scored by the monitors (``Detection``), not by the recovery."""
    for knob in ("spike_factor", "explosion_factor", "min_history", "spike_threshold"):
        with pytest.warns(
            DeprecationWarning, match=rf"\({knob}=\.\.\.\) is deprecated and ignored"
        ):
            recovery = _recovery(**{knob: 4})
        assert not any(
            hasattr(recovery, name) for name in ("spike_factor", "explosion_factor", "min_history")
        )
    assert not hasattr(TrainingRecovery, "detect_instability")


def test_flagged_steps_need_no_rollback_until_they_persist_or_the_run_diverges() -> None:
    recovery = _recovery()
    assert recovery.patience == 10
    assert (
        recovery.rollback_reason(
            {"flagged_steps": 9, "max_streak": 1, "reasons": ["9 loss spikes"]}
        )
        is None
    )
    assert (
        recovery.rollback_reason(
            {"flagged_steps": 9, "max_streak": 9, "reasons": ["9 loss spikes"]}
        )
        is None
    )
    assert recovery.rollback_reason(
        {"flagged_steps": 10, "max_streak": 10, "reasons": ["10 loss spikes"]}
    ).startswith("10 consecutive unstable steps")
    diverging = {
        "flagged_steps": 0,
        "max_streak": 0,
        "loss": {"diverging": 1},
        "reasons": ["diverging (recent median loss 2.3 above ...)"],
    }
    assert recovery.rollback_reason(diverging).startswith("diverging")
    assert (
        recovery.rollback_reason({"flagged_steps": 0, "weights_finite": False})
        == "non-finite weights"
    )


# -- rollback ------------------------------------------------------------------------------------


def _train_steps(model, opt, sched, n: int, x, y) -> None:
    for _ in range(n):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()


@pytest.fixture()
def run(tmp_path):
    from trainopt.stability.checkpointing.checkpoint import CheckpointManager

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = cosine_annealing_schedule(opt, total_steps=100, warmup_steps=5)
    manager = CheckpointManager(tmp_path, save_every=10, keep_last=3)
    x, y = torch.randn(32, 4), torch.randint(0, 3, (32,))
    return model, opt, sched, manager, x, y


def test_recover_rolls_back_to_the_last_checkpoint_and_halves_the_lr(run) -> None:
    model, opt, sched, manager, x, y = run
    _train_steps(model, opt, sched, 10, x, y)
    manager.save_checkpoint(model, opt, 10, 1.0, scheduler=sched)
    saved = [p.detach().clone() for p in model.parameters()]
    lr_at_10 = opt.param_groups[0]["lr"]
    recovery = TrainingRecovery(model, opt, manager, scheduler=sched, lr_factor=0.5)
    _train_steps(model, opt, sched, 7, x, y)
    with torch.no_grad():
        model.weight.mul_(1e6)  # the run blew up
    assert recovery.recover("test") == 10
    assert all(torch.equal(p, s) for p, s in zip(model.parameters(), saved))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * lr_at_10)
    _train_steps(model, opt, sched, 1, x, y)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * 1e-2 * sched.lr_lambdas[0](11))


def test_repeated_recoveries_compound_the_lr_cut_once_each(run) -> None:
    model, opt, sched, manager, x, y = run
    _train_steps(model, opt, sched, 10, x, y)
    manager.save_checkpoint(model, opt, 10, 1.0, scheduler=sched)
    recovery = TrainingRecovery(model, opt, manager, scheduler=sched, lr_factor=0.5)
    recovery.recover("first")
    _train_steps(model, opt, sched, 10, x, y)
    manager.save_checkpoint(model, opt, 20, 0.9, scheduler=sched)  # saved with the cut LR
    recovery.recover("second")
    assert sched.base_lrs[0] == pytest.approx(1e-2 * 0.25)
    assert recovery.lr_scale == 0.25


def test_recover_gives_up_with_a_clear_error_after_max_attempts(run) -> None:
    model, opt, sched, manager, x, y = run
    _train_steps(model, opt, sched, 10, x, y)
    manager.save_checkpoint(model, opt, 10, 1.0, scheduler=sched)
    recovery = TrainingRecovery(model, opt, manager, scheduler=sched, max_rollbacks=2)
    recovery.recover("a")
    recovery.recover("b")
    with pytest.raises(TrainingInstabilityError, match="max_rollbacks=2"):
        recovery.recover("c")


def test_recover_without_any_checkpoint_says_so(run) -> None:
    model, opt, sched, manager, _, _ = run
    with pytest.raises(TrainingInstabilityError, match="no valid checkpoint"):
        TrainingRecovery(model, opt, manager, scheduler=sched).recover("spike")


def test_skip_batches_after_a_rollback(run) -> None:
    model, opt, sched, manager, x, y = run
    _train_steps(model, opt, sched, 10, x, y)
    manager.save_checkpoint(model, opt, 10, 1.0, scheduler=sched)
    recovery = TrainingRecovery(model, opt, manager, scheduler=sched, skip_batches=3)
    assert not recovery.should_skip_batch()
    recovery.recover("spike")
    assert [recovery.should_skip_batch() for _ in range(5)] == [True, True, True, False, False]


def test_recovery_state_survives_a_weights_only_checkpoint() -> None:
    recovery = _recovery()
    recovery.recovery_attempts, recovery.lr_scale = 2, 0.25
    recovery.history.append({"reason": "spike", "restored_step": 10, "lr_scale": 0.25})
    buffer = io.BytesIO()
    torch.save(recovery.state_dict(), buffer)
    buffer.seek(0)
    other = _recovery()
    other.load_state_dict(torch.load(buffer, weights_only=True))
    assert other.state_dict() == recovery.state_dict()


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"lr_factor": 1.5}, "lr_factor"),
        ({"max_rollbacks": 0}, "max_rollbacks"),
        ({"skip_batches": -1}, "skip_batches"),
        ({"patience": 0}, "patience"),
    ],
)
def test_recovery_rejects_bad_arguments_by_name(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        _recovery(**kwargs)
