"""Tests of trainopt.stability.checkpointing.checkpoint: contents, atomicity, pruning, best,
corruption, security."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from trainopt.stability.checkpointing.checkpoint import CheckpointError, CheckpointManager
from trainopt.stability.checkpointing.loader import ResumableSampler
from trainopt.stability.checkpointing.rng import get_rng_state, set_rng_state
from trainopt.stability.clipping.norms import AdaptiveGradientClipper, ZScoreClipper
from trainopt.stability.monitoring.gradients import GradientMonitor
from trainopt.stability.monitoring.loss import LossStabilityMonitor
from trainopt.stability.recovery.rollback import TrainingRecovery
from trainopt.stability.scaling.scaler import DynamicLossScaler


def make(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, opt


def train(model, opt, steps: int = 3) -> None:
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).mean().backward()
        opt.step()


def assert_state_equal(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b) or bool(
            (a.isnan() == b.isnan()).all() and (a[~a.isnan()] == b[~b.isnan()]).all()
        )
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_state_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_state_equal(x, y)
    else:
        assert a == b or (a != a and b != b)


class Warmup:
    """A callable LR factor with attributes: LambdaLR saves its __dict__."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def __call__(self, step: int) -> float:
        return min(1.0, (step + 1) / self.steps)


# --------------------------------------------------------------------------- files, pruning, best


def test_save_writes_named_files_and_keeps_last(tmp_path):
    model, opt = make()
    manager = CheckpointManager(tmp_path, save_every=10, keep_last=2)
    for step in (10, 20, 30, 40):
        path = manager.save_checkpoint(model, opt, step, loss=1.0)
        assert path == tmp_path / f"checkpoint_step_{step}.pt"
    assert [p.name for p in manager.checkpoints()] == [
        "checkpoint_step_30.pt",
        "checkpoint_step_40.pt",
    ]
    assert (tmp_path / "best_checkpoint.pt").exists()
    assert not list(tmp_path.glob(".*.tmp"))


def test_checkpoints_sort_by_step_number_not_name(tmp_path):
    model, opt = make()
    manager = CheckpointManager(tmp_path, keep_last=None)
    for step in (9, 100, 20):
        manager.save_checkpoint(model, opt, step, 1.0)
    assert [p.name for p in manager.checkpoints()] == [
        f"checkpoint_step_{s}.pt" for s in (9, 20, 100)
    ]
    assert manager.load_latest(model, opt)[0] == 100


def test_best_is_lowest_finite_loss_and_survives_pruning(tmp_path):
    model, opt = make()
    manager = CheckpointManager(tmp_path, keep_last=1)
    losses = {1: 3.0, 2: 1.0, 3: float("nan"), 4: float("inf"), 5: 2.0, 6: -0.5 + 1.0}
    for step, loss in losses.items():
        manager.save_checkpoint(model, opt, step, loss)
    best = torch.load(tmp_path / "best_checkpoint.pt", weights_only=True)
    assert best["step"] == 6 and best["loss"] == 0.5
    assert manager.best_loss == 0.5


def test_nan_loss_is_never_best(tmp_path):
    model, opt = make()
    manager = CheckpointManager(tmp_path)
    manager.save_checkpoint(model, opt, 1, float("nan"))
    manager.save_checkpoint(model, opt, 2, torch.tensor(float("nan")))
    assert not (tmp_path / "best_checkpoint.pt").exists()
    manager.save_checkpoint(model, opt, 3, torch.tensor(2.0))
    assert torch.load(tmp_path / "best_checkpoint.pt", weights_only=True)["step"] == 3


def test_new_manager_remembers_best_loss_of_the_directory(tmp_path):
    model, opt = make()
    CheckpointManager(tmp_path).save_checkpoint(model, opt, 1, 0.5)
    again = CheckpointManager(tmp_path)
    assert again.best_loss == 0.5
    again.save_checkpoint(model, opt, 2, 0.7)
    assert torch.load(tmp_path / "best_checkpoint.pt", weights_only=True)["step"] == 1


def test_should_save_every_save_frequency_steps(tmp_path):
    manager = CheckpointManager(tmp_path, save_every=5)
    assert [s for s in range(16) if manager.should_save(s)] == [5, 10, 15]


@pytest.mark.parametrize(
    "kwargs, field", [({"save_every": 0}, "save_every"), ({"keep_last": 0}, "keep_last")]
)
def test_bad_arguments_raise_naming_the_field(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field):
        CheckpointManager(tmp_path, **kwargs)


def test_negative_step_is_refused(tmp_path):
    model, opt = make()
    with pytest.raises(ValueError, match="step"):
        CheckpointManager(tmp_path).save_checkpoint(model, opt, -1, 1.0)


# --------------------------------------------------------------------------- contents


