"""Plots of learning-rate schedules, made by stepping the real schedulers.

Every function returns a matplotlib Figure (nothing is shown), so the same code draws the
figures of the documentation at build time and works in a headless training job.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from trainopt.schedules.adapters import wsd_schedule
from trainopt.schedules.adaptive import AdaptiveLearningRate
from trainopt.schedules.cyclical import CyclicalLearningRate
from trainopt.schedules.debug import debug_lr_schedule
from trainopt.schedules.finder import LearningRateFinder
from trainopt.schedules.monitor import LRMonitor
from trainopt.schedules.registry import build_scheduler

FONT_PT = 10
"""Size of the text in the gallery: 15 px at the site's 110 dpi, above 9 px at 800 px wide."""

_STYLE = {
    "font.size": FONT_PT,
    "axes.titlesize": FONT_PT,
    "axes.labelsize": FONT_PT,
    "xtick.labelsize": FONT_PT,
    "ytick.labelsize": FONT_PT,
    "legend.fontsize": FONT_PT,
}


def _optimizer(base_lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)


def _axes(ax: Any, size: tuple[float, float] = (6, 3.2)) -> tuple[Any, Any]:
    import matplotlib.pyplot as plt

    if ax is not None:
        return ax.figure, ax
    fig = plt.figure(figsize=size)
    return fig, fig.add_subplot()


def _finish(ax: Any, title: str, log: bool = False) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    if log:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)


def schedule_values(
    name: str, num_steps: int, base_lr: float = 1e-3, **settings: Any
) -> list[float]:
    """The rate at steps ``0..num_steps-1`` of a registered scheduler built with ``settings``.

    Example:
        >>> from trainopt.schedules.plots import schedule_values
        >>> schedule_values("step_decay", 5, base_lr=1.0, decay_steps=2, decay_rate=0.5)
        [1.0, 1.0, 0.5, 0.5, 0.25]
    """
    scheduler = build_scheduler(_optimizer(base_lr), {"type": name, **settings})
    return debug_lr_schedule(scheduler, num_steps)


def plot_schedule(
    name: str,
    base_lr: float = 1e-3,
    num_steps: int | None = None,
    ax: Any = None,
    log: bool = False,
    **settings: Any,
) -> Any:
    """Plot a registered schedule over ``num_steps`` (default: 20 % past ``total_steps``).

    Example:
        >>> from trainopt.schedules.plots import plot_schedule
        >>> fig = plot_schedule("cosine_annealing", total_steps=100, warmup_steps=10, min_lr=1e-4)
        >>> float(fig.axes[0].get_lines()[0].get_ydata()[100])
        0.0001
    """
    total = settings.get("total_steps")
    num_steps = num_steps or (int(total * 1.2) + 1 if total else 1000)
    fig, ax = _axes(ax)
    ax.plot(schedule_values(name, num_steps, base_lr, **settings))
    if total:
        ax.axvline(total, color="0.6", linestyle=":", linewidth=1)
    shown = ", ".join(f"{k}={v}" for k, v in settings.items())
    _finish(ax, f"{name}({shown})", log)
    return fig


def plot_wsd_decays(
    total_steps: int = 1000,
    warmup_steps: int = 50,
    decay_steps: int = 200,
    base_lr: float = 1e-3,
    min_lr: float = 1e-5,
    ax: Any = None,
) -> Any:
    """The three WSD decay shapes on one plot.

    Example:
        >>> from trainopt.schedules.plots import plot_wsd_decays
        >>> import matplotlib.pyplot as plt
        >>> fig = plot_wsd_decays(total_steps=100, warmup_steps=10, decay_steps=20)
        >>> lines = fig.axes[0].get_lines()
        >>> [line.get_label() for line in lines]
        ['linear', 'cosine', '1-sqrt']
        >>> plt.close(fig)
        >>> [float(line.get_ydata()[100]) for line in lines]  # every shape lands on min_lr
        [1e-05, 1e-05, 1e-05]
    """
    fig, ax = _axes(ax)
    for decay in ("linear", "cosine", "1-sqrt"):
        opt = _optimizer(base_lr)
        sched = wsd_schedule(opt, total_steps, warmup_steps, decay_steps, min_lr, decay)
        ax.plot(debug_lr_schedule(sched, int(total_steps * 1.1)), label=decay)
    ax.legend(title="decay")
    _finish(
        ax,
        f"wsd(total_steps={total_steps}, warmup_steps={warmup_steps}, decay_steps={decay_steps})",
    )
    return fig


