"""A skipped step leaves no trace in the model's buffers, and a non-finite buffer is a non-finite
weight.

The case: a CNN with BatchNorm on the digits, where one image of one batch has one NaN pixel.
The step is skipped on the device, but its forward pass has already moved BatchNorm's running
statistics (to NaN); the stabilizer must put them back, with no host read, so that the run
ends bit for bit as the run that never saw the batch.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from trainopt.models import digits_data
from trainopt.stability.monitoring.checker import StabilityChecker
from trainopt.stability.monitoring.gradients import GradientMonitor
from trainopt.stability.skipping.buffers import BufferSnapshot, nonfinite_buffers
from trainopt.stability.stabilizer import TrainingStabilizer
from trainopt.stability.syncs import HostSyncCounter

BATCH = 64
POISONED = 7  # the batch with one NaN pixel


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, ...]:
    return digits_data()


def _cnn(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 16, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, 10),
    )


def _batches(x: torch.Tensor, y: torch.Tensor, steps: int, poison: bool):
    """Batches ``0 .. steps``; batch ``POISONED`` gets one NaN pixel, or is left out (poison
    False)."""
    for step in range(steps):
        start = (step * BATCH) % (len(x) - BATCH)
        xb, yb = x[start : start + BATCH].clone(), y[start : start + BATCH]
        if step == POISONED:
            if not poison:
                continue  # plain torch: the batch is left out
            xb[3, 27] = math.nan
        yield xb, yb


def _train(digits, poison: bool, steps: int = 60, averaged_kwargs: dict | None = None, **settings):
    x, y, _, _ = digits
    model = _cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    averaged = AveragedModel(model, **averaged_kwargs) if averaged_kwargs is not None else None
    stabilizer = TrainingStabilizer(model, optimizer, check_every=10, averaged=averaged, **settings)
    for xb, yb in _batches(x, y, steps, poison):
        stabilizer.step(lambda: F.cross_entropy(model(xb), yb))
    return model, stabilizer, averaged


def _accuracy(model: nn.Module, digits) -> float:
    _, _, x_val, y_val = digits
    model.eval()
    with torch.no_grad():
        return float((model(x_val).argmax(1) == y_val).float().mean())


def test_a_skipped_nan_pixel_leaves_the_running_statistics_as_if_the_batch_was_never_there(digits):
    poisoned, stabilizer, _ = _train(digits, poison=True)
    clean, _, _ = _train(digits, poison=False)
    assert stabilizer.skip_events == 1  # the NaN batch was skipped, nothing else
    bn = poisoned[2]
    assert torch.isfinite(bn.running_mean).all() and torch.isfinite(bn.running_var).all()
    for (name, a), b in zip(poisoned.state_dict().items(), clean.state_dict().values()):
        assert torch.equal(a, b), name  # buffers (num_batches_tracked too) and weights, bit for bit
    assert _accuracy(poisoned, digits) > 0.95


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"use_buffers": True}, {"multi_avg_fn": get_ema_multi_avg_fn(0.9), "use_buffers": True}],
    ids=["buffers copied", "running mean with buffers", "ema with buffers"],
)
def test_an_averaged_model_takes_no_nan_buffers_from_a_skipped_step(digits, kwargs):
    _, _, poisoned = _train(digits, poison=True, steps=20, averaged_kwargs=kwargs)
    _, _, clean = _train(digits, poison=False, steps=20, averaged_kwargs=kwargs)
    assert int(poisoned.n_averaged) == int(clean.n_averaged) == 19
    for (name, a), b in zip(poisoned.state_dict().items(), clean.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_skipped_step_of_several_micro_batches_restores_what_all_of_them_moved(digits):
    x, y, _, _ = digits
    model = _cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    stabilizer = TrainingStabilizer(model, optimizer, accumulate=3, check_every=10)
    for step in range(3):
        if step == 2:
            before = {k: v.clone() for k, v in model.state_dict().items()}
        for micro in range(3):
            xb, yb = (
                x[BATCH * micro : BATCH * micro + BATCH].clone(),
                y[BATCH * micro : BATCH * micro + BATCH],
            )
            if step == 2 and micro == 1:
                xb[0, 20] = math.nan  # the second of three micro-batches: the first moved them too
            stabilizer.step(lambda: F.cross_entropy(model(xb), yb))
    assert stabilizer.steps == 3 and stabilizer.applied_steps == 2
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_the_stabilized_step_with_batchnorm_makes_no_host_sync(digits):
    x, y, _, _ = digits
    model = _cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    stabilizer = TrainingStabilizer(model, optimizer, check_every=100)
    xb, yb = x[:BATCH].clone(), y[:BATCH]
    bad = xb.clone()
    bad[0, 10] = math.nan
    for _ in range(10):
        stabilizer.step(lambda: F.cross_entropy(model(xb), yb))
    with HostSyncCounter() as counter:
        for step in range(50):
            batch = (
                bad if step == 25 else xb
            )  # a skipped step in the window: restored on the device
            stabilizer.step(lambda: F.cross_entropy(model(batch), yb))
    assert stabilizer.last_report is None  # no boundary was crossed
    assert counter.count == 0, counter.stacks
    assert stabilizer.applied_steps == 59 and torch.isfinite(model[2].running_var).all()


# --- BufferSnapshot on its own ----------------------------------------------------------------


def test_restore_where_keeps_an_applied_step_and_undoes_a_skipped_one():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    model.register_buffer("counter", torch.zeros(2, dtype=torch.int32))
    snapshot = BufferSnapshot(model)
    for skip in (False, True, False, True):
        snapshot.take()
        before = {k: v.clone() for k, v in model.named_buffers()}
        model(torch.randn(5, 3) * (math.nan if skip else 1.0))
        model.counter.add_(1)
        moved = {k: v.clone() for k, v in model.named_buffers()}
        snapshot.restore_where(torch.tensor(skip))
        expected = before if skip else moved
        for name, value in model.named_buffers():
            assert torch.equal(value, expected[name]), (skip, name)
    assert int(model[1].num_batches_tracked) == 2 and model.counter.tolist() == [2, 2]


def test_a_buffer_the_forward_pass_replaces_is_restored_in_the_new_tensor():
    model = nn.BatchNorm1d(2)
    snapshot = BufferSnapshot(model)
    snapshot.take()
    model.running_mean = torch.full((2,), math.nan)  # a module that assigns its buffer anew
    snapshot.restore_where(torch.tensor(True))
    assert model.running_mean.tolist() == [0.0, 0.0]


def test_a_model_without_buffers_needs_no_snapshot():
    snapshot = BufferSnapshot(nn.Linear(2, 2))
    snapshot.take()
    snapshot.restore_where(torch.tensor(True))
    assert snapshot._groups == []  # nothing allocated


def test_the_snapshot_is_allocated_once():
    model = nn.BatchNorm1d(3)
    snapshot = BufferSnapshot(model)
    snapshot.take()
    storage = [group.saved.data_ptr() for group in snapshot._groups]
    for _ in range(3):
        snapshot.take()
        model(torch.randn(4, 3))
        snapshot.restore_where(torch.tensor(False))
    assert [group.saved.data_ptr() for group in snapshot._groups] == storage


def test_restore_where_names_a_bad_flag():
    snapshot = BufferSnapshot(nn.BatchNorm1d(3))
    snapshot.take()
    with pytest.raises(ValueError, match="skip must be a 0-d tensor"):
        snapshot.restore_where(torch.tensor([True]))


# --- a non-finite buffer is a non-finite weight -----------------------------------------------


def test_nonfinite_buffers_counts_floating_buffers_with_an_inf_or_a_nan():
    model = nn.Sequential(nn.BatchNorm1d(3), nn.BatchNorm1d(3))
    assert int(nonfinite_buffers(model)) == 0
    model[0].running_var[1] = math.inf
    model[1].running_mean[0] = math.nan
    model[1].running_var[0] = math.nan
    assert int(nonfinite_buffers(model)) == 3
    model[0].running_var.fill_(3e38)  # finite, though its norm overflows float32
    assert int(nonfinite_buffers(model)) == 2


@pytest.mark.parametrize("watched", ["model", "optimizer + watch_buffers"])
def test_a_nonfinite_buffer_makes_weights_finite_false(watched):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    if watched == "model":
        checker = StabilityChecker(model, check_every=5)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        checker = StabilityChecker(
            optimizer, gradient_monitor=GradientMonitor(optimizer, check_every=5), check_every=5
        )
        checker.gradient_monitor.watch_buffers(model)
    reports = []
    for nan in (False, True):
        for _ in range(5):
            model.zero_grad()
            model(torch.randn(8, 3)).pow(2).mean().backward()
            checker.update(model(torch.randn(8, 3)).pow(2).mean().detach())
        if nan:
            model[1].running_var[2] = math.nan
        reports.append(checker.check())
    assert [r["weights_finite"] for r in reports] == [True, False]
    assert [r["gradients"]["nonfinite_buffers"] for r in reports] == [0, 1]
    assert all(math.isfinite(r["gradients"]["param_norm"]) for r in reports)  # the weights are fine


def test_a_nan_buffer_that_got_through_rolls_the_run_back(digits, tmp_path):
    x, y, _, _ = digits
    model = _cnn()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    stabilizer = TrainingStabilizer(model, optimizer, checkpoint_dir=tmp_path, check_every=10)
    for step in range(20):
        xb, yb = (
            x[BATCH * step : BATCH * step + BATCH].clone(),
            y[BATCH * step : BATCH * step + BATCH],
        )
        if step == 14:
            xb[0, 27] = 1e20  # finite: so are the loss and the gradients, but running_var overflows
        stabilizer.step(lambda: F.cross_entropy(model(xb), yb))
        if step == 14:
            assert stabilizer.applied_steps == 15 and not torch.isfinite(model[2].running_var).all()
    assert stabilizer.reports[0]["weights_finite"] and stabilizer.reports[0]["recovered"] is None
    assert stabilizer.reports[1]["weights_finite"] is False
    assert stabilizer.reports[1]["recovered"] == "non-finite weights"
    assert torch.isfinite(model[2].running_var).all()  # the checkpoint of step 10 came back


def test_a_buffer_registered_later_is_snapshotted_after_a_refresh():
    model = nn.Sequential(nn.Linear(2, 2))
    snapshot = BufferSnapshot(model)
    snapshot.take()
    model.register_buffer("late", torch.zeros(2))
    snapshot.refresh()
    snapshot.take()
    model.late.fill_(math.nan)
    snapshot.restore_where(torch.tensor(True))
    assert model.late.tolist() == [0.0, 0.0]


def test_the_module_tree_is_walked_only_when_needed(monkeypatch: pytest.MonkeyPatch):
    from trainopt.stability.skipping import buffers

    walks = []
    real = buffers._slots
    monkeypatch.setattr(buffers, "_slots", lambda m: walks.append(1) or real(m))
    model = nn.BatchNorm1d(2)
    snapshot = BufferSnapshot(model)
    for _ in range(3):
        snapshot.take()
    assert len(walks) == 1
    model.running_mean = torch.ones(2)  # replaced: the next take walks again and copies the new one
    snapshot.take()
    model.running_mean.fill_(math.nan)
    snapshot.restore_where(torch.tensor(True))
    assert len(walks) == 2 and model.running_mean.tolist() == [1.0, 1.0]
