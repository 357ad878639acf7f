"""One regression test per defect of seed 001 (learning-rate scheduling), named for the defect.

The defects are listed in shared/seeds/README.md; each test fails on the seed's behaviour.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import matplotlib.figure
import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F
import yaml

from trainopt.config.training import load_config
from trainopt.schedules.adapters import cosine_annealing_schedule
from trainopt.schedules.adaptive import AdaptiveLearningRate
from trainopt.schedules.debug import debug_lr_schedule
from trainopt.schedules.finder import LearningRateFinder
from trainopt.schedules.plots import plot_schedule, schedule_gallery
from trainopt.schedules.registry import PolynomialDecaySchedule, SchedulerInterface

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guides" / "training-optimization" / "learning-rate-scheduling.md"


def sgd(*lrs: float) -> torch.optim.Optimizer:
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in lrs]
    return torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)])


def rates(sched, steps: int) -> list[float]:
    return debug_lr_schedule(sched, steps)


def test_seed_cosine_ignored_min_lr():
    lrs = rates(
        cosine_annealing_schedule(sgd(1e-3), total_steps=100, warmup_steps=10, min_lr=1e-5), 101
    )
    assert lrs[100] == pytest.approx(1e-5, rel=1e-12)
    assert min(lrs[10:]) >= 1e-5 * (1 - 1e-12)


def test_seed_cosine_rose_again_past_total_steps():
    lrs = rates(cosine_annealing_schedule(sgd(1e-3), total_steps=100, warmup_steps=10), 300)
    assert lrs[100:] == [lrs[100]] * 200


def test_seed_custom_scheduler_never_set_base_lr():
    class Halved(SchedulerInterface):
        def get_lr(self, step: int) -> float:
            return self.base_lr / 2

    assert Halved(base_lr=2e-3).get_lr(0) == 1e-3


def test_seed_custom_scheduler_clamped_to_min_lr_with_a_kink():
    schedule = PolynomialDecaySchedule(base_lr=1e-3, total_steps=200, warmup_steps=20, min_lr=1e-4)
    lrs = [schedule.get_lr(s) for s in range(201)]
    drops = [a - b for a, b in zip(lrs[20:], lrs[21:])]
    assert all(lr > 1e-4 for lr in lrs[20:200])  # no plateau where a clamp would bite
    assert lrs[200] == pytest.approx(1e-4)
    assert drops[-1] < 0.02 * max(drops)  # the slope fades into min_lr instead of breaking


def test_seed_config_yaml_shown_inside_a_python_block():
    text = PAGE.read_text()
    python_blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert not any(re.search(r"^\s*training:\s*$", b, flags=re.M) for b in python_blocks)
    included = re.findall(r"```\{literalinclude\} (\S+\.yaml)\n:language: yaml", text)
    assert included
    for rel in included:
        assert (PAGE.parent / rel).resolve().is_file()


def test_seed_yaml_1e_4_was_read_as_a_string(tmp_path):
    text = (
        "training:\n  optimizer: {type: adamw, lr: 1e-4}\n"
        "  scheduler: {type: cosine_annealing, warmup_steps: 10, total_steps: 100, min_lr: 1e-6}\n"
    )
    assert yaml.safe_load(text)["training"]["optimizer"]["lr"] == "1e-4"  # what PyYAML does
    path = tmp_path / "c.yaml"
    path.write_text(text)
    config = load_config(path)
    assert config.optimizer.lr == 1e-4 and config.scheduler.params["min_lr"] == 1e-6


def test_seed_adaptive_lr_overwrote_every_group_with_group_zero():
    opt = sgd(1e-3, 1e-4)
    controller = AdaptiveLearningRate(opt, initial_lr=1e-3, window=3)
    for loss in [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]:
        controller.update_lr(loss)
    first, second = (g["lr"] for g in opt.param_groups)
    assert first < 1e-3 and second == pytest.approx(first / 10)


def tiny_task():
    torch.manual_seed(0)
    x = torch.randn(32, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), batches


def test_seed_lr_finder_reread_the_first_batch():
    model, opt, batches = tiny_task()
    seen = []
    model.register_forward_pre_hook(lambda m, args: seen.append(args[0].data_ptr()))
    LearningRateFinder(model, opt, batches, F.mse_loss).find_lr(1e-4, 1e-3, num_steps=4)
    assert len(set(seen)) == 4


def test_seed_lr_finder_took_no_backward_or_optimizer_step():
    model, opt, batches = tiny_task()
    finder = LearningRateFinder(model, opt, batches[:1], F.mse_loss)
    finder.find_lr(1e-2, 5e-2, num_steps=10)
    assert finder.raw_losses[-1] < finder.raw_losses[0]


def test_seed_lr_finder_did_not_restore_model_and_optimizer():
    model, opt, batches = tiny_task()
    weights = [p.detach().clone() for p in model.parameters()]
    LearningRateFinder(model, opt, batches, F.mse_loss).find_lr(1e-3, 1.0, num_steps=20)
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert opt.param_groups[0]["lr"] == 0.05 and not opt.state


def test_seed_lr_finder_had_no_smoothing_or_divergence_stop():
    model, opt, batches = tiny_task()
    finder = LearningRateFinder(model, opt, batches, F.mse_loss)
    lrs, losses = finder.find_lr(1e-3, 1e3, num_steps=100)
    assert len(lrs) < 100  # stopped when the loss blew up
    assert losses != finder.raw_losses  # smoothed, not raw


def test_seed_debug_lr_schedule_never_stepped_and_called_deprecated_get_lr():
    sched = cosine_annealing_schedule(sgd(1e-3), total_steps=20, warmup_steps=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when get_lr() is called outside step()
        lrs = debug_lr_schedule(sched, 21)
    assert lrs[0] == 0.0 and lrs[5] == 1e-3 and lrs[20] == 0.0


def test_seed_plot_lr_schedule_called_plt_show(monkeypatch):
    def no_show(*args, **kwargs):
        raise AssertionError("plt.show() called")

    monkeypatch.setattr(plt, "show", no_show)
    for fig in (
        plot_schedule("cosine_annealing", total_steps=50, warmup_steps=5),
        schedule_gallery(200),
    ):
        assert isinstance(fig, matplotlib.figure.Figure)
        plt.close(fig)
