"""GuardedOptimizer in a plain loop: no loss is refused, and its state round-trips mid-window."""

from __future__ import annotations

import pytest
import torch

from trainopt.stability.integrations import GuardedOptimizer


def _setup() -> tuple[torch.nn.Module, GuardedOptimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)
    return model, GuardedOptimizer(opt, sched, check_every=4)


def _train(model: torch.nn.Module, guarded: GuardedOptimizer, steps: range) -> None:
    g = torch.Generator().manual_seed(3)
    batches = [torch.randn(8, 4, generator=g) for _ in range(12)]
    for i in steps:
        guarded.zero_grad()
        loss = model(batches[i]).pow(2).mean() * (float("nan") if i == 1 else 1.0)
        loss.backward()
        guarded.step(lambda loss=loss: loss)
        guarded.scheduler.step()


def test_a_step_without_a_loss_is_refused() -> None:
    model, guarded = _setup()
    model(torch.randn(2, 4)).sum().backward()
    with pytest.raises(RuntimeError, match="no loss to monitor"):
        guarded.step()


def test_state_dict_resumes_mid_window_bitwise(tmp_path) -> None:
    model, guarded = _setup()
    _train(model, guarded, range(12))
    first, guarded_2 = _setup()
    _train(first, guarded_2, range(6))  # 6 steps: mid-window (check_every=4), one skipped
    torch.save(
        {
            "model": first.state_dict(),
            "opt": guarded_2.state_dict(),
            "sched": guarded_2.scheduler.state_dict(),
        },
        tmp_path / "c.pt",
    )
    saved = torch.load(tmp_path / "c.pt", weights_only=True)
    resumed, guarded_3 = _setup()
    resumed.load_state_dict(saved["model"])
    guarded_3.load_state_dict(saved["opt"])
    guarded_3.scheduler.load_state_dict(saved["sched"])
    _train(resumed, guarded_3, range(6, 12))
    assert (
        torch.equal(resumed.weight, model.weight)
        and guarded_3.skipped_steps == guarded.skipped_steps == 1
    )
