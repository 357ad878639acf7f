"""Learning-rate schedules: pure functions of the step, with thin adapters for torch.

Each schedule is a pure function ``(step, **settings) -> multiplier`` of the base learning rate
(:func:`linear_warmup_decay`, :func:`cosine_annealing`, :func:`step_decay`,
:func:`warmup_stable_decay`, :func:`cyclical_scale`, :func:`polynomial_decay`): easy to test,
plot and compose. The adapters (:func:`cosine_annealing_schedule` and friends) wrap them in
``torch.optim.lr_scheduler.LambdaLR``, so they drop into any loop that calls
``scheduler.step()`` and ``scheduler.get_last_lr()``. Every schedule holds its final value past
``total_steps``.

``min_lr`` is an absolute learning rate, as ``eta_min`` in ``CosineAnnealingLR``: every param
group anneals from its own base rate to the same ``min_lr``. It may not exceed any group's rate.

:func:`register_scheduler` and :func:`build_scheduler` build schedulers by name (from a config
file, see :mod:`trainopt.config`); :class:`SchedulerInterface` is the base of custom schedules.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

logger = logging.getLogger(__name__)

DECAY_SHAPES = ("linear", "cosine", "1-sqrt")
CYCLE_MODES = ("triangular", "triangular2", "exp_range")


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _check_int(name: str, value: Any, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}")


def _check_float(name: str, value: Any, low: float = 0.0, high: float = math.inf) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {name}={value!r}")


def _check_run(total_steps: int, warmup_steps: int) -> None:
    _check_int("total_steps", total_steps, 1)
    _check_int("warmup_steps", warmup_steps, 0)
    if warmup_steps >= total_steps:
        raise ValueError(
            f"warmup_steps must be less than total_steps, got {warmup_steps=}, {total_steps=}"
        )


# ---------------------------------------------------------------------------------------------
# Pure schedules: step -> multiplier of the base learning rate
# ---------------------------------------------------------------------------------------------


def linear_warmup(step: int, warmup_steps: int) -> float:
    r"""Linear warm-up from 0 to 1: :math:`s / w` for :math:`s < w`, then 1.

    Example:
        >>> [linear_warmup(s, warmup_steps=4) for s in range(6)]
        [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    """
    if step < warmup_steps:
        return step / warmup_steps
    return 1.0


def linear_warmup_decay(step: int, total_steps: int, warmup_steps: int = 0) -> float:
    r"""Linear warm-up to 1 over ``warmup_steps``, then linear decay to 0 at ``total_steps``.

    .. math::
        m(s) = \begin{cases} s / w & s < w \\ (T - s) / (T - w) & w \le s \le T \\ 0 & s > T
        \end{cases}

    Example:
        >>> [linear_warmup_decay(s, total_steps=6, warmup_steps=2) for s in (0, 1, 2, 4, 6, 9)]
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    """
    _check_run(total_steps, warmup_steps)
    if step < warmup_steps:
        return step / warmup_steps
    return max(0, total_steps - step) / (total_steps - warmup_steps)


def cosine_annealing(
    step: int, total_steps: int, warmup_steps: int = 0, min_ratio: float = 0.0
) -> float:
    r"""Linear warm-up, then half a cosine from 1 down to ``min_ratio``, held past the end.

    .. math::
        m(s) = \begin{cases} s / w & s < w \\
        r + (1 - r)\,\tfrac12\left(1 + \cos \pi p\right), \quad
        p = \min\!\left(1, \tfrac{s - w}{T - w}\right) & s \ge w \end{cases}

    where :math:`r` is ``min_ratio`` (``min_lr / base_lr``).

    Example:
        >>> [round(cosine_annealing(s, total_steps=5, warmup_steps=1, min_ratio=0.1), 4)
        ...  for s in (0, 1, 3, 5, 50)]
        [0.0, 1.0, 0.55, 0.1, 0.1]
    """
    _check_run(total_steps, warmup_steps)
    _check_float("min_ratio", min_ratio, 0.0, 1.0)
    if step < warmup_steps:
        return step / warmup_steps
    done = min(step - warmup_steps, total_steps - warmup_steps)
    cosine = (1 + math.cos(math.pi * done / (total_steps - warmup_steps))) / 2
    return min_ratio + (1 - min_ratio) * cosine


def step_decay(step: int, decay_steps: int, decay_rate: float = 0.1) -> float:
    r"""Multiply by ``decay_rate`` every ``decay_steps`` steps: :math:`m(s) = \gamma^{\lfloor s/k \rfloor}`.

    Example:
        >>> [step_decay(s, decay_steps=2, decay_rate=0.5) for s in range(6)]
        [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    """
    _check_int("decay_steps", decay_steps, 1)
    _check_float("decay_rate", decay_rate, 0.0, 1.0)
    return decay_rate ** (step // decay_steps)


def warmup_stable_decay(
    step: int,
    total_steps: int,
    warmup_steps: int,
    decay_steps: int,
    min_ratio: float = 0.0,
    decay: str = "linear",
) -> float:
    r"""Warm-up, a stable plateau at 1, then a decay to ``min_ratio`` over the last ``decay_steps``.

    With :math:`p = \min(1, (s - (T - d)) / d)` in the decay phase, the decay shapes are
    ``"linear"`` :math:`1 - p`, ``"cosine"`` :math:`\tfrac12(1 + \cos\pi p)` and ``"1-sqrt"``
    :math:`1 - \sqrt p`, each mapped onto :math:`[r, 1]`.

    Example:
        >>> [warmup_stable_decay(s, total_steps=8, warmup_steps=2, decay_steps=4, decay="1-sqrt")
        ...  for s in (0, 1, 2, 4, 5, 8, 20)]
        [0.0, 0.5, 1.0, 1.0, 0.5, 0.0, 0.0]
    """
    _check_run(total_steps, warmup_steps)
    _check_int("decay_steps", decay_steps, 1)
    if warmup_steps + decay_steps > total_steps:
        raise ValueError(
            "warmup_steps + decay_steps must not exceed total_steps, got "
            f"{warmup_steps=}, {decay_steps=}, {total_steps=}"
        )
    _check_float("min_ratio", min_ratio, 0.0, 1.0)
    if decay not in DECAY_SHAPES:
        raise ValueError(f"decay must be one of {DECAY_SHAPES}, got {decay=}")
    if step < warmup_steps:
        return step / warmup_steps
    decay_start = total_steps - decay_steps
    if step <= decay_start:
        return 1.0
    p = min(step - decay_start, decay_steps) / decay_steps
    if decay == "linear":
        shape = 1.0 - p
    elif decay == "cosine":
        shape = (1 + math.cos(math.pi * p)) / 2
    else:
        shape = 1.0 - math.sqrt(p)
    return min_ratio + (1 - min_ratio) * shape


def cyclical_scale(step: int, step_size: int, mode: str = "triangular", gamma: float = 1.0) -> float:
    r"""Height of a cyclical schedule in :math:`[0, 1]` (0 at ``base_lr``, 1 at ``max_lr``).

    A triangle rises over ``step_size`` steps and falls over the next ``step_size``. Its height
    is 1 (``"triangular"``), halves every cycle (``"triangular2"``) or shrinks by
    :math:`\gamma^s` (``"exp_range"``), as in ``torch.optim.lr_scheduler.CyclicLR``.

    Example:
        >>> [cyclical_scale(s, step_size=2) for s in range(5)]
        [0.0, 0.5, 1.0, 0.5, 0.0]
        >>> cyclical_scale(6, step_size=2, mode="triangular2")
        0.5
    """
    _check_int("step_size", step_size, 1)
    if mode not in CYCLE_MODES:
        raise ValueError(f"mode must be one of {CYCLE_MODES}, got {mode=}")
    _check_float("gamma", gamma, 0.0, 1.0)
    cycle_length = 2 * step_size
    cycle = math.floor(1 + step / cycle_length)
    x = 1.0 + step / cycle_length - cycle  # position in the cycle, in [0, 1)
    height = x / 0.5 if x <= 0.5 else (x - 1) / (0.5 - 1)
    if mode == "triangular2":
        return height * 0.5 ** (cycle - 1)  # underflows to 0 where 1 / 2**n would overflow
    if mode == "exp_range":
        return height * gamma**step
    return height


def polynomial_decay(
    step: int, total_steps: int, warmup_steps: int = 0, min_ratio: float = 0.0, power: float = 2.0
) -> float:
    r"""Linear warm-up, then :math:`r + (1 - r)(1 - p)^{k}`, smooth into ``min_ratio`` for :math:`k > 1`.

    Example:
        >>> [polynomial_decay(s, total_steps=4, power=2.0) for s in (0, 2, 4, 8)]
        [1.0, 0.25, 0.0, 0.0]
    """
    _check_run(total_steps, warmup_steps)
    _check_float("min_ratio", min_ratio, 0.0, 1.0)
    _check_float("power", power, 0.0)
    if step < warmup_steps:
        return step / warmup_steps
    p = min(step - warmup_steps, total_steps - warmup_steps) / (total_steps - warmup_steps)
    return min_ratio + (1 - min_ratio) * (1.0 - p) ** power


# ---------------------------------------------------------------------------------------------
# LambdaLR adapters
# ---------------------------------------------------------------------------------------------


def _base_lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(group.get("initial_lr", group["lr"])) for group in optimizer.param_groups]


def _min_ratios(optimizer: torch.optim.Optimizer, min_lr: float) -> list[float]:
    """``min_lr / base_lr`` per param group; ``min_lr`` is one absolute floor for all groups."""
    _check_float("min_lr", min_lr, 0.0)
    ratios = []
    for index, base in enumerate(_base_lrs(optimizer)):
        if min_lr > base:
            raise ValueError(
                f"min_lr must not exceed the learning rate of any param group, got {min_lr=} "
                f"above param_groups[{index}]['lr']={base}"
            )
        ratios.append(min_lr / base if base > 0 else 0.0)
    return ratios


def linear_warmup_decay_schedule(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 1000
) -> LambdaLR:
    """Linear warm-up from 0 to the base rate, then linear decay to 0 (see :func:`linear_warmup_decay`).

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = linear_warmup_decay_schedule(opt, total_steps=10, warmup_steps=2)
        >>> for _ in range(6):
        ...     opt.step(); sched.step()
        >>> round(sched.get_last_lr()[0], 6)
        0.05
    """
    _check_run(total_steps, warmup_steps)
    return LambdaLR(optimizer, partial(linear_warmup_decay, total_steps=total_steps, warmup_steps=warmup_steps))


def cosine_annealing_schedule(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int = 1000, min_lr: float = 0.0
) -> LambdaLR:
    """Linear warm-up, then cosine annealing to the absolute ``min_lr``, held past ``total_steps``.

    Each param group anneals from its own base rate to ``min_lr`` (see :func:`cosine_annealing`).

    Example:
        >>> opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-3)
        >>> sched = cosine_annealing_schedule(opt, total_steps=100, warmup_steps=10, min_lr=1e-5)
        >>> for _ in range(150):
        ...     opt.step(); sched.step()
        >>> sched.get_last_lr()[0]
        1e-05
    """
    _check_run(total_steps, warmup_steps)
    lambdas = [
        partial(cosine_annealing, total_steps=total_steps, warmup_steps=warmup_steps, min_ratio=ratio)
        for ratio in _min_ratios(optimizer, min_lr)
    ]
    return LambdaLR(optimizer, lambdas)


def step_decay_schedule(
    optimizer: torch.optim.Optimizer, decay_steps: int, decay_rate: float = 0.1
) -> LambdaLR:
    """Multiply the rate by ``decay_rate`` every ``decay_steps`` steps (see :func:`step_decay`).

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> sched = step_decay_schedule(opt, decay_steps=3, decay_rate=0.5)
        >>> for _ in range(6):
        ...     opt.step(); sched.step()
        >>> sched.get_last_lr()
        [0.25]
    """
    _check_int("decay_steps", decay_steps, 1)
    _check_float("decay_rate", decay_rate, 0.0, 1.0)
    return LambdaLR(optimizer, partial(step_decay, decay_steps=decay_steps, decay_rate=decay_rate))


def wsd_schedule(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_steps: int,
    decay_steps: int,
    min_lr: float = 0.0,
    decay: str = "linear",
) -> LambdaLR:
    """Warm-up, stable, decay (WSD): the base rate until the last ``decay_steps`` steps.

    ``decay`` is ``"linear"``, ``"cosine"`` or ``"1-sqrt"`` (see :func:`warmup_stable_decay`).

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> sched = wsd_schedule(opt, total_steps=10, warmup_steps=2, decay_steps=4)
        >>> lrs = []
        >>> for _ in range(10):
        ...     lrs.append(sched.get_last_lr()[0]); opt.step(); sched.step()
        >>> lrs
        [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25]
    """
    warmup_stable_decay(0, total_steps, warmup_steps, decay_steps, 0.0, decay)  # validates
    lambdas = [
        partial(warmup_stable_decay, total_steps=total_steps, warmup_steps=warmup_steps,
                decay_steps=decay_steps, min_ratio=ratio, decay=decay)
        for ratio in _min_ratios(optimizer, min_lr)
    ]
    return LambdaLR(optimizer, lambdas)


# ---------------------------------------------------------------------------------------------
# Stateful schedulers
# ---------------------------------------------------------------------------------------------


class CyclicalLearningRate(LRScheduler):
    """Cycle the rate between ``base_lr`` and ``max_lr`` (triangular, triangular2, exp_range).

    A ``torch.optim.lr_scheduler.LRScheduler``: call ``step()`` after each optimizer step and
    read ``get_last_lr()``. ``base_lr`` and ``max_lr`` are floats (one rate for every param
    group, as ``CyclicLR``) or one value per group. With ``total_steps``, the rate holds its
    value from that step on; without, it cycles forever.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> clr = CyclicalLearningRate(opt, base_lr=0.1, max_lr=0.5, step_size=2)
        >>> lrs = []
        >>> for _ in range(5):
        ...     lrs.append(round(clr.get_last_lr()[0], 6)); opt.step(); clr.step()
        >>> lrs
        [0.1, 0.3, 0.5, 0.3, 0.1]
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        base_lr: float | Sequence[float] = 1e-4,
        max_lr: float | Sequence[float] = 1e-3,
        step_size: int = 2000,
        mode: str = "triangular",
        gamma: float = 1.0,
        total_steps: int | None = None,
        last_epoch: int = -1,
    ) -> None:
        cyclical_scale(0, step_size, mode, gamma)  # validates
        if total_steps is not None:
            _check_int("total_steps", total_steps, 1)
        groups = len(optimizer.param_groups)
        self.cycle_base_lrs = self._per_group("base_lr", base_lr, groups)
        self.cycle_max_lrs = self._per_group("max_lr", max_lr, groups)
        for index, (low, high) in enumerate(zip(self.cycle_base_lrs, self.cycle_max_lrs)):
            if low > high:
                raise ValueError(f"base_lr must not exceed max_lr, got {low} > {high} for group {index}")
        self.step_size, self.mode, self.gamma, self.total_steps = step_size, mode, gamma, total_steps
        if last_epoch == -1:
            for group, lr in zip(optimizer.param_groups, self.cycle_base_lrs):
                group["lr"] = lr
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def _per_group(name: str, value: float | Sequence[float], groups: int) -> list[float]:
        values = [value] * groups if isinstance(value, (int, float)) else list(value)
        if len(values) != groups:
            raise ValueError(f"{name} needs one value per param group ({groups}), got {value!r}")
        for item in values:
            _check_float(name, item, 0.0)
        return [float(v) for v in values]

    def get_lr(self) -> list[float]:
        """The rate of each param group at step ``last_epoch`` (closed form, no recursion)."""
        step = self.last_epoch if self.total_steps is None else min(self.last_epoch, self.total_steps)
        height = cyclical_scale(step, self.step_size, self.mode, self.gamma)
        return [low + (high - low) * height for low, high in zip(self.cycle_base_lrs, self.cycle_max_lrs)]


