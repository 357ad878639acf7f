"""Loss monitors: spikes against a robust window, and a run's loss stability, with no host sync
per step."""

from __future__ import annotations

import math
from typing import Any

import torch

from trainopt.stability.config import deprecated_name
from trainopt.stability.monitoring.statistics import (
    _as_finite_or_nan,
    nanmax,
    nanmedian,
    tail_score,
)
from trainopt.validation import check_int, check_number


class LossSpikeDetector:
    """Flag a loss that lies more than ``spike_factor`` times the window's range above its median.

    The score is :func:`~trainopt.stability.monitoring.statistics.tail_score`: ``(loss - median) /
    (max - median)`` over the last ``window_size`` accepted losses, which live in a ring buffer on
    the loss's device. :meth:`update` scores the new loss against the window *before* adding it and
    returns the flag as a 0-d bool tensor, so nothing is read on the host. A flagged or
    non-finite loss enters the window as NaN (ignored by the statistics), so one corrupted batch
    does not widen the range the next one is judged by; a lasting change of level is flagged on
    every step, which the stabilizer's ``patience`` turns into a rollback. Non-finite losses have
    their own flag, :attr:`last_nonfinite`.

    The defaults come from the healthy and faulty corpora of the stability page: at
    ``spike_factor=4`` (and the gradient monitor's ``explosion_factor=6``) the healthy runs of
    ``python -m trainopt_site.stability.corpus`` skip about one batch in ten thousand, and a batch
    with every label wrong scores above it once the model has learnt anything.

    Example:
        >>> import torch
        >>> from trainopt.stability.monitoring.loss import LossSpikeDetector
        >>> detector = LossSpikeDetector(spike_factor=4.0, window_size=20, min_history=5)
        >>> flags = [detector.update(torch.tensor(2.0 - 0.01 * i)) for i in range(10)]
        >>> bool(torch.stack(flags).any()), bool(detector.update(torch.tensor(9.0)))
        (False, True)
    """

    def __init__(
        self,
        spike_factor: float = 4.0,
        window_size: int = 100,
        min_history: int = 20,
        *,
        threshold: float | None = None,
    ) -> None:
        spike_factor = deprecated_name(
            "LossSpikeDetector", "threshold", threshold, spike_factor, 4.0
        )
        check_number("spike_factor", spike_factor)
        check_int("window_size", window_size, 2)
        check_int("min_history", min_history, 2)
        if min_history > window_size:
            raise ValueError(
                f"min_history must be <= window_size, got {min_history=}, {window_size=}"
            )
        self.spike_factor = float(spike_factor)
        self.window_size = window_size
        self.min_history = min_history
        self.steps = 0  # host counter: how many losses were seen (no sync needed to know it)
        self.buffer = torch.full((window_size,), math.nan)
        self.last_z = torch.tensor(math.nan)
        self.last_spike = torch.tensor(False)
        self.last_nonfinite = torch.tensor(False)
        self.num_spikes = torch.zeros((), dtype=torch.long)

    def _to(self, device: torch.device) -> None:
        if self.buffer.device != device:
            for key in ("buffer", "last_z", "last_spike", "last_nonfinite", "num_spikes"):
                setattr(self, key, getattr(self, key).to(device))

    @property
    def window(self) -> torch.Tensor:
        """The filled part of the ring buffer (NaN where a loss was non-finite)."""
        return self.buffer[: min(self.steps, self.window_size)]

    @torch.no_grad()
    def update(self, loss: torch.Tensor) -> torch.Tensor:
        """Score ``loss``, add it to the window, return the spike flag (0-d bool, on device)."""
        self._to(loss.device)
        value = _as_finite_or_nan(loss.reshape(()))
        self.last_nonfinite = torch.isnan(value)
        if self.steps >= self.min_history:
            self.last_z = tail_score(value, self.window)
            self.last_spike = self.last_z > self.spike_factor  # NaN compares False
        else:
            self.last_z = torch.full_like(value, math.nan)
            self.last_spike = torch.zeros_like(self.last_nonfinite)
        self.last_value = value  # the loss as the window holds it (NaN when non-finite)
        self.num_spikes.add_(self.last_spike)
        self.buffer[self.steps % self.window_size] = torch.where(self.last_spike, math.nan, value)
        self.steps += 1
        return self.last_spike

    def state_dict(self) -> dict[str, Any]:
        """Settings, the host counter and the device tensors (loads with ``weights_only=True``)."""
        return {
            "spike_factor": self.spike_factor,
            "window_size": self.window_size,
            "min_history": self.min_history,
            "steps": self.steps,
            **{
                k: getattr(self, k).detach().clone()
                for k in ("buffer", "last_z", "last_spike", "last_nonfinite", "num_spikes")
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (tensors keep this detector's device)."""
        device = self.buffer.device
        state = dict(state)
        if "threshold" in state:  # written by trainopt 0.4
            state["spike_factor"] = state.pop("threshold")
        for key, value in state.items():
            setattr(
                self, key, value.detach().clone().to(device) if torch.is_tensor(value) else value
            )


class LossStabilityMonitor:
    """Watch the loss for spikes and non-finite values without reading it on the host.

    :meth:`update` runs every step and only launches device work. :meth:`check` reads every
    statistic at once (one sync) and starts a new check window; call it every ``check_every``
    steps (:attr:`due` says when). A loss is unstable when it is non-finite or when it lies more
    than ``spike_factor`` times the window's range above the median of the last ``window_size``
    accepted losses (:class:`LossSpikeDetector`). The score works for zero and negative losses,
    where the coefficient of variation ``std / mean`` divides by zero or flips sign.

    Example:
        >>> import torch
        >>> from trainopt.stability import LossStabilityMonitor
        >>> monitor = LossStabilityMonitor(window_size=50, check_every=20)
        >>> for i in range(20):
        ...     monitor.update(torch.tensor(-3.0 + 0.01 * (-1) ** i))  # an RL-style negative loss
        >>> monitor.due, monitor.check()["status"]
        (True, 'stable')
        >>> for i in range(19):
        ...     monitor.update(torch.tensor(-3.0 + 0.01 * (-1) ** i))
        >>> monitor.update(torch.tensor(4.0))
        >>> report = monitor.check()
        >>> report["status"], report["spikes"]
        ('unstable', 1)
    """

    def __init__(
        self,
        window_size: int = 100,
        spike_factor: float = 4.0,
        check_every: int = 100,
        min_history: int = 20,
        *,
        threshold: float | None = None,
    ) -> None:
        spike_factor = deprecated_name(
            "LossStabilityMonitor", "threshold", threshold, spike_factor, 4.0
        )
        check_int("check_every", check_every, 1)
        self.detector = LossSpikeDetector(spike_factor, window_size, min_history)
        self.check_every = check_every
        self._reset_window(torch.device("cpu"))

    def _reset_window(self, device: torch.device) -> None:
        self.window_spikes = torch.zeros((), dtype=torch.long, device=device)
        self.window_nonfinite = torch.zeros((), dtype=torch.long, device=device)
        self.window_max_z = torch.full((), -math.inf, device=device)
        self.last_loss = torch.full((), math.nan, device=device)

    @property
    def steps(self) -> int:
        """Losses seen so far (a host counter)."""
        return self.detector.steps

    @property
    def due(self) -> bool:
        """True every ``check_every`` steps (a host counter: reading it costs nothing)."""
        return self.steps > 0 and self.steps % self.check_every == 0

    @torch.no_grad()
    def update(self, loss: torch.Tensor) -> None:
        """Fold one loss into the statistics (device work only, no sync)."""
        if self.window_spikes.device != loss.device:
            self._reset_window(loss.device)
        spike = self.detector.update(loss)
        self.window_spikes.add_(spike)  # a bool added to a long counter: no conversion kernel
        self.window_nonfinite.add_(self.detector.last_nonfinite)
        self.window_max_z = torch.fmax(self.window_max_z, self.detector.last_z)
        self.last_loss = loss.detach().float().reshape(())

    @torch.no_grad()
    def summary(self) -> dict[str, Any]:
        """Read the statistics on the host (one sync) without starting a new window."""
        window = self.detector.window
        median = nanmedian(window) if window.numel() else torch.full((), math.nan)
        largest = nanmax(window) if window.numel() else median
        values = torch.stack(
            [
                self.last_loss.float(),
                median.to(self.last_loss.device).float(),
                largest.to(self.last_loss.device).float(),
                self.detector.last_z.to(self.last_loss.device).float(),
                self.window_max_z.float(),
                self.window_spikes.float(),
                self.window_nonfinite.float(),
                self.detector.num_spikes.to(self.last_loss.device).float(),
            ]
        ).tolist()
        last, median_v, largest_v, last_z, max_z, spikes, nonfinite, total = values
        if self.steps < self.detector.min_history and not nonfinite:
            status = "insufficient_data"
        else:
            status = "unstable" if spikes or nonfinite else "stable"
        return {
            "steps": self.steps,
            "last_loss": last,
            "median": median_v,
            "window_max": largest_v,
            "last_score": last_z,
            "max_score": max_z if max_z > -math.inf else math.nan,
            "spikes": int(spikes),
            "nonfinite": int(nonfinite),
            "total_spikes": int(total),
            "status": status,
        }

    def check(self) -> dict[str, Any]:
        """:meth:`summary`, then start a new check window (spike and non-finite counts reset)."""
        report = self.summary()
        self._reset_window(self.window_spikes.device)
        return report

    def state_dict(self) -> dict[str, Any]:
        """Settings, counters and tensors: everything to resume (loads with
        ``weights_only=True``)."""
        return {
            "check_every": self.check_every,
            "detector": self.detector.state_dict(),
            **{
                k: getattr(self, k).detach().clone()
                for k in ("window_spikes", "window_nonfinite", "window_max_z", "last_loss")
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.check_every = state["check_every"]
        self.detector.load_state_dict(state["detector"])
        device = self.detector.buffer.device
        for key in ("window_spikes", "window_nonfinite", "window_max_z", "last_loss"):
            setattr(self, key, state[key].detach().clone().to(device))
