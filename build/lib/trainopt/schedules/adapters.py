"""The pure schedules as ``torch.optim.lr_scheduler.LambdaLR``: drop-in schedulers for any loop.

``min_lr`` is an absolute learning rate, as ``eta_min`` in ``CosineAnnealingLR``: every param
group anneals from its own base rate to the same ``min_lr``, which may not exceed any group's rate.
"""

from __future__ import annotations

from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR

from trainopt.schedules.functions import (
    cosine_annealing,
    linear_warmup_decay,
    step_decay,
    warmup_stable_decay,
)
from trainopt.schedules.validation import check_float, check_int, check_run


def base_lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    """Each param group's base rate: ``initial_lr`` once a scheduler has set it, else ``lr``.

    Example:
        >>> import torch
        >>> from trainopt.schedules.adapters import base_lrs
        >>> weight, bias = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
        >>> groups = [{"params": [weight]}, {"params": [bias], "lr": 0.01}]
        >>> base_lrs(torch.optim.SGD(groups, lr=0.1))
        [0.1, 0.01]
    """
    return [float(group.get("initial_lr", group["lr"])) for group in optimizer.param_groups]


def min_lr_ratios(optimizer: torch.optim.Optimizer, min_lr: float) -> list[float]:
    """``min_lr / base_lr`` per param group: one absolute floor ``min_lr`` for every group.

    Raises:
        ValueError: ``min_lr`` is negative or above some group's base rate; the message names
            the group.

    Example:
        >>> import torch
        >>> from trainopt.schedules.adapters import min_lr_ratios
        >>> weight, bias = torch.zeros(2, requires_grad=True), torch.zeros(1, requires_grad=True)
        >>> groups = [{"params": [weight]}, {"params": [bias], "lr": 0.01}]
        >>> optimizer = torch.optim.SGD(groups, lr=0.1)
        >>> [round(r, 6) for r in min_lr_ratios(optimizer, min_lr=0.001)]
        [0.01, 0.1]
    """
    check_float("min_lr", min_lr, 0.0)
    ratios = []
    for index, base in enumerate(base_lrs(optimizer)):
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
    """Linear warm-up from 0 to the base rate, then linear decay to 0
    (see :func:`linear_warmup_decay`).

    Example:
        >>> import torch
        >>> from trainopt.schedules import linear_warmup_decay_schedule
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> sched = linear_warmup_decay_schedule(opt, total_steps=10, warmup_steps=2)
        >>> for _ in range(6):
        ...     opt.step(); sched.step()
        >>> round(sched.get_last_lr()[0], 6)
        0.05
    """
    check_run(total_steps, warmup_steps)
    return LambdaLR(
        optimizer, partial(linear_warmup_decay, total_steps=total_steps, warmup_steps=warmup_steps)
    )


def cosine_annealing_schedule(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_steps: int = 1000,
    min_lr: float = 0.0,
) -> LambdaLR:
    """Linear warm-up, then cosine annealing to the absolute ``min_lr``, held past ``total_steps``.

    Each param group anneals from its own base rate to ``min_lr`` (see :func:`cosine_annealing`).

    Example:
        >>> import torch
        >>> from trainopt.schedules import cosine_annealing_schedule
        >>> opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-3)
        >>> sched = cosine_annealing_schedule(opt, total_steps=100, warmup_steps=10, min_lr=1e-5)
        >>> for _ in range(150):
        ...     opt.step(); sched.step()
        >>> sched.get_last_lr()[0]
        1e-05
    """
    check_run(total_steps, warmup_steps)
    lambdas = [
        partial(
            cosine_annealing, total_steps=total_steps, warmup_steps=warmup_steps, min_ratio=ratio
        )
        for ratio in min_lr_ratios(optimizer, min_lr)
    ]
    return LambdaLR(optimizer, lambdas)


def step_decay_schedule(
    optimizer: torch.optim.Optimizer, decay_steps: int, decay_rate: float = 0.1
) -> LambdaLR:
    """Multiply the rate by ``decay_rate`` every ``decay_steps`` steps (see :func:`step_decay`).

    Example:
        >>> import torch
        >>> from trainopt.schedules import step_decay_schedule
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> sched = step_decay_schedule(opt, decay_steps=3, decay_rate=0.5)
        >>> for _ in range(6):
        ...     opt.step(); sched.step()
        >>> sched.get_last_lr()
        [0.25]
    """
    check_int("decay_steps", decay_steps, 1)
    check_float("decay_rate", decay_rate, 0.0, 1.0)
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
        >>> import torch
        >>> from trainopt.schedules import wsd_schedule
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
        partial(
            warmup_stable_decay,
            total_steps=total_steps,
            warmup_steps=warmup_steps,
            decay_steps=decay_steps,
            min_ratio=ratio,
            decay=decay,
        )
        for ratio in min_lr_ratios(optimizer, min_lr)
    ]
    return LambdaLR(optimizer, lambdas)