def plot_cyclical_modes(
    step_size: int = 100,
    base_lr: float = 1e-4,
    max_lr: float = 1e-3,
    gamma: float = 0.997,
    num_steps: int = 800,
    ax: Any = None,
) -> Any:
    """``CyclicalLearningRate`` in its three modes.

    Example:
        >>> from trainopt.schedules.plots import plot_cyclical_modes
        >>> import matplotlib.pyplot as plt
        >>> fig = plot_cyclical_modes(step_size=10, num_steps=80)
        >>> plt.close(fig)
        >>> lines = fig.axes[0].get_lines()
        >>> {line.get_label(): round(float(line.get_ydata()[30]), 6) for line in lines}
        {'triangular': 0.001, 'triangular2': 0.00055, 'exp_range': 0.000922}
    """
    fig, ax = _axes(ax)
    for mode in ("triangular", "triangular2", "exp_range"):
        sched = CyclicalLearningRate(_optimizer(1.0), base_lr, max_lr, step_size, mode, gamma)
        ax.plot(debug_lr_schedule(sched, num_steps), label=mode)
    ax.legend(title="mode")
    _finish(ax, f"cyclical(step_size={step_size}, gamma={gamma} for exp_range)")
    return fig


def plot_adaptive(
    initial_lr: float = 1e-3, min_lr: float = 1e-5, window: int = 10, num_steps: int = 600
) -> Any:
    """``AdaptiveLearningRate`` reacting to a loss that falls, then rises, then falls again.

    Example:
        >>> from trainopt.schedules.plots import plot_adaptive
        >>> import matplotlib.pyplot as plt
        >>> fig = plot_adaptive()
        >>> loss_axes, lr_axes = fig.axes
        >>> lrs = lr_axes.get_lines()[0].get_ydata()
        >>> plt.close(fig)
        >>> len(lrs), float(lrs[0]), bool(1e-5 <= lrs[-1] < lrs[0])  # the rate was lowered
        (600, 0.001, True)
    """
    import math

    import matplotlib.pyplot as plt

    opt = _optimizer(initial_lr)
    controller = AdaptiveLearningRate(opt, initial_lr=initial_lr, min_lr=min_lr, window=window)
    losses, lrs = [], []
    for step in range(num_steps):
        rising = 200 <= step < 350
        loss = 2.0 * math.exp(-step / 150) + (0.004 * (step - 200) if rising else 0.0)
        loss += 0.6 if step >= 350 else 0.0
        losses.append(loss)
        lrs.append(opt.param_groups[0]["lr"])
        controller.update_lr(loss)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 4.2), sharex=True)
    top.plot(losses, color="tab:orange")
    top.set_ylabel("loss")
    top.grid(alpha=0.3)
    top.set_title(
        f"AdaptiveLearningRate(initial_lr={initial_lr}, min_lr={min_lr}, window={window})",
        fontsize=10,
    )
    bottom.plot(lrs)
    _finish(bottom, "")
    return fig


