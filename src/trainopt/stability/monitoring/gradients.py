"""Gradient monitors: norms per layer kept on the device, and the names of non-finite gradients."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import torch

from trainopt.stability.monitoring.statistics import (
    _as_finite_or_nan,
    nanmedian,
    tail_score,
)
from trainopt.stability.skipping.buffers import nonfinite_buffers
from trainopt.validation import check_int, check_number


def _stacked_norms(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """L2 norm of each tensor, in one ``torch._foreach_norm`` per (device, dtype), as a float32
    vector.

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
    are measured the same way when :meth:`summary` reads the statistics. The global gradient norm
    is returned as a tensor (the same value :func:`torch.nn.utils.clip_grad_norm_` computes, so a
    clipper can reuse it).

    Buffers count as weights: :meth:`summary` also reports ``nonfinite_buffers``, how many
    floating buffers of the watched module (the one given, or :meth:`watch_buffers`'s) hold an
    inf or a NaN, such as ``BatchNorm`` running statistics a NaN batch reached.

    A gradient *explosion* is a global norm that lies more than ``explosion_factor`` times the
    window's range above the median of the last ``window_size`` accepted norms
    (:func:`~trainopt.stability.monitoring.statistics.tail_score`); an exploding norm enters the
    window as NaN. Judging by the window's own range, rather than by a multiple of its median,
    leaves alone the ordinary hard batches of a converged run (ten times the median norm and more),
    and a healthy run whose gradient norm falls is never flagged.

    Args:
        model_or_optimizer: A module (one group) or an optimizer (one group per param group).
        window_size: How many past global norms the explosion test looks at.
        explosion_factor: Ratio to the window median that counts as an explosion.
        min_history: Norms needed before the explosion test starts.
        check_every: Steps between host reads (:attr:`due`).

    Example:
        >>> import torch
        >>> from trainopt.stability import GradientMonitor
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

    _tensor_keys = (
        "buffer",
        "grad_norm",
        "param_norm",
        "group_grad_norms",
        "group_param_norms",
        "window_max_grad_norm",
        "window_explosions",
        "window_nonfinite",
        "last_explosion",
    )

    def __init__(
        self,
        model_or_optimizer: torch.nn.Module | torch.optim.Optimizer,
        window_size: int = 100,
        explosion_factor: float = 6.0,
        min_history: int = 20,
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
        check_int("window_size", window_size, 2)
        check_int("min_history", min_history, 2)
        check_int("check_every", check_every, 1)
        check_number("explosion_factor", explosion_factor)
        self.window_size = window_size
        self.explosion_factor = float(explosion_factor)
        self.min_history = min_history
        self.check_every = check_every
        self.steps = 0
        module = isinstance(model_or_optimizer, torch.nn.Module)
        self.buffers_of: torch.nn.Module | None = model_or_optimizer if module else None
        device = next((p.device for g in self.groups for p in g), torch.device("cpu"))
        self._init_tensors(device)

    def watch_buffers(self, module: torch.nn.Module) -> None:
        """Count the floating buffers of ``module`` in ``nonfinite_buffers`` (not in the state)."""
        self.buffers_of = module

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
    def measure(self) -> torch.Tensor:
        """The global gradient norm of the current gradients (and each group's), not yet folded
        in."""
        device = self.buffer.device
        group_grads = [
            torch.linalg.vector_norm(
                _stacked_norms([p.grad for p in group if p.grad is not None], device)
            )
            for group in self.groups
        ]
        if len(group_grads) == 1:
            # one group: its norm is the global one, computed as clip_grad_norm_ computes it
            self.grad_norm = group_grads[0]
            self.group_grad_norms = self.grad_norm.view(1)
            return self.grad_norm
        self.group_grad_norms = torch.stack(group_grads)
        self.grad_norm = torch.linalg.vector_norm(self.group_grad_norms)
        return self.grad_norm

    @torch.no_grad()
    def update(self) -> torch.Tensor:
        """Measure the current gradients and fold the norm in; return the global gradient norm
        (tensor)."""
        self.measure()
        value = self.last_value = _as_finite_or_nan(self.grad_norm)  # NaN when non-finite
        self.last_nonfinite = torch.isnan(value)
        if self.steps >= self.min_history:
            window = self.buffer[: min(self.steps, self.window_size)]
            self.last_explosion = tail_score(value, window) > self.explosion_factor
        self.window_explosions.add_(self.last_explosion)  # bools into long counters: no conversion
        self.window_nonfinite.add_(self.last_nonfinite)
        self.window_max_grad_norm = torch.fmax(self.window_max_grad_norm, value)
        self.buffer[self.steps % self.window_size] = torch.where(
            self.last_explosion, math.nan, value
        )
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
        bad_buffers = (
            nonfinite_buffers(self.buffers_of, device)
            if self.buffers_of is not None
            else torch.zeros((), dtype=torch.long, device=device)
        )
        scalars = torch.stack(
            [
                self.grad_norm,
                self.param_norm,
                median.to(self.grad_norm.device),
                self.window_max_grad_norm,
                self.window_explosions.float(),
                self.window_nonfinite.float(),
                bad_buffers.float().to(self.grad_norm.device),
            ]
        )
        packed = torch.cat([scalars, self.group_grad_norms, self.group_param_norms]).tolist()
        n = len(self.groups)
        grad, param, median_v, max_v, explosions, nonfinite, buffers = packed[:7]
        return {
            "steps": self.steps,
            "grad_norm": grad,
            "param_norm": param,
            "grad_to_param_ratio": grad / param if param > 0 else math.nan,
            "median_grad_norm": median_v,
            "max_grad_norm": max_v if max_v > -math.inf else math.nan,
            "explosions": int(explosions),
            "nonfinite": int(nonfinite),
            "nonfinite_buffers": int(buffers),
            "group_grad_norms": packed[7 : 7 + n],
            "group_param_norms": packed[7 + n :],
        }

    def check(self) -> dict[str, Any]:
        """:meth:`summary`, then start a new check window."""
        report = self.summary()
        self._reset_window()
        return report

    def state_dict(self) -> dict[str, Any]:
        """Settings, counters and tensors: everything to resume (loads with
        ``weights_only=True``)."""
        settings = {
            k: getattr(self, k)
            for k in ("window_size", "explosion_factor", "min_history", "check_every", "steps")
        }
        return {**settings, **{k: getattr(self, k).detach().clone() for k in self._tensor_keys}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (checked first: a misfit changes nothing)."""
        missing = [k for k in ("steps", *self._tensor_keys) if k not in state]
        if missing:
            raise KeyError(f"GradientMonitor state_dict is missing {missing}")
        if len(state["group_grad_norms"]) != len(self.groups):
            raise ValueError(
                f"GradientMonitor state has {len(state['group_grad_norms'])} parameter groups, "
                f"this monitor measures {len(self.groups)}"
            )
        device = self.buffer.device
        for key, value in state.items():
            setattr(
                self, key, value.detach().clone().to(device) if torch.is_tensor(value) else value
            )


@torch.no_grad()
def nonfinite_gradients(model: torch.nn.Module) -> list[str]:
    """Names of the parameters whose gradient holds an inf or a NaN (a debugging read: one sync).

    Use it when a monitor reports non-finite gradient norms, to find where they start.

    Example:
        >>> import torch
        >>> from trainopt.stability import nonfinite_gradients
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
