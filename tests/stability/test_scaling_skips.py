"""Skipping with the loss scaler, for every optimizer configuration of torch.optim: an
overflowing step leaves weights and state untouched (GradScaler's host-read path and the
sync-free mask path), an overflowing first step leaves the state a fresh run has, and mask mode
adds no host sync over a bare loop."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from optimizer_configs import HELD, ids, nan_allocator
from optimizer_configs import assert_same as assert_state

from trainopt.stability.scaling.scaler import DynamicLossScaler
from trainopt.stability.syncs import HostSyncCounter


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


def _config_step(model, opt, scaler, batch, inject: bool) -> None:
    opt.zero_grad(set_to_none=True)
    x, y = batch
    scaler.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
    if inject:
        next(model.parameters()).grad.view(-1)[0] = math.nan
    scaler.step(opt)
    scaler.update()


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)
    ]


@pytest.mark.parametrize("config", HELD, ids=ids(HELD))
@pytest.mark.parametrize("skip_mode", ["sync", "mask"])
def test_overflowing_step_leaves_weights_and_state_untouched(config, skip_mode):
    model = config.model()
    opt = config.build(model.parameters())
    scaler = DynamicLossScaler(growth_interval=1000, skip_mode=skip_mode)
    first, second = _batches(2)
    _config_step(model, opt, scaler, first, False)  # creates optimizer state
    before_model, before_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    _config_step(model, opt, scaler, second, True)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before_model[k])
    assert_state(opt.state_dict()["state"], before_opt["state"])
    assert int(scaler.skipped_steps) == 1 and float(scaler.last_found_inf) > 0


@pytest.mark.parametrize("config", HELD, ids=ids(HELD))
def test_scaler_skip_of_a_first_step_equals_never_stepping(config):
    """A first step that overflows (mask mode, or a fused kernel) leaves the state a fresh run
    has."""
    first, second = _batches(2)
    model_a, model_b = config.model(), config.model()
    nan_allocator([p.shape for p in model_a.parameters()])
    opt_a, opt_b = config.build(model_a.parameters()), config.build(model_b.parameters())
    scaler_a = DynamicLossScaler(growth_interval=1000, skip_mode="mask")
    scaler_b = DynamicLossScaler(growth_interval=1000, init_scale=2.0**15)
    _config_step(model_a, opt_a, scaler_a, first, True)
    _config_step(model_a, opt_a, scaler_a, second, False)
    _config_step(model_b, opt_b, scaler_b, second, False)
    assert_same(model_a, opt_a, model_b, opt_b)


@pytest.mark.parametrize("config", HELD, ids=ids(HELD))
def test_sync_free_paths_add_no_host_sync(config):
    """Mask mode (fused optimizers: their kernel) adds no sync over a bare loop with the same
    optimizer. Some optimizers read or sync by themselves (non-capturable Adam reads its CPU
    step counter, Rprop indexes with a boolean mask): those count the same in both loops."""
    skip_mode = "sync" if config.implementation.get("fused") else "mask"
    batches = _batches(11)

    def count(use_scaler: bool) -> int:
        model = config.model()
        opt = config.build(model.parameters())
        scaler = DynamicLossScaler(growth_interval=3, skip_mode=skip_mode, enabled=use_scaler)
        _config_step(model, opt, scaler, batches[0], False)
        with HostSyncCounter() as mode:
            for step in range(10):
                _config_step(model, opt, scaler, batches[step + 1], use_scaler and step == 5)
        if use_scaler:
            assert int(scaler.skipped_steps) == 1
        return mode.count

    assert count(True) == count(False)


def test_mask_mode_refuses_an_optimizer_it_cannot_skip_exactly():
    from optimizer_configs import REFUSED_CONFIGS

    from trainopt.stability.skipping.optimizers import UnsupportedOptimizerError

    config = next(c for c in REFUSED_CONFIGS if c.cls is torch.optim.SGD)  # dampening
    model = config.model()
    opt = config.build(model.parameters())
    with pytest.raises(UnsupportedOptimizerError, match="dampening"):
        _config_step(model, opt, DynamicLossScaler(skip_mode="mask"), _batches(1)[0], True)
    _config_step(
        model, opt, DynamicLossScaler(skip_mode="sync"), _batches(1)[0], True
    )  # the host read is exact
