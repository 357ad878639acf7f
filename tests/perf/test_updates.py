"""trainopt.perf.updates: update-to-weight ratios per layer."""

from __future__ import annotations

import pytest
import torch

from trainopt.models import GPT, gpt_config, synthetic_batch
from trainopt.perf import UpdateRatioMonitor


def test_ratio_is_the_sgd_step_over_the_weight_for_every_parameter() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model(torch.randn(4, 8)).square().mean().backward()
    expected = {
        name: (0.05 * p.grad.norm() / p.norm()).item() for name, p in model.named_parameters()
    }
    monitor = UpdateRatioMonitor(model, check_every=1)
    with monitor.watch(0):
        optimizer.step()
    assert monitor.read() == pytest.approx(expected, rel=1e-5)


def test_unchecked_steps_copy_nothing_and_checked_steps_record_in_order() -> None:
    model = GPT(gpt_config("tiny"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = synthetic_batch(model.config, batch_size=2, seq_len=16)
    monitor = UpdateRatioMonitor(model, check_every=3)
    for step in range(7):
        model(x, targets=y).backward()
        with monitor.watch(step):
            optimizer.step()
        optimizer.zero_grad()
    assert monitor.steps == [0, 3, 6]
    assert all(r.device == x.device and r.shape == (len(monitor.names),) for r in monitor.history)


def test_state_round_trips_and_refuses_another_model() -> None:
    monitor = UpdateRatioMonitor(torch.nn.Linear(2, 2), check_every=1)
    with monitor.watch(0):
        pass
    other = UpdateRatioMonitor(torch.nn.Linear(2, 2))
    other.load_state_dict(monitor.state_dict())
    assert other.steps == [0] and other.read() == monitor.read()
    with pytest.raises(ValueError, match="names must match"):
        UpdateRatioMonitor(torch.nn.Linear(2, 2, bias=False)).load_state_dict(monitor.state_dict())
    with pytest.raises(ValueError, match="check_every"):
        UpdateRatioMonitor(torch.nn.Linear(2, 2), check_every=0)
