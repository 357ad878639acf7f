"""The learning-rate range test: train briefly with a rising rate and watch the loss.

:class:`LearningRateFinder` raises the learning rate step by step (exponentially or linearly)
over fresh batches, with a real backward pass and optimizer step at each rate, records the
smoothed loss, stops when the loss diverges, and puts the model and the optimizer back as they
were. :meth:`LearningRateFinder.suggest_lr` picks the rate where the smoothed loss falls
fastest.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from trainopt.validation import check_int

FINDER_MODES = ("exp", "linear")


class LearningRateFinder:
    """Run a learning-rate range test on a model, then restore the model and the optimizer.

    Args:
        model: The model to train during the test.
        optimizer: Its optimizer. Every param group's rate is set at each point, keeping the
            groups' ratios to the first group.
        dataloader: Yields ``(inputs, targets)`` batches; the test cycles it, so each step
            sees a fresh batch.
        loss_fn: ``loss_fn(model(inputs), targets)`` returns a scalar loss tensor.

    Example:
        >>> import torch
        >>> from trainopt.schedules import LearningRateFinder
        >>> from trainopt.models import digits_loaders, digits_mlp
        >>> model = digits_mlp()
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        >>> train, _ = digits_loaders(batch_size=64)
        >>> finder = LearningRateFinder(model, opt, train, torch.nn.functional.cross_entropy)
        >>> lrs, losses = finder.find_lr(start_lr=1e-4, end_lr=10.0, num_steps=60)
        >>> len(lrs) == len(losses) and lrs[0] == 1e-4
        True
        >>> 1e-4 < finder.suggest_lr() < 10.0
        True
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        dataloader: Iterable[Any],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.dataloader = dataloader
        self.loss_fn = loss_fn
        self.lrs: list[float] = []
        self.losses: list[float] = []  # smoothed
        self.raw_losses: list[float] = []
        self.stop_reason = ""

    def _batches(self) -> Iterator[Any]:
        while True:
            empty = True
            for batch in self.dataloader:
                empty = False
                yield batch
            if empty:
                raise ValueError("dataloader yielded no batches")

    @staticmethod
    def ramp(start_lr: float, end_lr: float, num_steps: int, mode: str = "exp") -> list[float]:
        """The rates of the test: ``num_steps`` points from ``start_lr`` to ``end_lr``.

        Example:
            >>> from trainopt.schedules import LearningRateFinder
            >>> LearningRateFinder.ramp(1e-3, 1e-1, 3)
            [0.001, 0.01, 0.1]
        """
        if mode not in FINDER_MODES:
            raise ValueError(f"mode must be one of {FINDER_MODES}, got {mode=}")
        if not 0 < start_lr < end_lr:
            raise ValueError(f"need 0 < start_lr < end_lr, got {start_lr=}, {end_lr=}")
        check_int("num_steps", num_steps, 2)
        fractions = [i / (num_steps - 1) for i in range(num_steps)]
        if mode == "exp":
            return [start_lr * (end_lr / start_lr) ** f for f in fractions]
        return [start_lr + (end_lr - start_lr) * f for f in fractions]

    def find_lr(
        self,
        start_lr: float = 1e-7,
        end_lr: float = 1e-1,
        num_steps: int = 100,
        mode: str = "exp",
        smoothing: float = 0.9,
        diverge_factor: float = 4.0,
    ) -> tuple[list[float], list[float]]:
        """Train one step per rate from ``start_lr`` to ``end_lr``; return
        ``(lrs, smoothed_losses)``.

        The smoothed loss is an exponential moving average with bias correction,
        :math:`\\hat\\ell_i = a_i / (1 - \\beta^{i+1})` with
        :math:`a_i = \\beta a_{i-1} + (1-\\beta)\\ell_i`.
        The test stops early when a loss is not finite, or when the smoothed loss exceeds the
        best one by ``(diverge_factor - 1) * |best|`` (``smoothed > 4 * best`` for positive
        losses). Each point reads the loss on the host once: the test needs it to decide
        whether to stop. The model's weights and mode, the optimizer's state and rates, and
        torch's RNG state are restored afterwards, even if a step raises.
        """
        rates = self.ramp(start_lr, end_lr, num_steps, mode)
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing=}")
        if not diverge_factor > 1.0:
            raise ValueError(f"diverge_factor must be > 1, got {diverge_factor=}")
        model_state = copy.deepcopy(self.model.state_dict())
        optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        rng_state = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        was_training = self.model.training
        reference = float(self.optimizer.param_groups[0]["lr"]) or 1.0
        ratios = [float(g["lr"]) / reference for g in self.optimizer.param_groups]
        device = next(self.model.parameters()).device
        self.lrs, self.losses, self.raw_losses, self.stop_reason = [], [], [], "end_lr reached"
        average, best = 0.0, math.inf
        try:
            self.model.train()
            batches = self._batches()
            for index, lr in enumerate(rates):
                for group, ratio in zip(self.optimizer.param_groups, ratios):
                    group["lr"] = lr * ratio
                inputs, targets = next(batches)
                loss = self.loss_fn(self.model(inputs.to(device)), targets.to(device))
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                value = loss.item()
                if not math.isfinite(value):
                    self.stop_reason = f"non-finite loss at lr={lr:.3g}"
                    break
                average = smoothing * average + (1 - smoothing) * value
                smoothed = average / (1 - smoothing ** (index + 1))
                self.lrs.append(lr)
                self.raw_losses.append(value)
                self.losses.append(smoothed)
                best = min(best, smoothed)
                if smoothed > best + (diverge_factor - 1) * max(abs(best), 1e-12):
                    self.stop_reason = f"loss diverged at lr={lr:.3g}"
                    break
        finally:
            self.model.load_state_dict(model_state)
            self.optimizer.load_state_dict(optimizer_state)
            self.model.train(was_training)
            torch.set_rng_state(rng_state)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
        return list(self.lrs), list(self.losses)

    def suggest_lr(self, skip_start: float = 0.1, skip_end: float = 0.1) -> float:
        """The rate where the smoothed loss falls fastest against ``log(lr)``.

        The first ``skip_start`` and last ``skip_end`` fractions of the points are trimmed
        (the start is flat and noisy, the end diverges), non-finite points are dropped, and
        the slope is taken by central differences. Negative losses are fine: only slopes
        matter. Raises ``RuntimeError`` if fewer than 3 points remain.
        """
        if not 0.0 <= skip_start < 1.0 or not 0.0 <= skip_end < 1.0 or skip_start + skip_end >= 1.0:
            raise ValueError(
                "skip_start and skip_end must be in [0, 1) with sum < 1, "
                f"got {skip_start=}, {skip_end=}"
            )
        n = len(self.lrs)
        kept = list(zip(self.lrs, self.losses))[int(n * skip_start) : n - int(n * skip_end)]
        points = [(math.log10(lr), loss) for lr, loss in kept if lr > 0 and math.isfinite(loss)]
        if len(points) < 3:
            raise RuntimeError(
                f"suggest_lr needs at least 3 finite points after trimming, got {len(points)}; "
                "run find_lr first, with more num_steps or a lower start_lr"
            )
        slopes = [
            (points[i + 1][1] - points[i - 1][1]) / (points[i + 1][0] - points[i - 1][0])
            for i in range(1, len(points) - 1)
        ]
        steepest = min(range(len(slopes)), key=slopes.__getitem__) + 1
        return 10 ** points[steepest][0]

    def plot(self, ax: Any = None, suggestion: bool = True) -> Any:
        """Plot loss against learning rate (log scale) and return the matplotlib Figure."""
        import matplotlib.pyplot as plt

        fig = ax.figure if ax is not None else plt.figure(figsize=(6, 3.4))
        ax = ax if ax is not None else fig.add_subplot()
        ax.plot(self.lrs, self.raw_losses, color="0.75", linewidth=1, label="loss")
        ax.plot(self.lrs, self.losses, linewidth=2, label="smoothed loss")
        if suggestion and len(self.lrs) >= 3:
            try:
                lr = self.suggest_lr()
            except RuntimeError:
                lr = None
            if lr is not None:
                ax.axvline(lr, color="tab:red", linestyle="--", label=f"steepest descent {lr:.2g}")
        finite = [x for x in self.raw_losses + self.losses if math.isfinite(x)]
        if finite and self.losses:
            # Keep the divergence from flattening the interesting part of the curve.
            low, start = min(finite), self.losses[0]
            top = start + 0.5 * abs(start - low) + 1e-12
            ax.set_ylim(low - 0.05 * (top - low), top)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
        ax.legend()
        return fig
