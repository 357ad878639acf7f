"""A learning rate that follows the loss trend: lower while it rises, higher while it falls."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from trainopt.schedules.validation import check_float, check_int


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
        >>> import torch
        >>> from trainopt.schedules import AdaptiveLearningRate
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
        check_float("initial_lr", initial_lr, 0.0)
        check_float("min_lr", min_lr, 0.0, initial_lr)
        check_int("window", window, 2)
        check_float("decrease", decrease, 0.0, 1.0)
        check_float("increase", increase, 1.0)
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
        return {
            "scale": self.scale,
            "ratios": list(self.ratios),
            "losses": [float(x) for x in self._losses],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.ratios = [float(r) for r in state["ratios"]]
        self._losses = [float(x) for x in state["losses"]]
        self._apply()