def test_round_trip_restores_every_component(tmp_path):
    model, opt = make()
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, [Warmup(7)])
    train(model, opt)
    scheduler.step()
    scaler = DynamicLossScaler(init_scale=256.0, growth_interval=4, hysteresis=2)
    scaler.scale(torch.ones((), requires_grad=True))
    scaler.update(64.0)
    clippers = {
        "adaptive": AdaptiveGradientClipper(warmup_steps=1),
        "zscore": ZScoreClipper(warmup_steps=2),
    }
    for _step in range(4):
        for c in clippers.values():
            model(torch.randn(2, 4)).sum().backward()
            c(model)
    monitors = {
        "loss": LossStabilityMonitor(check_every=3),
        "gradients": GradientMonitor(opt, min_history=2),
        "data": ResumableSampler(10, 3, seed=4),
        "recovery": TrainingRecovery(model, opt, None, lr_factor=0.3),
    }
    for value in (1.0, 1.2, 0.9, 5.0):
        monitors["loss"].update(torch.tensor(value))
        monitors["gradients"].update()
    monitors["data"].next_batch()
    monitors["recovery"].lr_scale, monitors["recovery"].recovery_attempts = 0.09, 2
    clippers.update(monitors)
    manager = CheckpointManager(tmp_path)
    manager.save_checkpoint(model, opt, 7, 0.25, scheduler=scheduler, scaler=scaler, extra=clippers)

    model2, opt2 = make(seed=1)
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(opt2, [Warmup(1)])
    scaler2 = DynamicLossScaler()
    clippers2 = {
        "adaptive": AdaptiveGradientClipper(),
        "zscore": ZScoreClipper(),
        "loss": LossStabilityMonitor(),
        "gradients": GradientMonitor(opt2),
        "data": ResumableSampler(10, 3, seed=4),
        "recovery": TrainingRecovery(model2, opt2, None),
    }
    step, loss = manager.load_checkpoint(
        model2,
        opt2,
        tmp_path / "checkpoint_step_7.pt",
        scheduler=scheduler2,
        scaler=scaler2,
        extra=clippers2,
    )
    assert (step, loss) == (7, 0.25)
    assert_state_equal(model.state_dict(), model2.state_dict())
    assert_state_equal(opt.state_dict(), opt2.state_dict())
    assert_state_equal(scheduler.state_dict(), scheduler2.state_dict())
    assert scheduler2.lr_lambdas[0].steps == 7  # the callable's attributes came back
    assert scaler2.state_dict() == scaler.state_dict()
    for name in clippers:
        assert_state_equal(clippers[name].state_dict(), clippers2[name].state_dict())


def test_files_load_with_weights_only_including_lambda_lr_and_grad_scaler(tmp_path):
    """AdamW state (tensors + numbers), LambdaLR with a plain lambda (saved as None) and
    torch's own GradScaler state all load with weights_only=True."""
    model, opt = make()
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    train(model, opt)
    scheduler.step()
    scaler = torch.amp.GradScaler("cpu")
    path = CheckpointManager(tmp_path).save_checkpoint(
        model, opt, 1, 1.0, scheduler=scheduler, scaler=scaler
    )
    payload = torch.load(path, weights_only=True)
    assert payload["scheduler"]["lr_lambdas"] == [None]
    assert payload["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    scheduler2 = torch.optim.lr_scheduler.LambdaLR(make()[1], lambda s: 0.9**s)
    scheduler2.load_state_dict(payload["scheduler"])
    assert scheduler2.last_epoch == 1


def test_rng_states_are_restored_on_load(tmp_path):
    model, opt = make()
    manager = CheckpointManager(tmp_path)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    manager.save_checkpoint(model, opt, 1, 1.0)
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    manager.load_latest(model, opt)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_rng_state_survives_gauss_cache_and_weights_only(tmp_path):
    random.seed(5)
    random.gauss(0, 1)  # leaves a cached second Gaussian in the state
    np.random.seed(5)
    np.random.standard_normal()  # numpy caches one too
    torch.save(get_rng_state(), tmp_path / "rng.pt")
    expected = random.gauss(0, 1), np.random.standard_normal()
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.gauss(0, 1), np.random.standard_normal()) == expected


def test_state_that_would_not_load_weights_only_is_refused_at_save(tmp_path):
    class Opaque:
        def state_dict(self):
            return {"fn": print}

    model, opt = make()
    with pytest.raises(CheckpointError, match=r"extra.*'fn'.*weights_only"):
        CheckpointManager(tmp_path).save_checkpoint(model, opt, 1, 1.0, extra={"opaque": Opaque()})
    assert not list(tmp_path.iterdir())


def test_model_without_config_attribute_is_fine(tmp_path):
    model, opt = make()
    assert not hasattr(model, "config")
    CheckpointManager(tmp_path).save_checkpoint(model, opt, 1, 1.0)


def test_load_refuses_mismatched_model_and_leaves_it_alone(tmp_path):
    model, opt = make()
    path = CheckpointManager(tmp_path).save_checkpoint(model, opt, 1, 1.0)
    other = torch.nn.Linear(3, 3)
    before = other.weight.detach().clone()
    with pytest.raises(CheckpointError, match="checkpoint_step_1.pt"):
        CheckpointManager(tmp_path).load_checkpoint(other, None, path)
    assert torch.equal(other.weight, before)


