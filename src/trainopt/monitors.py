"""Training monitors: learning rate, loss stability, gradients.

Monitors keep their statistics where the training step computes them (on the device) and only
read them on the host when asked, so they add no host-device synchronisation to a step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from trainopt.diagnostics import Finding, diagnose  # noqa: F401 - a run's logs read by the same family


class LRMonitor:
    """Record the learning rate of every parameter group after each step.

    Call :meth:`step` once per optimizer step, after ``scheduler.step()``. The recorded history
    reads the rates the optimizer will actually use next, which is what a plot should show.
    Tensor learning rates (as fused AdamW accepts) are recorded without a host sync and read
    on the host only when :attr:`history` is accessed.

    Example:
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
            [g["lr"].detach().clone() if torch.is_tensor(g["lr"]) else float(g["lr"])
             for g in self.optimizer.param_groups]
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


# ---------------------------------------------------------------------------------------------
# Robust statistics on the device
# ---------------------------------------------------------------------------------------------

MAD_TO_SIGMA = 1.4826
"""``1 / Φ⁻¹(3/4)``: the median absolute deviation times this estimates σ for normal data."""


def nanmedian(x: torch.Tensor) -> torch.Tensor:
    """Median of the non-NaN entries of a 1-d tensor (mean of the two middle values), without a sync.

    Sorting puts NaN last; the middle index comes from an on-device count of the non-NaN
    entries and is read with ``gather``, so nothing is copied to the host (some torch builds'
    ``nanmedian`` kernels read the count on the host). NaN when every entry is NaN.

    Example:
        >>> nanmedian(torch.tensor([3.0, float("nan"), 1.0, 2.0, 10.0]))
        tensor(2.5000)
    """
    ordered = torch.sort(x.reshape(-1)).values
    count = (~torch.isnan(ordered)).sum()
    last = max(ordered.numel() - 1, 0)
    low = torch.div(count - 1, 2, rounding_mode="floor").clamp(0, last)
    high = torch.div(count, 2, rounding_mode="floor").clamp(0, last)
    middle = ordered.gather(0, torch.stack([low, high]))
    return middle.mean()


def robust_zscore(
    value: torch.Tensor, window: torch.Tensor, rel_floor: float = 1e-2, abs_floor: float = 1e-8
) -> torch.Tensor:
    """Robust z-score of ``value`` against ``window``: ``(value - median) / (1.4826 · MAD)``.

    NaN entries of ``window`` are ignored (:func:`nanmedian`), so a non-finite loss stored as
    NaN never moves the statistics. The scale is floored at ``rel_floor · |median|`` and
    ``abs_floor``: a window of identical values does not turn every wiggle into a spike. Unlike
    the coefficient of variation ``std / mean``, the score is defined for zero and negative
    losses, and one outlier in the window barely moves the median or the MAD.

    Args:
        value: The new observation (0-d tensor).
        window: Past observations (1-d tensor, may hold NaN for "missing").
        rel_floor: Smallest scale relative to ``|median|``.
        abs_floor: Smallest scale in absolute terms.

    Returns:
        A 0-d tensor on ``window``'s device; NaN if ``value`` is NaN or the window is all NaN.

    Example:
        >>> window = torch.tensor([-5.0, -5.1, -4.9, -5.0, -5.05])
        >>> round(robust_zscore(torch.tensor(-5.0), window).item(), 2)
        0.0
        >>> bool(robust_zscore(torch.tensor(-1.0), window) > 6)
        True
    """
    median = nanmedian(window)
    mad = nanmedian((window - median).abs())
    scale = torch.maximum(MAD_TO_SIGMA * mad, rel_floor * median.abs()).clamp_min(abs_floor)
    return (value.to(window.dtype) - median) / scale


def _as_finite_or_nan(x: torch.Tensor) -> torch.Tensor:
    x = x.detach().float()
    return torch.where(torch.isfinite(x), x, torch.full_like(x, math.nan))