class AdaptiveLearningRate:
    """Lower the rate while the loss rises, raise it (up to ``initial_lr``) while it falls.

    Every ``window`` calls to :meth:`update_lr`, the controller fits a least-squares line to
    the last ``window`` losses. A rising slope (or a non-finite loss) multiplies every group's
    rate by ``decrease``; a falling one by ``increase``. ``initial_lr`` and ``min_lr`` bound
    the first param group; the others move by the same factor, so their ratios to the first
    group never change.

    Losses may be device tensors: they stay on the device, and the host reads one number (the
    slope) per ``window`` steps, not one per step.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD([{"params": model.weight, "lr": 1.0},
        ...                        {"params": model.bias, "lr": 0.1}])
        >>> ctl = AdaptiveLearningRate(opt, initial_lr=1e-2, min_lr=1e-4, window=5)
        >>> for loss in [1.0, 1.1, 1.2, 1.3, 1.4]:     # rising: back off once
        ...     ctl.update_lr(torch.tensor(loss))
        >>> [round(g["lr"], 6) for g in opt.param_groups]
        [0.008, 0.0008]
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        initial_lr: float = 1e-4,
        min_lr: float = 1e-6,
        window: int = 10,
        decrease: float = 0.8,
        increase: float = 1.05,
    ) -> None:
        _check_float("initial_lr", initial_lr, 0.0)
        _check_float("min_lr", min_lr, 0.0, initial_lr)
        _check_int("window", window, 2)
        _check_float("decrease", decrease, 0.0, 1.0)
        _check_float("increase", increase, 1.0)
        self.optimizer = optimizer
        self.initial_lr, self.min_lr, self.window = float(initial_lr), float(min_lr), window
        self.decrease, self.increase = decrease, increase
        reference = float(optimizer.param_groups[0]["lr"])
        if reference <= 0:
            raise ValueError(f"param_groups[0]['lr'] must be positive, got {reference}")
        self.ratios = [float(group["lr"]) / reference for group in optimizer.param_groups]
        self.scale = 1.0  # group i's rate is initial_lr * ratios[i] * scale
        self._losses: list[Any] = []
        self._apply()

    def _apply(self) -> None:
        for group, ratio in zip(self.optimizer.param_groups, self.ratios):
            group["lr"] = self.initial_lr * ratio * self.scale

    def _slope(self) -> float:
        """Least-squares slope of the window, read to the host once."""
        losses = torch.stack([torch.as_tensor(x, dtype=torch.float64) for x in self._losses])
        t = torch.arange(len(losses), dtype=torch.float64, device=losses.device)
        t = t - t.mean()
        return float((t * (losses - losses.mean())).sum() / (t * t).sum())

    def update_lr(self, loss: float | torch.Tensor) -> None:
        """Record one loss; every ``window`` calls, move the rate by the loss trend."""
        self._losses.append(loss.detach() if torch.is_tensor(loss) else float(loss))
        if len(self._losses) < self.window:
            return
        slope = self._slope()
        self._losses.clear()
        floor = self.min_lr / self.initial_lr
        if not math.isfinite(slope) or slope > 0:
            self.scale = max(self.scale * self.decrease, floor)
        else:
            self.scale = min(self.scale * self.increase, 1.0)
        self._apply()

    def get_last_lr(self) -> list[float]:
        """The rate of each param group, as a torch scheduler reports it."""
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "ratios": list(self.ratios),
                "losses": [float(x) for x in self._losses]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.ratios = [float(r) for r in state["ratios"]]
        self._losses = [float(x) for x in state["losses"]]
        self._apply()


# ---------------------------------------------------------------------------------------------
# Custom schedules and the registry
# ---------------------------------------------------------------------------------------------


class SchedulerInterface:
    """Base of a custom schedule: subclasses set up in ``__init__`` and define :meth:`get_lr`.

    ``get_lr(step)`` returns the rate for a group whose base rate is ``base_lr``;
    :meth:`as_lr_scheduler` turns it into a ``LambdaLR`` in which every param group follows the
    same curve scaled to its own base rate. Register a subclass with :func:`register_scheduler`
    to build it from a config.

    Example:
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
        >>> schedule = PolynomialDecaySchedule(base_lr=1e-3, total_steps=100, min_lr=1e-5)
        >>> schedule.get_lr(0), schedule.get_lr(100), schedule.get_lr(500)
        (0.001, 1e-05, 1e-05)
    """

    def __init__(
        self, base_lr: float, total_steps: int, warmup_steps: int = 0, min_lr: float = 0.0,
        power: float = 2.0,
    ) -> None:
        super().__init__(base_lr)
        _check_float("min_lr", min_lr, 0.0, self.base_lr)
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
        >>> register_scheduler("polynomial", PolynomialDecaySchedule)
        <class 'trainopt.schedules.PolynomialDecaySchedule'>
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
        >>> names = registered_schedulers()
        >>> {"cosine_annealing", "cyclical", "step_decay", "wsd"} <= set(names), names == sorted(names)
        (True, True)
    """
    return sorted(_REGISTRY)


