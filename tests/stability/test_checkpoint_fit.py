"""Loads are all or nothing: a checkpoint that does not fit one piece raises CheckpointError
naming the piece and what does not fit, and leaves every object exactly as it was.

Each case saves a checkpoint from a run that differs from the loading run in one piece only;
the loading run has trained too, with other data, so a piece loaded before the misfit is found
would show."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from optimizer_configs import assert_same

from trainopt.stability.checkpointing.checkpoint import CheckpointError, CheckpointManager
from trainopt.stability.scaling.scaler import DynamicLossScaler


def _run(
    hidden: int = 16,
    extra_layer: bool = False,
    groups: int = 1,
    optimizer: str = "adamw",
    scheduler: str = "cosine",
    scaler_enabled: bool = True,
    seed: int = 0,
    steps: int = 2,
) -> dict[str, Any]:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 3)]
    if extra_layer:
        layers += [torch.nn.Tanh(), torch.nn.Linear(3, 3)]
    model = torch.nn.Sequential(*layers)
    params = list(model.parameters())
    param_groups = (
        [{"params": params}] if groups == 1 else [{"params": params[:2]}, {"params": params[2:]}]
    )
    opt = (
        torch.optim.AdamW(param_groups, lr=1e-2)
        if optimizer == "adamw"
        else torch.optim.SGD(param_groups, lr=1e-2, momentum=0.9)
    )
    sched = (
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=1e-3)
        if scheduler == "cosine"
        else torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    )
    scaler = DynamicLossScaler(init_scale=2.0**8, growth_interval=1, enabled=scaler_enabled)
    g = torch.Generator().manual_seed(seed + 100)
    for _ in range(steps):
        opt.zero_grad()
        scaler.scale(
            F.cross_entropy(
                model(torch.randn(16, 8, generator=g)), torch.randint(0, 3, (16,), generator=g)
            )
        ).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
    return {"model": model, "optimizer": opt, "scheduler": sched, "scaler": scaler}


def _states(run: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy({name: obj.state_dict() for name, obj in run.items()})


CASES: dict[str, tuple[dict[str, Any], str]] = {
    "model keys": ({"extra_layer": True}, "the model: unexpected keys ['4.bias', '4.weight']"),
    "model shapes": (
        {"hidden": 32},
        "the model: 0.weight: (32, 8) in the file, (16, 8) in the model",
    ),
    "optimizer groups": (
        {"groups": 2},
        "the optimizer: 2 param groups in the file, 1 in the optimizer",
    ),
    "optimizer of another class": (
        {"optimizer": "sgd"},
        "the optimizer: param_groups[0] has ['dampening', ",
    ),
    "scheduler of another class": ({"scheduler": "step"}, "the scheduler: keys "),
    "scaler saved disabled": (
        {"scaler_enabled": False},
        "the scaler: RuntimeError: the scaler state_dict is empty",
    ),
}


@pytest.mark.parametrize("source, message", CASES.values(), ids=CASES.keys())
def test_a_checkpoint_that_does_not_fit_one_piece_changes_nothing(
    tmp_path, source: dict, message: str
) -> None:
    saved = _run(**source, seed=1, steps=3)
    manager = CheckpointManager(tmp_path)
    manager.save_checkpoint(
        saved["model"],
        saved["optimizer"],
        3,
        0.5,
        scheduler=saved["scheduler"],
        scaler=saved["scaler"],
    )
    target = _run()
    before = _states(target)
    with pytest.raises(CheckpointError) as caught:
        manager.load_latest(
            target["model"],
            target["optimizer"],
            scheduler=target["scheduler"],
            scaler=target["scaler"],
        )
    assert message in str(caught.value) and "checkpoint_step_3.pt" in str(caught.value)
    assert_same(_states(target), before, "after the failed load")


def test_the_pieces_loaded_before_the_misfit_are_put_back() -> None:
    """The scaler misfit is found after the optimizer and the scheduler went in: both come back."""
    import tempfile

    saved = _run(scaler_enabled=False, seed=1, steps=3)
    manager = CheckpointManager(tempfile.mkdtemp())
    manager.save_checkpoint(
        saved["model"],
        saved["optimizer"],
        3,
        0.5,
        scheduler=saved["scheduler"],
        scaler=saved["scaler"],
    )
    target = _run()
    assert target["scheduler"].last_epoch != saved["scheduler"].last_epoch  # the load would show
    before = _states(target)
    with pytest.raises(CheckpointError, match="scaler"):
        manager.load_latest(
            target["model"],
            target["optimizer"],
            scheduler=target["scheduler"],
            scaler=target["scaler"],
        )
    assert_same(_states(target), before)
    target["optimizer"].step()  # still the optimizer it was: its own state objects


def test_a_checkpoint_that_fits_loads_every_piece(tmp_path) -> None:
    saved = _run(seed=1, steps=3)
    manager = CheckpointManager(tmp_path)
    manager.save_checkpoint(
        saved["model"],
        saved["optimizer"],
        3,
        0.5,
        scheduler=saved["scheduler"],
        scaler=saved["scaler"],
    )
    target = _run()
    manager.load_latest(
        target["model"], target["optimizer"], scheduler=target["scheduler"], scaler=target["scaler"]
    )
    assert_same(_states(target), _states(saved))


def _stabilized(folder, clipper: bool, seed: int):
    from trainopt.stability.clipping.norms import ZScoreClipper
    from trainopt.stability.recovery.rollback import TrainingRecovery
    from trainopt.stability.stabilizer import TrainingStabilizer

    run = _run(seed=seed, steps=0)
    recovery = TrainingRecovery(
        run["model"],
        run["optimizer"],
        CheckpointManager(folder, save_every=5),
        scheduler=run["scheduler"],
    )
    stabilizer = TrainingStabilizer(
        run["model"],
        run["optimizer"],
        run["scheduler"],
        check_every=5,
        recovery=recovery,
        clipper=ZScoreClipper() if clipper else None,
    )
    g = torch.Generator().manual_seed(seed)
    for _ in range(5 + seed):
        xb, yb = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
        stabilizer.step(lambda: F.cross_entropy(run["model"](xb), yb))
    return stabilizer, {**run, "recovery": recovery, "stabilizer": stabilizer}


def test_a_stabilizer_checkpoint_that_does_not_fit_the_stabilizer_changes_nothing(tmp_path) -> None:
    """Saved with a clipper, resumed without: the stabilizer piece is the misfit, found after the
    optimizer, the scheduler and the recovery went in (the model goes in last); all come back."""
    _stabilized(tmp_path, clipper=True, seed=0)  # writes checkpoint_step_5.pt
    target, objects = _stabilized(tmp_path / "other", clipper=False, seed=1)
    objects.pop("scaler")
    before = _states(objects)
    with pytest.raises(
        CheckpointError, match=r"does not fit the extra\['stabilizer'\]: KeyError: .*clipper"
    ):
        target.recovery.checkpoint_manager = CheckpointManager(tmp_path)
        target.resume()
    assert_same(_states(objects), before)