def test_load_refuses_when_requested_state_is_missing(tmp_path):
    model, opt = make()
    path = CheckpointManager(tmp_path).save_checkpoint(model, opt, 1, 1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(CheckpointError, match="scheduler"):
        CheckpointManager(tmp_path).load_checkpoint(model, opt, path, scheduler=sched)
    with pytest.raises(CheckpointError, match="clipper"):
        CheckpointManager(tmp_path).load_checkpoint(
            model, opt, path, extra={"clipper": ZScoreClipper()}
        )


# ------------------------------------------------------------------------- atomicity and corruption


def test_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    model, opt = make()
    manager = CheckpointManager(tmp_path)
    path = manager.save_checkpoint(model, opt, 1, 1.0)
    good = path.read_bytes()

    def failing_save(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        manager.save_checkpoint(model, opt, 1, 0.5)
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "best_checkpoint.pt",
        "checkpoint_step_1.pt",
    ]


def test_write_is_fsynced_then_renamed_then_directory_fsynced(tmp_path, monkeypatch):
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        calls.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src, dst):
        calls.append(f"replace:{Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    model, opt = make()
    CheckpointManager(tmp_path).save_checkpoint(model, opt, 3, float("nan"))
    assert calls[:3] == ["fsync-file", "replace:checkpoint_step_3.pt", "fsync-dir"]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_load_latest_skips_a_corrupt_newest_file_with_a_warning(tmp_path, damage):
    model, opt = make()
    manager = CheckpointManager(tmp_path, keep_last=None)
    for step in (1, 2, 3):
        train(model, opt, 1)
        manager.save_checkpoint(model, opt, step, 10.0 - step)
    newest = tmp_path / "checkpoint_step_3.pt"
    data = newest.read_bytes()
    newest.write_bytes(
        {"truncate": data[: len(data) // 2], "garbage": os.urandom(1000), "empty": b""}[damage]
    )
    model2, opt2 = make(seed=4)
    with pytest.warns(UserWarning, match="checkpoint_step_3.pt"):
        assert manager.load_latest(model2, opt2) == (2, 8.0)
    expected = torch.load(tmp_path / "checkpoint_step_2.pt", weights_only=True)["model"]
    assert_state_equal(model2.state_dict(), expected)


def test_load_checkpoint_of_a_corrupt_file_raises_naming_it(tmp_path):
    bad = tmp_path / "checkpoint_step_5.pt"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    model, opt = make()
    with pytest.raises(CheckpointError, match="checkpoint_step_5.pt.*corrupt or truncated"):
        CheckpointManager(tmp_path).load_checkpoint(model, opt, bad)
    with pytest.raises(CheckpointError, match="does not exist"):
        CheckpointManager(tmp_path).load_checkpoint(model, opt, tmp_path / "nope.pt")


def test_load_latest_falls_back_to_best_then_none(tmp_path):
    model, opt = make()
    manager = CheckpointManager(tmp_path)
    assert manager.load_latest(model, opt) is None
    manager.save_checkpoint(model, opt, 1, 1.0)
    (
        tmp_path / "checkpoint_step_1.pt"
    ).unlink()  # best may be a hard link to it: replace, not overwrite
    (tmp_path / "checkpoint_step_1.pt").write_bytes(b"")
    with pytest.warns(UserWarning, match="checkpoint_step_1.pt"):
        assert manager.load_latest(model, opt) == (1, 1.0)  # from best_checkpoint.pt
    (tmp_path / "best_checkpoint.pt").write_bytes(b"")
    with pytest.warns(UserWarning):
        assert manager.load_latest(model, opt) is None


def test_a_plain_torch_save_dict_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "checkpoint_step_1.pt"
    torch.save({"model": {}}, path)
    with pytest.raises(CheckpointError, match="not a trainopt.stability.checkpoint/1"):
        CheckpointManager(tmp_path).load_checkpoint(torch.nn.Linear(1, 1), None, path)


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    dead = tmp_path / ".checkpoint_step_1.pt.999999999.abcd1234.tmp"
    alive = tmp_path / f".checkpoint_step_2.pt.{os.getpid()}.abcd1234.tmp"
    dead.write_bytes(b"x")
    alive.write_bytes(b"x")
    CheckpointManager(tmp_path)
    assert not dead.exists() and alive.exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rng_and_map_location(tmp_path):
    model, opt = make()
    model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 4, device="cuda")).sum().backward()
    opt.step()
    torch.cuda.manual_seed_all(3)
    manager = CheckpointManager(tmp_path)
    manager.save_checkpoint(model, opt, 1, 1.0)
    expected = torch.randn(4, device="cuda")
    torch.cuda.manual_seed_all(9)
    model2, _ = make(seed=5)
    model2.cuda()
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    assert manager.load_latest(model2, opt2, map_location="cuda") == (1, 1.0)
    assert torch.equal(torch.randn(4, device="cuda"), expected)
    assert_state_equal(model.state_dict(), model2.state_dict())
    cpu_model, _ = make(seed=6)
    manager.load_latest(cpu_model, None, map_location="cpu")  # a GPU checkpoint loads on CPU
    assert next(cpu_model.parameters()).device.type == "cpu"
