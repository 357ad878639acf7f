"""Learning-rate schedules as pure functions of the step.

Each function maps ``step`` (0-based) to a multiplier of the base learning rate. Pure functions
are easy to test, plot and compose; the adapters in :mod:`trainopt.schedules.adapters` turn
them into ``torch.optim.lr_scheduler.LambdaLR``. Every schedule holds its final value past
``total_steps``.
"""

from __future__ import annotations

import math

from trainopt.schedules.validation import check_float, check_int, check_run

DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


CYCLE_MODES = ("triangular", "triangular2", "exp_range")


def linear_warmup(step: int, warmup_steps: int) -> float:
    r"""Linear warm-up from 0 to 1: :math:`s / w` for :math:`s < w`, then 1.

    Example:
        >>> from trainopt.schedules.functions import linear_warmup
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
        >>> from trainopt.schedules import linear_warmup_decay
        >>> [linear_warmup_decay(s, total_steps=6, warmup_steps=2) for s in (0, 1, 2, 4, 6, 9)]
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    """
    check_run(total_steps, warmup_steps)
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
        >>> from trainopt.schedules import cosine_annealing
        >>> [round(cosine_annealing(s, total_steps=5, warmup_steps=1, min_ratio=0.1), 4)
        ...  for s in (0, 1, 3, 5, 50)]
        [0.0, 1.0, 0.55, 0.1, 0.1]
    """
    check_run(total_steps, warmup_steps)
    check_float("min_ratio", min_ratio, 0.0, 1.0)
    if step < warmup_steps:
        return step / warmup_steps
    done = min(step - warmup_steps, total_steps - warmup_steps)
    cosine = (1 + math.cos(math.pi * done / (total_steps - warmup_steps))) / 2
    return min_ratio + (1 - min_ratio) * cosine


def step_decay(step: int, decay_steps: int, decay_rate: float = 0.1) -> float:
    r"""Multiply by ``decay_rate`` every ``decay_steps`` steps:
    :math:`m(s) = \gamma^{\lfloor s/k \rfloor}`.

    Example:
        >>> from trainopt.schedules import step_decay
        >>> [step_decay(s, decay_steps=2, decay_rate=0.5) for s in range(6)]
        [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    """
    check_int("decay_steps", decay_steps, 1)
    check_float("decay_rate", decay_rate, 0.0, 1.0)
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
        >>> from trainopt.schedules import warmup_stable_decay
        >>> [warmup_stable_decay(s, total_steps=8, warmup_steps=2, decay_steps=4, decay="1-sqrt")
        ...  for s in (0, 1, 2, 4, 5, 8, 20)]
        [0.0, 0.5, 1.0, 1.0, 0.5, 0.0, 0.0]
    """
    check_run(total_steps, warmup_steps)
    check_int("decay_steps", decay_steps, 1)
    if warmup_steps + decay_steps > total_steps:
        raise ValueError(
            "warmup_steps + decay_steps must not exceed total_steps, got "
            f"{warmup_steps=}, {decay_steps=}, {total_steps=}"
        )
    check_float("min_ratio", min_ratio, 0.0, 1.0)
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


def cyclical_scale(
    step: int, step_size: int, mode: str = "triangular", gamma: float = 1.0
) -> float:
    r"""Height of a cyclical schedule in :math:`[0, 1]` (0 at ``base_lr``, 1 at ``max_lr``).

    A triangle rises over ``step_size`` steps and falls over the next ``step_size``. Its height
    is 1 (``"triangular"``), halves every cycle (``"triangular2"``) or shrinks by
    :math:`\gamma^s` (``"exp_range"``), as in ``torch.optim.lr_scheduler.CyclicLR``.

    Example:
        >>> from trainopt.schedules import cyclical_scale
        >>> [cyclical_scale(s, step_size=2) for s in range(5)]
        [0.0, 0.5, 1.0, 0.5, 0.0]
        >>> cyclical_scale(6, step_size=2, mode="triangular2")
        0.5
    """
    check_int("step_size", step_size, 1)
    if mode not in CYCLE_MODES:
        raise ValueError(f"mode must be one of {CYCLE_MODES}, got {mode=}")
    check_float("gamma", gamma, 0.0, 1.0)
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
    r"""Linear warm-up, then :math:`r + (1 - r)(1 - p)^{k}`, smooth into ``min_ratio`` for
    :math:`k > 1`.

    Example:
        >>> from trainopt.schedules.functions import polynomial_decay
        >>> [polynomial_decay(s, total_steps=4, power=2.0) for s in (0, 2, 4, 8)]
        [1.0, 0.25, 0.0, 0.0]
    """
    check_run(total_steps, warmup_steps)
    check_float("min_ratio", min_ratio, 0.0, 1.0)
    check_float("power", power, 0.0)
    if step < warmup_steps:
        return step / warmup_steps
    p = min(step - warmup_steps, total_steps - warmup_steps) / (total_steps - warmup_steps)
    return min_ratio + (1 - min_ratio) * (1.0 - p) ** power