def _check_int(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {name}={value!r}")


def _check_positive(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive finite number, got {name}={value!r}")


class LossSpikeDetector:
    """Flag a loss whose robust z-score against the recent window exceeds ``threshold``.

    The last ``window_size`` losses live in a ring buffer on the loss's device. :meth:`update`
    scores the new loss against the window *before* adding it and returns the flag as a 0-d
    bool tensor, so nothing is read on the host. Non-finite losses are stored as NaN (ignored by
    the statistics) and reported by their own flag, :attr:`last_nonfinite`.

    Example:
        >>> detector = LossSpikeDetector(threshold=6.0, window_size=20, min_history=5)
        >>> flags = [detector.update(torch.tensor(2.0 - 0.01 * i)) for i in range(10)]
        >>> bool(torch.stack(flags).any()), bool(detector.update(torch.tensor(9.0)))
        (False, True)
    """

    def __init__(self, threshold: float = 6.0, window_size: int = 50, min_history: int = 10) -> None:
        _check_positive("threshold", threshold)
        _check_int("window_size", window_size, 2)
        _check_int("min_history", min_history, 2)
        if min_history > window_size:
            raise ValueError(f"min_history must be <= window_size, got {min_history=}, {window_size=}")
        self.threshold = float(threshold)
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
            self.last_z = robust_zscore(value, self.window)
            self.last_spike = self.last_z > self.threshold  # NaN compares False
        else:
            self.last_z = torch.full_like(value, math.nan)
            self.last_spike = torch.zeros_like(self.last_nonfinite)
        self.num_spikes.add_(self.last_spike.long())
        self.buffer[self.steps % self.window_size] = value
        self.steps += 1
        return self.last_spike

    def state_dict(self) -> dict[str, Any]:
        """Settings, the host counter and the device tensors (loads with ``weights_only=True``)."""
        return {
            "threshold": self.threshold, "window_size": self.window_size,
            "min_history": self.min_history, "steps": self.steps,
            **{k: getattr(self, k).detach().clone()
               for k in ("buffer", "last_z", "last_spike", "last_nonfinite", "num_spikes")},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (tensors keep this detector's device)."""
        device = self.buffer.device
        for key, value in state.items():
            setattr(self, key, value.detach().clone().to(device) if torch.is_tensor(value) else value)


class LossStabilityMonitor:
    """Watch the loss for spikes and non-finite values without reading it on the host.

    :meth:`update` runs every step and only launches device work. :meth:`check` reads every
    statistic at once (one sync) and starts a new check window; call it every ``check_every``
    steps (:attr:`due` says when). A loss is unstable when it is non-finite or when its robust
    z-score (see :func:`robust_zscore`) against the last ``window_size`` losses exceeds
    ``threshold``. The score works for zero and negative losses, where the coefficient of
    variation ``std / mean`` divides by zero or flips sign.

    Example:
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
        self, window_size: int = 100, threshold: float = 6.0, check_every: int = 100, min_history: int = 10
    ) -> None:
        _check_int("check_every", check_every, 1)
        self.detector = LossSpikeDetector(threshold, window_size, min_history)
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
        self.window_spikes.add_(spike.long())
        self.window_nonfinite.add_(self.detector.last_nonfinite.long())
        self.window_max_z = torch.fmax(self.window_max_z, self.detector.last_z)
        self.last_loss = loss.detach().float().reshape(())

    @torch.no_grad()
    def summary(self) -> dict[str, Any]:
        """Read the statistics on the host (one sync) without starting a new window."""
        window = self.detector.window
        median = nanmedian(window) if window.numel() else torch.full((), math.nan)
        mad = nanmedian((window - median).abs()) if window.numel() else median
        values = torch.stack([
            self.last_loss.float(), median.to(self.last_loss.device).float(),
            (MAD_TO_SIGMA * mad).to(self.last_loss.device).float(),
            self.detector.last_z.to(self.last_loss.device).float(), self.window_max_z.float(),
            self.window_spikes.float(), self.window_nonfinite.float(),
            self.detector.num_spikes.to(self.last_loss.device).float(),
        ]).tolist()
        last, median_v, sigma, last_z, max_z, spikes, nonfinite, total = values
        if self.steps < self.detector.min_history and not nonfinite:
            status = "insufficient_data"
        else:
            status = "unstable" if spikes or nonfinite else "stable"
        return {
            "steps": self.steps, "last_loss": last, "median": median_v, "robust_std": sigma,
            "last_z": last_z, "max_z": max_z if max_z > -math.inf else math.nan,
            "spikes": int(spikes), "nonfinite": int(nonfinite), "total_spikes": int(total),
            "status": status,
        }

    def check(self) -> dict[str, Any]:
        """:meth:`summary`, then start a new check window (spike and non-finite counts reset)."""
        report = self.summary()
        self._reset_window(self.window_spikes.device)
        return report

    def state_dict(self) -> dict[str, Any]:
        """Settings, counters and tensors: everything to resume (loads with ``weights_only=True``)."""
        return {
            "check_every": self.check_every, "detector": self.detector.state_dict(),
            **{k: getattr(self, k).detach().clone()
               for k in ("window_spikes", "window_nonfinite", "window_max_z", "last_loss")},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.check_every = state["check_every"]
        self.detector.load_state_dict(state["detector"])
        device = self.detector.buffer.device
        for key in ("window_spikes", "window_nonfinite", "window_max_z", "last_loss"):
            setattr(self, key, state[key].detach().clone().to(device))


def _stacked_norms(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """L2 norm of each tensor, in one ``torch._foreach_norm`` per (device, dtype), as a float32 vector.

    The vector keeps the order of ``tensors``.
    """
    if not tensors:
        return torch.zeros(0, device=device)
    buckets: dict[tuple[torch.device, torch.dtype], list[int]] = defaultdict(list)
    for i, t in enumerate(tensors):
        buckets[(t.device, t.dtype)].append(i)
    if len(buckets) == 1:
        return torch.stack(torch._foreach_norm(tensors)).float().to(device)
    out = torch.empty(len(tensors), device=device)
    for indices in buckets.values():
        norms = torch.stack(torch._foreach_norm([tensors[i] for i in indices])).float().to(device)
        out[indices] = norms
    return out


class GradientMonitor:
    """Global and per-group gradient and parameter norms, computed in one fused pass per group.

    Each :meth:`update` computes every per-tensor gradient norm with ``torch._foreach_norm`` and
    reduces the stacked norms with ``torch.linalg.vector_norm``: a handful of kernels, whatever
    the number of parameters, and no ``.item()``. Parameter norms (reported, never acted on)
    are measured the same way when :meth:`summary` reads the statistics. The global gradient norm is returned as a tensor
    (the same value :func:`torch.nn.utils.clip_grad_norm_` computes, so a clipper can reuse it).

    A gradient *explosion* is a global norm above ``explosion_factor`` times the median of the
    last ``window_size`` finite norms. Comparing against the median, rather than the seed's
    "max > 10 × min" of the window, does not flag a healthy run whose gradient norm falls.

    Args:
        model_or_optimizer: A module (one group) or an optimizer (one group per param group).
        window_size: How many past global norms the explosion test looks at.
        explosion_factor: Ratio to the window median that counts as an explosion.
        min_history: Norms needed before the explosion test starts.
        check_every: Steps between host reads (:attr:`due`).

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        >>> model(torch.randn(16, 4)).pow(2).mean().backward()
        >>> monitor = GradientMonitor(model)
        >>> norm = monitor.update()
        >>> expected = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        >>> torch.allclose(norm, expected)
        True
        >>> report = monitor.check()
        >>> report["explosions"], len(report["group_grad_norms"])
        (0, 1)
    """

    _tensor_keys = ("buffer", "grad_norm", "param_norm", "group_grad_norms", "group_param_norms",
                    "window_max_grad_norm", "window_explosions", "window_nonfinite", "last_explosion")

    def __init__(
        self,
        model_or_optimizer: torch.nn.Module | torch.optim.Optimizer,
        window_size: int = 50,
        explosion_factor: float = 10.0,
        min_history: int = 10,
        check_every: int = 100,
    ) -> None:
        if isinstance(model_or_optimizer, torch.optim.Optimizer):
            self.groups = [list(g["params"]) for g in model_or_optimizer.param_groups]
        elif isinstance(model_or_optimizer, torch.nn.Module):
            self.groups = [list(model_or_optimizer.parameters())]
        else:
            raise TypeError(
                "model_or_optimizer must be a torch.nn.Module or a torch.optim.Optimizer, "
                f"got {type(model_or_optimizer).__name__}"
            )
        _check_int("window_size", window_size, 2)
        _check_int("min_history", min_history, 2)
        _check_int("check_every", check_every, 1)
        _check_positive("explosion_factor", explosion_factor)
        self.window_size = window_size
        self.explosion_factor = float(explosion_factor)
        self.min_history = min_history
        self.check_every = check_every
        self.steps = 0
        device = next((p.device for g in self.groups for p in g), torch.device("cpu"))
        self._init_tensors(device)

    def _init_tensors(self, device: torch.device) -> None:
        n = len(self.groups)
        self.buffer = torch.full((self.window_size,), math.nan, device=device)
        self.grad_norm = torch.full((), math.nan, device=device)
        self.param_norm = torch.full((), math.nan, device=device)
        self.group_grad_norms = torch.full((n,), math.nan, device=device)
        self.group_param_norms = torch.full((n,), math.nan, device=device)
        self.last_explosion = torch.zeros((), dtype=torch.bool, device=device)
        self._reset_window()

    def _reset_window(self) -> None:
        device = self.buffer.device
        self.window_max_grad_norm = torch.full((), -math.inf, device=device)
        self.window_explosions = torch.zeros((), dtype=torch.long, device=device)
        self.window_nonfinite = torch.zeros((), dtype=torch.long, device=device)

    @property
    def due(self) -> bool:
        """True every ``check_every`` updates (a host counter)."""
        return self.steps > 0 and self.steps % self.check_every == 0

    @torch.no_grad()
    def update(self) -> torch.Tensor:
        """Measure the current gradients and parameters; return the global gradient norm (tensor)."""
        device = self.buffer.device
        group_grads = [
            torch.linalg.vector_norm(_stacked_norms([p.grad for p in group if p.grad is not None], device))
            for group in self.groups
        ]
        self.group_grad_norms = torch.stack(group_grads)
        self.grad_norm = torch.linalg.vector_norm(self.group_grad_norms)
        value = _as_finite_or_nan(self.grad_norm)
        if self.steps >= self.min_history:
            median = nanmedian(self.buffer[: min(self.steps, self.window_size)])
            self.last_explosion = value > self.explosion_factor * median
        self.window_explosions.add_(self.last_explosion.long())
        self.window_nonfinite.add_(torch.isnan(value).long())
        self.window_max_grad_norm = torch.fmax(self.window_max_grad_norm, value)
        self.buffer[self.steps % self.window_size] = value
        self.steps += 1
        return self.grad_norm

    @torch.no_grad()
    def summary(self) -> dict[str, Any]:
        """Read every statistic on the host at once (one sync).

        Parameter norms are measured here, not in :meth:`update`: they are only reported, so
        the step does not pay for a pass over the weights.
        """
        device = self.buffer.device
        self.group_param_norms = torch.stack(
            [torch.linalg.vector_norm(_stacked_norms(group, device)) for group in self.groups]
        )
        self.param_norm = torch.linalg.vector_norm(self.group_param_norms)
        filled = self.buffer[: min(self.steps, self.window_size)]
        median = nanmedian(filled) if filled.numel() else torch.full((), math.nan)
        scalars = torch.stack([
            self.grad_norm, self.param_norm, median.to(self.grad_norm.device),
            self.window_max_grad_norm, self.window_explosions.float(), self.window_nonfinite.float(),
        ])
        packed = torch.cat([scalars, self.group_grad_norms, self.group_param_norms]).tolist()
        n = len(self.groups)
        grad, param, median_v, max_v, explosions, nonfinite = packed[:6]
        return {
            "steps": self.steps,
            "grad_norm": grad,
            "param_norm": param,
            "grad_to_param_ratio": grad / param if param > 0 else math.nan,
            "median_grad_norm": median_v,
            "max_grad_norm": max_v if max_v > -math.inf else math.nan,
            "explosions": int(explosions),
            "nonfinite": int(nonfinite),
            "group_grad_norms": packed[6:6 + n],
            "group_param_norms": packed[6 + n:],
        }

    def check(self) -> dict[str, Any]:
        """:meth:`summary`, then start a new check window."""
        report = self.summary()
        self._reset_window()
        return report

    def state_dict(self) -> dict[str, Any]:
        """Settings, counters and tensors: everything to resume (loads with ``weights_only=True``)."""
        settings = {k: getattr(self, k) for k in
                    ("window_size", "explosion_factor", "min_history", "check_every", "steps")}
        return {**settings, **{k: getattr(self, k).detach().clone() for k in self._tensor_keys}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        device = self.buffer.device
        for key, value in state.items():
            setattr(self, key, value.detach().clone().to(device) if torch.is_tensor(value) else value)


@torch.no_grad()
def nonfinite_gradients(model: torch.nn.Module) -> list[str]:
    """Names of the parameters whose gradient holds an inf or a NaN (a debugging read: one sync).

    Use it when a monitor reports non-finite gradient norms, to find where they start.

    Example:
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> model[1].bias.grad[0] = float("nan")
        >>> nonfinite_gradients(model)
        ['1.bias']
    """
    named = [(name, p.grad) for name, p in model.named_parameters() if p.grad is not None]
    if not named:
        return []
    flags = torch.stack([~torch.isfinite(g).all() for _, g in named]).tolist()
    return [name for (name, _), bad in zip(named, flags) if bad]
