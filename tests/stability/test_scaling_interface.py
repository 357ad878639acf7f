"""DynamicLossScaler has the whole public interface of torch.amp.GradScaler: every public
method with its arguments, getters and setters that take effect as GradScaler's do, and a
state_dict with GradScaler's keys that loads both ways mid-run."""

from __future__ import annotations

import inspect
import math

import torch

from trainopt.stability.scaling.scaler import DynamicLossScaler


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def train_step(model, opt, scaler, x, y, inject: str | None, clip: bool) -> None:
    opt.zero_grad(set_to_none=True)
    scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
    if inject is not None:
        model[0].weight.grad[0, 0] = math.inf if inject == "inf" else math.nan
    scaler.step(opt)
    scaler.update()


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(getattr(cls, name))
        for name in dir(cls)
        if (not name.startswith("_") or name == "__init__") and callable(getattr(cls, name))
    }


def test_every_public_method_of_grad_scaler_exists_with_its_arguments():
    ours, theirs = _public(DynamicLossScaler), _public(torch.amp.GradScaler)
    assert set(theirs) - {"__init__"} <= set(ours)
    for name, signature in theirs.items():
        assert set(signature.parameters) <= set(ours[name].parameters), name


def test_getters_and_setters_agree_with_grad_scaler_and_take_effect():
    ours = DynamicLossScaler(
        device="cpu", init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=5
    )
    theirs = torch.amp.GradScaler(
        device="cpu", init_scale=8.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=5
    )
    for scaler in (ours, theirs):
        assert (
            scaler.get_growth_factor(),
            scaler.get_backoff_factor(),
            scaler.get_growth_interval(),
            scaler.is_enabled(),
            scaler.get_scale(),
        ) == (4.0, 0.25, 5, True, 8.0)
        scaler.set_growth_factor(3.0)
        scaler.set_backoff_factor(0.5)
        scaler.set_growth_interval(2)
    found = [False, False, True, False, False, False]
    model_a, model_b = make_model(), make_model()
    opt_a = torch.optim.SGD(model_a.parameters(), lr=0.01)
    opt_b = torch.optim.SGD(model_b.parameters(), lr=0.01)
    x, y = torch.randn(4, 6), torch.randn(4, 2)
    for f in found:  # the new factor 3, backoff 0.5 and interval 2 apply: 8, 24, 12, 12, 36, 36
        train_step(model_a, opt_a, ours, x, y, "inf" if f else None, False)
        train_step(model_b, opt_b, theirs, x, y, "inf" if f else None, False)
        assert ours.get_scale() == theirs.get_scale()
    assert ours.get_scale() == 8.0 * 3 * 0.5 * 3
    assert (
        ours.state_dict().items() >= theirs.state_dict().items()
    )  # GradScaler's keys, same values


def test_state_dict_has_grad_scaler_keys_and_loads_into_a_grad_scaler_mid_run():
    ours = DynamicLossScaler(init_scale=2.0**10, growth_interval=4)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=4)
    model_a, model_b = make_model(), make_model()
    opt_a = torch.optim.SGD(model_a.parameters(), lr=0.01)
    opt_b = torch.optim.SGD(model_b.parameters(), lr=0.01)
    x, y = torch.randn(4, 6), torch.randn(4, 2)
    for f in (False, False, True, False, False):
        train_step(model_a, opt_a, ours, x, y, "inf" if f else None, False)
    assert set(theirs.state_dict()) <= set(ours.state_dict())
    theirs.load_state_dict(ours.state_dict())
    restored = DynamicLossScaler()
    restored.load_state_dict(theirs.state_dict())
    assert restored.state_dict().items() >= theirs.state_dict().items()
    opt_b.load_state_dict(opt_a.state_dict())
    model_b.load_state_dict(model_a.state_dict())
    for f in (False, False, True, False):
        train_step(model_a, opt_a, restored, x, y, "inf" if f else None, False)
        train_step(model_b, opt_b, theirs, x, y, "inf" if f else None, False)
        assert restored.get_scale() == theirs.get_scale()
        assert theirs.state_dict().items() <= restored.state_dict().items()
