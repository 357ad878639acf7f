"""Schedulers by name: custom schedules, the registry, and building a scheduler from a config."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from trainopt.schedules.adapters import (
    base_lrs,
    cosine_annealing_schedule,
    linear_warmup_decay_schedule,
    step_decay_schedule,
    wsd_schedule,
)
from trainopt.schedules.cyclical import CyclicalLearningRate
from trainopt.schedules.functions import polynomial_decay
from trainopt.schedules.validation import check_float


class SchedulerInterface:
    """Base of a custom schedule: subclasses set up in ``__init__`` and define :meth:`get_lr`.

    ``get_lr(step)`` returns the rate for a group whose base rate is ``base_lr``;
    :meth:`as_lr_scheduler` turns it into a ``LambdaLR`` in which every param group follows the
    same curve scaled to its own base rate. Register a subclass with :func:`register_scheduler`
    to build it from a config.

    Example:
        >>> import torch
        >>> from trainopt.schedules import SchedulerInterface
        >>> class Halving(SchedulerInterface):
        ...     def get_lr(self, step):
        ...         return self.base_lr * 0.5 ** (step // 10)
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = Halving(base_lr=0.1).as_lr_scheduler(opt)
        >>> for _ in range(20):
        ...     opt.step(); sched.step()
        >>> Halving(0.1).multiplier(15), round(opt.param_groups[0]["lr"], 6)
        (0.5, 0.025)
    """

    def __init__(self, base_lr: float) -> None:
        if isinstance(base_lr, bool) or not isinstance(base_lr, (int, float)) or not base_lr > 0:
            raise ValueError(f"base_lr must be a positive number, got {base_lr=}")
        self.base_lr = float(base_lr)

    def get_lr(self, step: int) -> float:
        """The learning rate at ``step`` (0-based) for a group whose base rate is ``base_lr``."""
        raise NotImplementedError(f"{type(self).__name__} must define get_lr(step)")

    def multiplier(self, step: int) -> float:
        """``get_lr(step) / base_lr``: the factor ``LambdaLR`` applies to each group."""
        return self.get_lr(step) / self.base_lr

    def as_lr_scheduler(self, optimizer: torch.optim.Optimizer) -> LambdaLR:
        """A ``LambdaLR`` that follows this schedule."""
        return LambdaLR(optimizer, self.multiplier)


class PolynomialDecaySchedule(SchedulerInterface):
    """Warm-up, then a polynomial decay that lands smoothly on ``min_lr`` at ``total_steps``.

    With ``power > 1`` the slope reaches zero at ``total_steps``: no kink, unlike clamping a
    cosine with ``max(lr, min_lr)``. The rate holds ``min_lr`` afterwards.

    Example:
        >>> from trainopt.schedules import PolynomialDecaySchedule
        >>> schedule = PolynomialDecaySchedule(base_lr=1e-3, total_steps=100, min_lr=1e-5)
        >>> schedule.get_lr(0), schedule.get_lr(100), schedule.get_lr(500)
        (0.001, 1e-05, 1e-05)
    """

    def __init__(
        self,
        base_lr: float,
        total_steps: int,
        warmup_steps: int = 0,
        min_lr: float = 0.0,
        power: float = 2.0,
    ) -> None:
        super().__init__(base_lr)
        check_float("min_lr", min_lr, 0.0, self.base_lr)
        polynomial_decay(0, total_steps, warmup_steps, 0.0, power)  # validates
        self.total_steps, self.warmup_steps = total_steps, warmup_steps
        self.min_lr, self.power = float(min_lr), float(power)

    def get_lr(self, step: int) -> float:
        ratio = self.min_lr / self.base_lr
        return self.base_lr * polynomial_decay(
            step, self.total_steps, self.warmup_steps, ratio, self.power
        )


SchedulerFactory = Callable[..., Any]


_REGISTRY: dict[str, SchedulerFactory] = {}


def register_scheduler(name: str, factory: SchedulerFactory | None = None) -> Any:
    """Make a scheduler buildable by name with :func:`build_scheduler` (and from configs).

    ``factory`` is a :class:`SchedulerInterface` subclass (built with ``base_lr`` set to the
    first param group's rate) or a callable ``factory(optimizer, **settings)`` returning a torch
    scheduler. Use it directly or as a class decorator. Registering the same object twice is
    harmless; a different object under a taken name is an error.

    Example:
        >>> from trainopt.schedules import PolynomialDecaySchedule
        >>> from trainopt.schedules import register_scheduler
        >>> from trainopt.schedules.registry import registered_schedulers
        >>> register_scheduler("polynomial", PolynomialDecaySchedule)
        <class 'trainopt.schedules.registry.PolynomialDecaySchedule'>
        >>> "polynomial" in registered_schedulers()
        True
    """
    if factory is None:
        return partial(register_scheduler, name)
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name=}")
    if not callable(factory):
        raise ValueError(f"factory must be callable, got {factory!r}")
    if name in _REGISTRY and _REGISTRY[name] is not factory:
        raise ValueError(f"a scheduler named {name!r} is already registered: {_REGISTRY[name]!r}")
    _REGISTRY[name] = factory
    return factory


def registered_schedulers() -> list[str]:
    """Names :func:`build_scheduler` accepts, sorted.

    Example:
        >>> from trainopt.schedules.registry import registered_schedulers
        >>> names = registered_schedulers()
        >>> expected = {"cosine_annealing", "cyclical", "step_decay", "wsd"}
        >>> expected <= set(names), names == sorted(names)
        (True, True)
    """
    return sorted(_REGISTRY)


def scheduler_parameters(name: str) -> dict[str, Any]:
    """The settings a registered scheduler takes, as ``inspect.Parameter`` objects by name.

    ``optimizer`` (and ``base_lr`` of a :class:`SchedulerInterface`) are left out: they come
    from the optimizer, not from a config.

    Example:
        >>> from trainopt.schedules.registry import scheduler_parameters
        >>> params = scheduler_parameters("cosine_annealing")
        >>> list(params), params["warmup_steps"].default
        (['total_steps', 'warmup_steps', 'min_lr'], 1000)
        >>> params["total_steps"].default is params["total_steps"].empty  # required
        True
    """
    if name not in _REGISTRY:
        raise ValueError(f"type must be one of {registered_schedulers()}, got {name!r}")
    factory = _REGISTRY[name]
    signature = inspect.signature(factory.__init__ if isinstance(factory, type) else factory)
    skip = {"self", "optimizer", "last_epoch"}
    if isinstance(factory, type) and issubclass(factory, SchedulerInterface):
        skip.add("base_lr")  # taken from the optimizer
    return {
        key: p
        for key, p in signature.parameters.items()
        if key not in skip and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def build_scheduler(optimizer: torch.optim.Optimizer, config: Any) -> Any:
    """Build a registered scheduler from a config.

    ``config`` is a mapping ``{"type": name, **settings}``, a
    :class:`trainopt.config.training.SchedulerConfig`, or a
    :class:`trainopt.config.training.Config` (its ``scheduler`` is used).

    Example:
        >>> import torch
        >>> from trainopt.schedules import build_scheduler
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = build_scheduler(opt, {"type": "step_decay", "decay_steps": 10})
        >>> type(sched).__name__
        'LambdaLR'
    """
    config = getattr(config, "scheduler", config)
    if isinstance(config, Mapping):
        settings = dict(config)
        name = settings.pop("type", None)
    else:
        name, settings = config.type, dict(config.params)
    if name not in _REGISTRY:
        raise ValueError(f"type must be one of {registered_schedulers()}, got {name!r}")
    factory = _REGISTRY[name]
    allowed = scheduler_parameters(name)
    unknown = sorted(set(settings) - set(allowed))
    if unknown:
        raise ValueError(f"{unknown[0]} is not a setting of {name!r}; allowed: {sorted(allowed)}")
    if isinstance(factory, type) and issubclass(factory, SchedulerInterface):
        return factory(base_lr=base_lrs(optimizer)[0], **settings).as_lr_scheduler(optimizer)
    return factory(optimizer, **settings)


register_scheduler("linear_warmup_decay", linear_warmup_decay_schedule)


register_scheduler("cosine_annealing", cosine_annealing_schedule)


register_scheduler("step_decay", step_decay_schedule)


register_scheduler("wsd", wsd_schedule)


register_scheduler("cyclical", CyclicalLearningRate)
