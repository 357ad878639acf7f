"""Cut the learning rate so that the whole later schedule is cut: floors, cycles and all.

A scheduler recomputes ``param_group["lr"]`` from rates it keeps itself, so halving
``param_group["lr"]`` alone (the usual recovery) is undone or distorted at the next ``step()``.
:func:`scale_learning_rate` multiplies every rate a scheduler keeps. The guarantee: after
``scale_learning_rate(optimizer, f, scheduler)``, every later rate is ``f`` times the rate the
run would have had without the call, floors included, and two cuts compound.

What each scheduler keeps (only the exact classes below; a subclass may compute its rates
otherwise and is refused):

- ``LambdaLR``, ``MultiplicativeLR``, ``StepLR``, ``MultiStepLR``, ``ConstantLR``, ``LinearLR``,
  ``ExponentialLR``, ``PolynomialLR``: ``base_lrs`` (the chainable forms read ``lr``; the closed
  forms, which ``SequentialLR`` uses at its milestones, read ``base_lrs``);
- ``CosineAnnealingLR``, ``CosineAnnealingWarmRestarts``: ``base_lrs`` and ``eta_min``, an
  absolute floor;
- ``CyclicLR``: ``base_lrs`` and ``max_lrs``, its own bounds;
- ``OneCycleLR``: each group's ``initial_lr``, ``max_lr`` and ``min_lr``;
- ``SequentialLR``, ``ChainedScheduler``: every scheduler they hold;
- ``ReduceLROnPlateau``: ``min_lrs`` and ``eps`` (the smallest change it makes);
- trainopt's ``CyclicalLearningRate``: its ``cycle_base_lrs`` and ``cycle_max_lrs``;
- trainopt's ``AdaptiveLearningRate``: its per-group ``ratios`` (its floor follows).

The ``LambdaLR`` schedules of :mod:`trainopt.schedules` keep ``min_lr`` as a fraction of the
base rate, so their floors follow ``base_lrs``. Each group also gets ``initial_lr`` (what a
scheduler built later starts from) and ``lr_scale``, the product of every cut so far, which a
checkpoint of the optimizer carries: a rollback compares it with the scale it wants.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim import lr_scheduler as torch_schedulers

from trainopt.schedules.adaptive import AdaptiveLearningRate
from trainopt.schedules.cyclical import CyclicalLearningRate

__all__ = [
    "LR_SCALE_KEY",
    "UnsupportedSchedulerError",
    "check_scalable",
    "lr_scale",
    "scale_learning_rate",
]

LR_SCALE_KEY = "lr_scale"


class UnsupportedSchedulerError(TypeError):
    """A scheduler whose rates :func:`scale_learning_rate` does not know how to scale.

    Example:
        >>> import torch
        >>> from trainopt.stability import UnsupportedSchedulerError
        >>> from trainopt.stability.recovery.rates import check_scalable
        >>> class Mine(torch.optim.lr_scheduler.StepLR):
        ...     pass
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> try:
        ...     check_scalable(Mine(opt, step_size=10))
        ... except UnsupportedSchedulerError as error:
        ...     print(str(error).split(":")[0])
        scale_learning_rate cannot cut the rates of Mine
    """


def _scale_list(obj: Any, name: str, factor: float) -> None:
    setattr(obj, name, [value * factor for value in getattr(obj, name)])


def _lr_lists(scheduler: Any, factor: float, *names: str) -> None:
    for name in ("base_lrs", "_last_lr", *names):
        if hasattr(scheduler, name):
            _scale_list(scheduler, name, factor)


def _cosine(scheduler: Any, factor: float) -> None:
    _lr_lists(scheduler, factor)
    scheduler.eta_min = scheduler.eta_min * factor


def _one_cycle(scheduler: Any, factor: float) -> None:
    _lr_lists(scheduler, factor)
    for group in scheduler.optimizer.param_groups:
        group["max_lr"] = group["max_lr"] * factor
        group["min_lr"] = group["min_lr"] * factor


def _plateau(scheduler: Any, factor: float) -> None:
    _lr_lists(scheduler, factor, "min_lrs")
    if scheduler.default_min_lr is not None:
        scheduler.default_min_lr = scheduler.default_min_lr * factor
    scheduler.eps = scheduler.eps * factor


def _nested(scheduler: Any, factor: float) -> None:
    _lr_lists(scheduler, factor)
    for inner in scheduler._schedulers:
        _HANDLERS[type(inner)](inner, factor)


_HANDLERS: dict[type, Callable[[Any, float], None]] = {
    **{
        cls: _lr_lists
        for cls in (
            torch_schedulers.LambdaLR,
            torch_schedulers.MultiplicativeLR,
            torch_schedulers.StepLR,
            torch_schedulers.MultiStepLR,
            torch_schedulers.ConstantLR,
            torch_schedulers.LinearLR,
            torch_schedulers.ExponentialLR,
            torch_schedulers.PolynomialLR,
        )
    },
    torch_schedulers.CosineAnnealingLR: _cosine,
    torch_schedulers.CosineAnnealingWarmRestarts: _cosine,
    torch_schedulers.CyclicLR: lambda s, f: _lr_lists(s, f, "max_lrs"),
    torch_schedulers.OneCycleLR: _one_cycle,
    torch_schedulers.SequentialLR: _nested,
    torch_schedulers.ChainedScheduler: _nested,
    torch_schedulers.ReduceLROnPlateau: _plateau,
    CyclicalLearningRate: lambda s, f: _lr_lists(s, f, "cycle_base_lrs", "cycle_max_lrs"),
    AdaptiveLearningRate: lambda s, f: _scale_list(s, "ratios", f),
}


def check_scalable(scheduler: Any) -> None:
    """Raise :class:`UnsupportedSchedulerError`, naming the class, unless every rate can be cut.

    Example:
        >>> import torch
        >>> from trainopt.stability.recovery.rates import check_scalable
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10, eta_min=0.01)
        >>> check_scalable(cosine) is None
        True
    """
    if scheduler is None:
        return
    if type(scheduler) not in _HANDLERS:
        known = sorted(cls.__name__ for cls in _HANDLERS)
        raise UnsupportedSchedulerError(
            f"scale_learning_rate cannot cut the rates of {type(scheduler).__name__}: it does not "
            "know where "
            f"{type(scheduler).__name__} keeps them (supported: {', '.join(known)})"
        )
    for inner in getattr(scheduler, "_schedulers", []):
        check_scalable(inner)


def lr_scale(optimizer: torch.optim.Optimizer) -> float:
    """The product of the cuts applied to ``optimizer`` so far (1.0 before any; group 0's).

    Example:
        >>> import torch
        >>> from trainopt.stability import lr_scale, scale_learning_rate
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> scale_learning_rate(opt, 0.5); scale_learning_rate(opt, 0.5)
        >>> lr_scale(opt)
        0.25
    """
    return float(optimizer.param_groups[0].get(LR_SCALE_KEY, 1.0))


def scale_learning_rate(
    optimizer: torch.optim.Optimizer, factor: float, scheduler: Any = None
) -> None:
    """Multiply the learning rate by ``factor`` now and in every later step of ``scheduler``.

    Scales each group's ``lr`` (a tensor rate in place), ``initial_lr`` and ``lr_scale``, and
    every rate the scheduler keeps (see the module notes). An unsupported scheduler is refused
    before anything changes.

    Args:
        optimizer: The optimizer whose groups to scale.
        factor: Positive multiplier (``0.5`` halves the learning rate).
        scheduler: The scheduler driving ``optimizer``, if any: a ``torch.optim.lr_scheduler``
            scheduler, or a :mod:`trainopt.schedules` one.

    Raises:
        UnsupportedSchedulerError: ``scheduler``'s class is not one of the supported ones.

    Example:
        >>> import torch
        >>> from trainopt.stability import scale_learning_rate
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=0.2)
        >>> scale_learning_rate(opt, 0.5, sched)
        >>> for _ in range(4):
        ...     opt.step(); sched.step()
        >>> round(opt.param_groups[0]["lr"], 6)  # at T_max: the floor eta_min=0.2, halved too
        0.1
    """
    if (
        not isinstance(factor, (int, float))
        or isinstance(factor, bool)
        or not 0 < factor < math.inf
    ):
        raise ValueError(f"factor must be a positive finite number, got {factor=}")
    check_scalable(scheduler)
    if scheduler is not None:
        _HANDLERS[type(scheduler)](scheduler, factor)
    for group in optimizer.param_groups:
        if torch.is_tensor(group["lr"]):
            group["lr"].mul_(factor)
        else:
            group["lr"] = group["lr"] * factor
        if "initial_lr" in group:
            group["initial_lr"] = group["initial_lr"] * factor
        group[LR_SCALE_KEY] = group.get(LR_SCALE_KEY, 1.0) * factor