def scheduler_parameters(name: str) -> dict[str, Any]:
    """The settings a registered scheduler takes, as ``inspect.Parameter`` objects by name.

    ``optimizer`` (and ``base_lr`` of a :class:`SchedulerInterface`) are left out: they come
    from the optimizer, not from a config.

    Example:
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
        key: p for key, p in signature.parameters.items()
        if key not in skip and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def build_scheduler(optimizer: torch.optim.Optimizer, config: Any) -> Any:
    """Build a registered scheduler from a config.

    ``config`` is a mapping ``{"type": name, **settings}``, a
    :class:`trainopt.config.SchedulerConfig`, or a :class:`trainopt.config.Config` (its
    ``scheduler`` is used).

    Example:
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
        return factory(base_lr=_base_lrs(optimizer)[0], **settings).as_lr_scheduler(optimizer)
    return factory(optimizer, **settings)


register_scheduler("linear_warmup_decay", linear_warmup_decay_schedule)
register_scheduler("cosine_annealing", cosine_annealing_schedule)
register_scheduler("step_decay", step_decay_schedule)
register_scheduler("wsd", wsd_schedule)
register_scheduler("cyclical", CyclicalLearningRate)


# ---------------------------------------------------------------------------------------------
# Debugging
# ---------------------------------------------------------------------------------------------


