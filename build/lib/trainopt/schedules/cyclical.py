"""Cyclical learning rates (Smith 2017) as a ``torch.optim.lr_scheduler.LRScheduler``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.optim.lr_scheduler import LRScheduler

from trainopt.schedules.functions import cyclical_scale
from trainopt.schedules.validation import check_float, check_int


class CyclicalLearningRate(LRScheduler):
    """Cycle the rate between ``base_lr`` and ``max_lr`` (triangular, triangular2, exp_range).

    A ``torch.optim.lr_scheduler.LRScheduler``: call ``step()`` after each optimizer step and
    read ``get_last_lr()``. ``base_lr`` and ``max_lr`` are floats (one rate for every param
    group, as ``CyclicLR``) or one value per group. With ``total_steps``, the rate holds its
    value from that step on; without, it cycles forever.

    Example:
        >>> import torch
        >>> from trainopt.schedules import CyclicalLearningRate
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
            check_int("total_steps", total_steps, 1)
        groups = len(optimizer.param_groups)
        self.cycle_base_lrs = self._per_group("base_lr", base_lr, groups)
        self.cycle_max_lrs = self._per_group("max_lr", max_lr, groups)
        for index, (low, high) in enumerate(zip(self.cycle_base_lrs, self.cycle_max_lrs)):
            if low > high:
                raise ValueError(
                    f"base_lr must not exceed max_lr, got {low} > {high} for group {index}"
                )
        self.step_size, self.mode, self.gamma, self.total_steps = (
            step_size,
            mode,
            gamma,
            total_steps,
        )
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
            check_float(name, item, 0.0)
        return [float(v) for v in values]

    def get_lr(self) -> list[float]:
        """The rate of each param group at step ``last_epoch`` (closed form, no recursion)."""
        step = (
            self.last_epoch if self.total_steps is None else min(self.last_epoch, self.total_steps)
        )
        height = cyclical_scale(step, self.step_size, self.mode, self.gamma)
        return [
            low + (high - low) * height
            for low, high in zip(self.cycle_base_lrs, self.cycle_max_lrs)
        ]
