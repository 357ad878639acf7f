"""Tests of trainopt.schedules.finder: a real range test that leaves the model and optimizer
untouched."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from trainopt.models import digits_loaders, digits_mlp
from trainopt.schedules.finder import LearningRateFinder
from trainopt.schedules.plots import digits_lr_finder_figure


def digits_finder(optimizer_cls=torch.optim.SGD, **opt_kwargs):
    model = digits_mlp(hidden=32, depth=1)
    opt = optimizer_cls(model.parameters(), **(opt_kwargs or {"lr": 0.01, "momentum": 0.9}))
    train, _ = digits_loaders(batch_size=64)
    return model, opt, LearningRateFinder(model, opt, train, F.cross_entropy)


def snapshot(module_or_opt) -> list:
    state = module_or_opt.state_dict()
    flat = []

    def walk(x):
        if torch.is_tensor(x):
            flat.append(x.clone())
        elif isinstance(x, dict):
            for key in sorted(x, key=str):
                flat.append(key)
                walk(x[key])
        elif isinstance(x, (list, tuple)):
            for item in x:
                walk(item)
        else:
            flat.append(x)

    walk(state)
    return flat


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x, y) if torch.is_tensor(x) else x == y for x, y in zip(a, b)
    )


def test_find_lr_restores_model_weights_exactly():
    model, _, finder = digits_finder()
    before = snapshot(model)
    finder.find_lr(1e-4, 10.0, num_steps=40)
    assert same(snapshot(model), before)


def test_find_lr_restores_optimizer_state_and_rates_exactly():
    model, opt, finder = digits_finder(torch.optim.AdamW, lr=3e-4)
    x, y = next(iter(finder.dataloader))
    F.cross_entropy(model(x), y).backward()
    opt.step()  # non-empty Adam state to restore
    before = snapshot(opt)
    finder.find_lr(1e-5, 1.0, num_steps=30)
    assert same(snapshot(opt), before)
    assert opt.param_groups[0]["lr"] == 3e-4


def test_find_lr_restores_even_when_a_step_raises():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []

    def failing_loss(out, target):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return F.mse_loss(out, target)

    before = snapshot(model)
    finder = LearningRateFinder(model, opt, [(torch.randn(4, 3), torch.randn(4, 1))], failing_loss)
    with pytest.raises(RuntimeError, match="boom"):
        finder.find_lr(1e-3, 1.0, num_steps=10)
    assert same(snapshot(model), before) and opt.param_groups[0]["lr"] == 0.1


def test_find_lr_uses_a_fresh_batch_per_step_cycling_the_loader():
    seen = []
    batches = [(torch.full((2, 1), float(i)), torch.zeros(2, 1)) for i in range(3)]
    model = torch.nn.Linear(1, 1)

    def loss_fn(out, target):
        return out.sum() * 0 + 1.0  # flat, so the test runs to the end

    def record(module, args):
        seen.append(int(args[0][0, 0]))

    model.register_forward_pre_hook(record)
    finder = LearningRateFinder(
        model, torch.optim.SGD(model.parameters(), lr=1e-3), batches, loss_fn
    )
    finder.find_lr(1e-6, 1e-5, num_steps=7)
    assert seen == [0, 1, 2, 0, 1, 2, 0]


def test_each_point_takes_a_real_optimizer_step_so_the_loss_moves():
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    model = torch.nn.Linear(4, 1)
    finder = LearningRateFinder(
        model, torch.optim.SGD(model.parameters(), lr=0.1), [(x, y)], F.mse_loss
    )
    finder.find_lr(1e-2, 1e-1, num_steps=20)
    assert finder.raw_losses[-1] < 0.5 * finder.raw_losses[0]


def test_loss_depends_on_the_learning_rate():
    _, _, finder = digits_finder()
    finder.find_lr(1e-7, 1e-6, num_steps=30)
    tiny = finder.raw_losses[:]
    finder.find_lr(1e-2, 1e-1, num_steps=30)
    assert abs(tiny[-1] - tiny[0]) < 0.05  # a rate this small barely moves the weights
    assert finder.raw_losses[-1] < tiny[-1] - 0.1


def test_find_lr_stops_when_the_loss_diverges():
    _, _, finder = digits_finder()
    lrs, losses = finder.find_lr(1e-4, 1e4, num_steps=200)
    assert len(lrs) < 200
    assert "diverged" in finder.stop_reason or "non-finite" in finder.stop_reason
    assert all(math.isfinite(x) for x in losses)


def test_find_lr_stops_on_a_non_finite_loss_without_recording_it():
    model = torch.nn.Linear(1, 1)
    values = iter([1.0, 0.9, 0.8, float("nan"), 0.5, 0.4])

    def loss_fn(out, target):
        return out.sum() * 0 + next(values)

    finder = LearningRateFinder(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        [(torch.ones(1, 1), torch.ones(1, 1))],
        loss_fn,
    )
    lrs, losses = finder.find_lr(1e-3, 1e-1, num_steps=6)
    assert len(lrs) == 3 and finder.stop_reason.startswith("non-finite")


def test_smoothed_loss_is_a_bias_corrected_moving_average():
    model = torch.nn.Linear(1, 1)
    values = iter([4.0, 2.0, 1.0])
    finder = LearningRateFinder(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        [(torch.ones(1, 1), torch.ones(1, 1))],
        lambda out, target: out.sum() * 0 + next(values),
    )
    _, losses = finder.find_lr(1e-3, 1e-2, num_steps=3, smoothing=0.5)
    # a1 = 2, a2 = 2, a3 = 1.5; corrected by 1 - 0.5**i
    assert losses == pytest.approx([4.0, 2.0 / 0.75, 1.5 / 0.875])


def test_per_group_ratios_are_kept_during_the_test():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD([{"params": model.weight, "lr": 1.0}, {"params": model.bias, "lr": 0.1}])
    seen = []

    def loss_fn(out, target):
        seen.append([g["lr"] for g in opt.param_groups])
        return F.mse_loss(out, target)

    LearningRateFinder(model, opt, [(torch.ones(2, 2), torch.ones(2, 1))], loss_fn).find_lr(
        1e-3, 1e-2, 3
    )
    assert all(row[1] == pytest.approx(row[0] / 10) for row in seen)


def synthetic(finder: LearningRateFinder, losses: list[float]) -> None:
    finder.lrs = LearningRateFinder.ramp(1e-5, 1.0, len(losses))
    finder.losses = list(losses)


def valley(n: int = 50, shift: float = 0.0) -> list[float]:
    """A range-test-like curve: flat, a steep drop centred at point 30, a rise at the end."""
    return [
        shift
        + 2.0
        - 1.5 / (1 + math.exp(-(i - 30) / 2.0))
        + (0.05 * (i - 44) ** 2 if i > 44 else 0)
        for i in range(n)
    ]


def test_suggest_lr_picks_the_steepest_descent():
    finder = LearningRateFinder(torch.nn.Linear(1, 1), None, [], F.mse_loss)
    synthetic(finder, valley())
    assert finder.suggest_lr() == pytest.approx(finder.lrs[30])


def test_suggest_lr_ignores_nan_losses():
    finder = LearningRateFinder(torch.nn.Linear(1, 1), None, [], F.mse_loss)
    losses = valley()
    losses[10] = losses[35] = float("nan")
    synthetic(finder, losses)
    assert finder.suggest_lr() == pytest.approx(finder.lrs[30])


def test_suggest_lr_works_with_negative_losses():
    finder = LearningRateFinder(torch.nn.Linear(1, 1), None, [], F.mse_loss)
    synthetic(finder, valley(shift=-10.0))
    assert finder.suggest_lr() == pytest.approx(finder.lrs[30])


def test_suggest_lr_without_enough_points_says_what_to_do():
    finder = LearningRateFinder(torch.nn.Linear(1, 1), None, [], F.mse_loss)
    with pytest.raises(RuntimeError, match="run find_lr first"):
        finder.suggest_lr()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "log"}, r"mode must be one of \('exp', 'linear'\)"),
        ({"start_lr": 1.0, "end_lr": 0.1}, "start_lr < end_lr"),
        ({"num_steps": 1}, "num_steps must be an int >= 2"),
        ({"smoothing": 1.0}, r"smoothing must be in \[0, 1\)"),
    ],
)
def test_bad_arguments_are_rejected_before_training(kwargs, message):
    model, _, finder = digits_finder()
    before = snapshot(model)
    with pytest.raises(ValueError, match=message):
        finder.find_lr(**kwargs)
    assert same(snapshot(model), before)


def test_linear_ramp_is_evenly_spaced():
    assert LearningRateFinder.ramp(0.1, 0.5, 5, mode="linear") == pytest.approx(
        [0.1, 0.2, 0.3, 0.4, 0.5]
    )


def test_page_figure_is_a_matplotlib_figure_with_the_suggestion_marked():
    fig = digits_lr_finder_figure(num_steps=40)
    assert isinstance(fig, matplotlib.figure.Figure)
    assert any("steepest" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