def debug_lr_schedule(
    scheduler: LRScheduler, num_steps: int, group: int = 0, log_every: int | None = None
) -> list[float]:
    """Step a scheduler ``num_steps`` times and return the rate of one group at each step.

    Entry ``i`` is the rate the optimizer uses for step ``i`` (from ``get_last_lr()``). The
    scheduler and the optimizer's rates are restored afterwards, so this is safe to call before
    training. With ``log_every``, logs the rate every ``log_every`` steps at INFO level.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> sched = step_decay_schedule(opt, decay_steps=2, decay_rate=0.5)
        >>> debug_lr_schedule(sched, 5)
        [1.0, 1.0, 0.5, 0.5, 0.25]
        >>> sched.get_last_lr(), sched.last_epoch
        ([1.0], 0)
    """
    import warnings

    _check_int("num_steps", num_steps, 0)
    state = scheduler.state_dict()
    saved_lrs = [g["lr"] for g in scheduler.optimizer.param_groups]
    lrs = []
    try:
        with warnings.catch_warnings():
            # Stepping without optimizer.step() is the point here, not a mistake.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            for step in range(num_steps):
                lr = float(scheduler.get_last_lr()[group])
                lrs.append(lr)
                if log_every and step % log_every == 0:
                    logger.info("step %d: lr = %.3e", step, lr)
                scheduler.step()
    finally:
        scheduler.load_state_dict(state)
        for g, lr in zip(scheduler.optimizer.param_groups, saved_lrs):
            g["lr"] = lr
    return lrs
