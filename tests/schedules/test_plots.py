"""Tests of trainopt.schedules.plots: figures drawn from the real schedulers, never shown."""

from __future__ import annotations

import matplotlib.figure
import pytest
import torch

from trainopt.schedules.adapters import cosine_annealing_schedule
from trainopt.schedules.debug import debug_lr_schedule
from trainopt.schedules.plots import (
    lr_monitor_figure,
    plot_adaptive,
    plot_cyclical_modes,
    plot_schedule,
    plot_wsd_decays,
    schedule_gallery,
    schedule_values,
)


def test_plotted_values_are_the_schedulers_own_rates():
    fig = plot_schedule(
        "cosine_annealing", base_lr=1e-3, total_steps=200, warmup_steps=20, min_lr=1e-5
    )
    plotted = list(fig.axes[0].get_lines()[0].get_ydata())
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    expected = debug_lr_schedule(cosine_annealing_schedule(opt, 200, 20, 1e-5), len(plotted))
    assert plotted == expected and len(plotted) == 241  # 20 % past total_steps


def test_schedule_values_builds_by_name():
    assert schedule_values("wsd", 6, 1.0, total_steps=4, warmup_steps=1, decay_steps=2) == [
        0.0,
        1.0,
        1.0,
        0.5,
        0.0,
        0.0,
    ]


@pytest.mark.parametrize(
    ("make", "lines"),
    [(plot_wsd_decays, 3), (plot_cyclical_modes, 3), (schedule_gallery, None), (plot_adaptive, 1)],
)
def test_figures_are_returned_with_their_curves(make, lines):
    fig = make()
    assert isinstance(fig, matplotlib.figure.Figure)
    if lines is not None:
        assert len(fig.axes[0].get_lines()) == lines
    else:
        assert len(fig.axes) == 4


def test_lr_monitor_figure_shows_both_param_groups_reaching_min_lr():
    fig = lr_monitor_figure(steps=30)
    curves = [line.get_ydata() for line in fig.axes[0].get_lines()]
    assert len(curves) == 2 and curves[0][0] == curves[1][0] == 0.0
    assert curves[0][-1] < 1.2e-4 and curves[1][-1] < 1.2e-4  # both close to min_lr=1e-4
    assert max(curves[0]) == pytest.approx(3e-3)
