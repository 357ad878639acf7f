"""Record the learning rate every param group actually uses, step by step."""

from __future__ import annotations

from typing import Any

import torch


class LRMonitor:
    """Record the learning rate of every parameter group after each step.

    Call :meth:`step` once per optimizer step, after ``scheduler.step()``. The recorded history
    reads the rates the optimizer will actually use next, which is what a plot should show.
    Tensor learning rates (as fused AdamW accepts) are recorded without a host sync and read
    on the host only when :attr:`history` is accessed.

    Example:
        >>> import torch
        >>> from trainopt.schedules import LRMonitor
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD([{"params": model.weight, "lr": 0.1},
        ...                        {"params": model.bias, "lr": 0.01}])
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        >>> monitor = LRMonitor(opt)
        >>> for _ in range(4):
        ...     opt.step(); sched.step(); monitor.step()
        >>> [round(lr, 4) for lr in monitor.history[-1]]
        [0.025, 0.0025]
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self._history: list[list[Any]] = []

    def step(self) -> None:
        """Record the current learning rate of each parameter group."""
        self._history.append(
            [
                g["lr"].detach().clone() if torch.is_tensor(g["lr"]) else float(g["lr"])
                for g in self.optimizer.param_groups
            ]
        )

    @property
    def history(self) -> list[list[float]]:
        """Learning rates as ``history[step][group]`` floats."""
        return [[float(lr) for lr in row] for row in self._history]

    def plot(self, ax: Any = None, log: bool = False) -> Any:
        """Plot the recorded learning rates (one line per group) and return the Figure."""
        import matplotlib.pyplot as plt

        fig = ax.figure if ax is not None else plt.figure(figsize=(6, 3.2))
        ax = ax if ax is not None else fig.add_subplot()
        history = self.history
        for group in range(len(history[0]) if history else 0):
            ax.plot([row[group] for row in history], label=f"group {group}")
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        if log:
            ax.set_yscale("log")
        if history and len(history[0]) > 1:
            ax.legend()
        ax.grid(alpha=0.3)
        return fig

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._history = [list(row) for row in state["history"]]
