"""The one-object recipe (issue 21, requirement 6): checkpoints and rollbacks from
``checkpoint_dir``, gradient accumulation, several optimizers, averaged weights, and settings
checked when built."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from trainopt.stability import CheckpointManager, Rollback, TrainingRecovery, TrainingStabilizer


def _task(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    generator = torch.Generator().manual_seed(seed + 1)
    data = [
        (torch.randn(8, 8, generator=generator), torch.randint(0, 3, (8,), generator=generator))
        for _ in range(48)
    ]
    return model, data


def test_accumulation_equals_the_plain_loop_over_the_concatenated_micro_batches() -> None:
    model, data = _task()
    reference = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
    stabilizer = TrainingStabilizer(model, opt, accumulate=4, check_every=3)
    for x, y in data:
        stabilizer.step(lambda: F.cross_entropy(model(x), y))
    for i in range(0, len(data), 4):
        ref_opt.zero_grad()
        x = torch.cat([b[0] for b in data[i : i + 4]])
        y = torch.cat([b[1] for b in data[i : i + 4]])
        F.cross_entropy(reference(x), y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        ref_opt.step()
    assert stabilizer.steps == len(data) // 4
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_a_nan_micro_batch_skips_its_whole_step() -> None:
    model, data = _task()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stabilizer = TrainingStabilizer(model, opt, accumulate=3, check_every=100)
    for i, (x, y) in enumerate(data[:9]):
        factor = math.nan if i == 4 else 1.0
        stabilizer.step(lambda: F.cross_entropy(model(x), y) * factor)
    assert stabilizer.steps == 3 and stabilizer.applied_steps == 2


def test_two_optimizers_update_together_and_skip_together() -> None:
    model, data = _task()
    first = torch.optim.AdamW(model[0].parameters(), lr=1e-2, fused=True)
    second = torch.optim.SGD(model[2].parameters(), lr=0.1, momentum=0.9)
    schedulers = [torch.optim.lr_scheduler.StepLR(first, 2, 0.5), None]
    stabilizer = TrainingStabilizer(model, [first, second], schedulers, check_every=4)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = data[0]
    stabilizer.step(lambda: F.cross_entropy(model(x), y) * math.nan)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    for x, y in data[1:8]:
        stabilizer.step(lambda: F.cross_entropy(model(x), y))
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert stabilizer.applied_steps == 7 and schedulers[0].last_epoch == 7


def test_a_checkpoint_dir_gives_saves_rollbacks_and_resume(tmp_path: Path) -> None:
    model, data = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    stabilizer = TrainingStabilizer(
        model, opt, checkpoint_dir=tmp_path, check_every=5, rollback=Rollback(save_every=7)
    )
    for x, y in data[:20]:
        stabilizer.step(lambda: F.cross_entropy(model(x), y))
    saved = sorted(int(p.stem.split("_")[-1]) for p in tmp_path.glob("checkpoint_step_*.pt"))
    assert saved == [
        0,
        10,
        20,
    ]  # the start, then the first stable boundary 7 or more steps after the last
    again = TrainingStabilizer(
        copy.deepcopy(model),
        torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True),
        checkpoint_dir=tmp_path,
        check_every=5,
        rollback=Rollback(save_every=7),
    )
    assert again.resume() == 20


def test_an_averaged_model_equals_the_ema_of_the_run_without_the_bad_batch() -> None:
    model, data = _task()
    reference = copy.deepcopy(model)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    ref_ema = AveragedModel(reference, multi_avg_fn=get_ema_multi_avg_fn(0.9))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    stabilizer = TrainingStabilizer(model, opt, averaged=ema, check_every=4)
    for i, (x, y) in enumerate(data[:12]):
        factor = math.nan if i == 5 else 1.0
        stabilizer.step(lambda: F.cross_entropy(model(x), y) * factor)
        if i == 5:
            continue
        ref_opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        ref_opt.step()
        ref_ema.update_parameters(reference)
    assert int(ema.n_averaged) == int(ref_ema.n_averaged) == 11
    for p, q in zip(ema.parameters(), ref_ema.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def _recovery(model, opt, folder, scheduler=None):
    return TrainingRecovery(model, opt, CheckpointManager(folder), scheduler=scheduler)


@pytest.mark.parametrize(
    "case",
    [
        "recovery without the scheduler",
        "recovery of another optimizer",
        "recovery and checkpoint_dir",
        "a scheduler of another optimizer",
        "schedulers and optimizers of different counts",
        "accumulate=0",
        "save_every=0",
        "a step hook",
    ],
)
def test_inconsistent_settings_are_refused_when_built(case: str, tmp_path: Path) -> None:
    model, _ = _task()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5)
    other = torch.optim.SGD(model.parameters(), lr=0.1)
    kwargs: dict = {"scheduler": sched}
    match = {
        "recovery without the scheduler": "recovery.scheduler is not the stabilizer's scheduler",
        "recovery of another optimizer": "recovery.optimizer is not the stabilizer's optimizer",
        "recovery and checkpoint_dir": "either checkpoint_dir",
        "a scheduler of another optimizer": "drives another optimizer",
        "schedulers and optimizers of different counts": (
            "one scheduler \\(or None\\) per optimizer"
        ),
        "accumulate=0": "accumulate must be an int >= 1",
        "save_every=0": r"Rollback.save_every must be an int >= 1 or None, got save_every=0",
        "a step hook": "step hooks",
    }[case]
    if case == "recovery without the scheduler":
        kwargs["recovery"] = _recovery(model, opt, tmp_path)
    elif case == "recovery of another optimizer":
        kwargs["recovery"] = _recovery(model, other, tmp_path, sched)
    elif case == "recovery and checkpoint_dir":
        kwargs.update(recovery=_recovery(model, opt, tmp_path, sched), checkpoint_dir=tmp_path)
    elif case == "a scheduler of another optimizer":
        kwargs["scheduler"] = torch.optim.lr_scheduler.StepLR(other, 5)
    elif case == "schedulers and optimizers of different counts":
        kwargs["scheduler"] = [sched, None]
    elif case == "accumulate=0":
        kwargs["accumulate"] = 0
    elif case == "save_every=0":  # the settings' group refuses it when built
        with pytest.raises(ValueError, match=match):
            TrainingStabilizer(model, opt, checkpoint_dir=tmp_path, rollback=Rollback(save_every=0))
        return
    else:
        opt.register_step_post_hook(lambda *args: None)
    with pytest.raises(ValueError, match=match):
        TrainingStabilizer(model, opt, **kwargs)