def schedule_gallery(total_steps: int = 1000, base_lr: float = 1e-3) -> Any:
    """The four fixed single-curve schedules, two by two, readable in a column 800 px wide.

    Linear warm-up and decay, cosine to ``min_lr``, step decay and the custom polynomial decay,
    over 20 % more than ``total_steps`` so each shows that it holds its last value (dotted line:
    ``total_steps``). WSD and the cyclical modes have figures of their own
    (:func:`plot_wsd_decays`, :func:`plot_cyclical_modes`).

    Example:
        >>> from trainopt.schedules.plots import schedule_gallery
        >>> import matplotlib.pyplot as plt
        >>> fig = schedule_gallery(total_steps=200)
        >>> plt.close(fig)
        >>> len(fig.axes), fig.axes[2].get_title()
        (4, 'step decay')
    """
    import matplotlib.pyplot as plt

    from trainopt.schedules.registry import PolynomialDecaySchedule

    warmup = total_steps // 20
    num_steps = int(total_steps * 1.2) + 1
    custom = PolynomialDecaySchedule(base_lr, total_steps, warmup, base_lr / 10)
    panels = [
        (
            "linear warm-up + decay",
            schedule_values(
                "linear_warmup_decay",
                num_steps,
                base_lr,
                total_steps=total_steps,
                warmup_steps=warmup,
            ),
        ),
        (
            "cosine to min_lr",
            schedule_values(
                "cosine_annealing",
                num_steps,
                base_lr,
                total_steps=total_steps,
                warmup_steps=warmup,
                min_lr=base_lr / 10,
            ),
        ),
        (
            "step decay",
            schedule_values(
                "step_decay", num_steps, base_lr, decay_steps=total_steps // 4, decay_rate=0.5
            ),
        ),
        ("polynomial (custom)", [custom.get_lr(s) for s in range(num_steps)]),
    ]
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(
            2, 2, figsize=(7, 4.8), sharex=True, sharey=True, constrained_layout=True
        )
        for ax, (title, values) in zip(axes.flat, panels):
            ax.plot(values)
            ax.axvline(total_steps, color="0.6", linestyle=":", linewidth=1)
            ax.set_title(title)
            ax.grid(alpha=0.3)
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        for ax in axes[1]:
            ax.set_xlabel("step")
        for ax in axes[:, 0]:
            ax.set_ylabel("learning rate")
    return fig


def lr_monitor_figure(steps: int = 60) -> Any:
    """Train the digits MLP with two param groups under a cosine schedule; plot its LRMonitor.

    Example:
        >>> from trainopt.schedules.plots import lr_monitor_figure
        >>> import matplotlib.pyplot as plt
        >>> fig = lr_monitor_figure(steps=10)
        >>> lines = fig.axes[0].get_lines()
        >>> [(line.get_label(), len(line.get_ydata())) for line in lines]
        [('group 0', 10), ('group 1', 10)]
        >>> plt.close(fig)
        >>> [round(float(line.get_ydata().max()), 6) for line in lines]  # each group's peak rate
        [0.003, 0.001]
    """
    from trainopt.models import digits_loaders, digits_mlp
    from trainopt.schedules.adapters import cosine_annealing_schedule

    model = digits_mlp(hidden=32, depth=1)
    opt = torch.optim.AdamW(
        [
            {"params": model[0].parameters(), "lr": 3e-3},
            {"params": model[2].parameters(), "lr": 1e-3},
        ]
    )
    sched = cosine_annealing_schedule(opt, total_steps=steps, warmup_steps=steps // 10, min_lr=1e-4)
    monitor = LRMonitor(opt)
    train, _ = digits_loaders(batch_size=64)
    done = 0
    while done < steps:
        for x, y in train:
            monitor.step()
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            done += 1
            if done == steps:
                break
    fig = monitor.plot()
    fig.axes[0].set_title("LRMonitor: two param groups anneal to the same min_lr", fontsize=10)
    return fig


def digits_lr_finder_figure(num_steps: int = 100, seed: int = 0) -> Any:
    """Run a range test on the digits MLP (SGD with momentum, 1e-4 to 10) and plot it.

    Takes about a second on a CPU; the learning-rate page shows it.

    Example:
        >>> from trainopt.schedules.plots import digits_lr_finder_figure
        >>> import matplotlib.pyplot as plt
        >>> fig = digits_lr_finder_figure(num_steps=30)
        >>> ax = fig.axes[0]
        >>> ax.get_title(), ax.get_xscale()
        ('Range test on the digits MLP (...)', 'log')
        >>> lrs = ax.get_lines()[0].get_xdata()
        >>> plt.close(fig)
        >>> float(lrs[0]), len(lrs) <= 30
        (0.0001, True)
    """
    from trainopt.models import digits_loaders, digits_mlp

    model = digits_mlp(seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train, _ = digits_loaders(batch_size=64, seed=seed)
    finder = LearningRateFinder(model, optimizer, train, F.cross_entropy)
    finder.find_lr(start_lr=1e-4, end_lr=10.0, num_steps=num_steps)
    fig = finder.plot()
    fig.axes[0].set_title(f"Range test on the digits MLP ({finder.stop_reason})")
    return fig
