"""Gradient clipping: global norm, history-based thresholds, and unit-wise AGC.

Every function here works on the device and never reads a tensor on the host, so clipping adds
no host-device synchronisation to a training step:

- :func:`clip_gradients` clips the global norm with :func:`torch.nn.utils.clip_grad_norm_` and
  returns the norm measured *before* clipping, as a tensor.
- :class:`AdaptiveGradientClipper` clips at ``factor`` times a running mean of recent norms.
- :class:`ZScoreClipper` clips norms that lie more than ``z_threshold`` standard deviations
  above a running mean (the rule of "ZClip", Kumar et al. 2025).
- :func:`~trainopt.stability.clipping.unitwise.adaptive_clip_grad_` (in its own module) is unit-wise
  adaptive gradient clipping (AGC, Brock et al. 2021).

The two stateful clippers keep their statistics in tensors on the gradients' device and have
``state_dict()`` / ``load_state_dict()``. A non-finite norm (an overflowing fp16 step, a NaN
batch) never enters their statistics: the loss scaler or the stabilizer skips that step, and the
threshold stays what it was.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from trainopt.validation import check_int, check_number

__all__ = [
    "AdaptiveGradientClipper",
    "ZScoreClipper",
    "clip_gradients",
    "clip_grads_with_norm_",
    "total_grad_norm",
]

Parameters = nn.Module | torch.Tensor | Iterable[torch.Tensor]


def _params(model_or_params: Parameters) -> list[torch.Tensor]:
    """The parameters of a module, a single tensor, or an iterable of tensors, as a list."""
    if isinstance(model_or_params, nn.Module):
        return list(model_or_params.parameters())
    if isinstance(model_or_params, torch.Tensor):
        return [model_or_params]
    params = list(model_or_params)
    for p in params:
        if not isinstance(p, torch.Tensor):
            raise TypeError(
                f"model_or_params must be an nn.Module, a Tensor or an iterable of Tensors, "
                f"got an iterable containing {type(p).__name__}"
            )
    return params


def _positive_float(name: str, value: Any, allow_inf: bool = False) -> float:
    """``value`` as a float (a NumPy or 0-d tensor value too), checked by the one helper."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a positive number, got {name}={value!r}") from None
    check_number(name, value, high_open=not allow_inf)
    return value


def total_grad_norm(
    model_or_params: Parameters, norm_type: float = 2.0, foreach: bool | None = None
) -> torch.Tensor:
    """The global norm of all gradients, as one tensor, without clipping and without a sync.

    The same computation as :func:`torch.nn.utils.clip_grad_norm_` (per-tensor norms with
    ``torch._foreach_norm``, then the norm of the stacked norms).

    Example:
        >>> import torch
        >>> from trainopt.stability import total_grad_norm
        >>> w = torch.nn.Parameter(torch.zeros(2)); w.grad = torch.tensor([3.0, 4.0])
        >>> total_grad_norm([w])
        tensor(5.)
    """
    grads = [p.grad for p in _params(model_or_params) if p.grad is not None]
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if get_total_norm is not None:
        return get_total_norm(grads, norm_type, False, foreach)
    if not grads:  # pragma: no cover - torch < 2.6
        return torch.tensor(0.0)
    with torch.no_grad():  # pragma: no cover - torch < 2.6
        first = grads[0].device
        norms = [n.to(first) for n in torch._foreach_norm(grads, float(norm_type))]
        return torch.linalg.vector_norm(torch.stack(norms), float(norm_type))


@torch.no_grad()
def clip_grads_with_norm_(
    model_or_params: Parameters, max_norm: float | torch.Tensor, total_norm: torch.Tensor
) -> torch.Tensor:
    """Scale gradients by ``min(max_norm / (total_norm + 1e-6), 1)``; ``max_norm`` may be a tensor.

    The coefficient torch's clipping uses, with the threshold allowed to live on the device
    (torch's own ``clip_grads_with_norm_`` converts it with ``float()``, a sync). Returns the
    coefficient that was applied.

    Example:
        >>> import torch
        >>> from trainopt.stability.clipping.norms import clip_grads_with_norm_
        >>> w = torch.nn.Parameter(torch.zeros(2)); w.grad = torch.tensor([3.0, 4.0])
        >>> coef = clip_grads_with_norm_([w], torch.tensor(1.0), torch.tensor(5.0))
        >>> torch.allclose(w.grad, torch.tensor([0.6, 0.8]))
        True
    """
    coef = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for p in _params(model_or_params):
        if p.grad is not None:
            groups[(p.grad.device, p.grad.dtype)].append(p.grad)
    for (device, _), grads in groups.items():
        torch._foreach_mul_(grads, coef.to(device))
    return coef


def clip_gradients(
    model_or_params: Parameters,
    max_norm: float = 1.0,
    norm_type: float = 2.0,
    foreach: bool | None = None,
    error_if_nonfinite: bool = False,
) -> torch.Tensor:
    """Clip the global gradient norm to ``max_norm``; return the norm before clipping.

    A thin, validated front for :func:`torch.nn.utils.clip_grad_norm_` (the same kernels, so
    the same bits): every gradient is multiplied by ``min(max_norm / (norm + 1e-6), 1)``.

    Non-finite gradients: the returned norm is ``inf`` or ``nan`` and the gradients become
    non-finite too; skip that optimizer step
    (:class:`trainopt.stability.scaling.scaler.DynamicLossScaler` does). ``error_if_nonfinite=True``
    raises instead, but that check reads the norm on the host: a sync every step, so it is off by
    default.

    Args:
        model_or_params: A module, a tensor, or an iterable of tensors whose ``.grad`` to clip.
        max_norm: Largest allowed global norm (positive).
        norm_type: Order of the norm (``2.0``, ``float("inf")``, ...).
        foreach: Passed to torch (``None`` picks the fused path where supported).
        error_if_nonfinite: Raise ``RuntimeError`` on a non-finite norm (syncs).

    Returns:
        The total norm before clipping, a 0-d tensor on the gradients' device.

    Example:
        >>> import torch
        >>> from trainopt.stability import clip_gradients
        >>> from trainopt.stability import total_grad_norm
        >>> model = torch.nn.Linear(4, 1)
        >>> model(torch.full((8, 4), 10.0)).sum().backward()
        >>> norm = clip_gradients(model, max_norm=1.0)
        >>> bool(norm > 1.0), round(total_grad_norm(model).item(), 4)
        (True, 1.0)
    """
    max_norm = _positive_float("max_norm", max_norm, allow_inf=True)
    return torch.nn.utils.clip_grad_norm_(
        _params(model_or_params), max_norm, norm_type, error_if_nonfinite, foreach
    )


def _running_update(
    mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor, x: torch.Tensor, beta: float
) -> None:
    """In place: fold ``x`` into an exponential mean/variance unless it is non-finite.

    The weight of the new value is ``max(1 / (count + 1), 1 - beta)``: an exact running mean
    and (population) variance over the first ``1 / (1 - beta)`` values, an exponential moving
    average afterwards, so the statistics need no bias correction.
    """
    finite = torch.isfinite(x)
    alpha = torch.clamp((count + 1).reciprocal(), min=1.0 - beta)
    alpha = torch.where(finite, alpha, torch.zeros_like(alpha))
    delta = torch.where(finite, x - mean, torch.zeros_like(mean))
    mean.add_(alpha * delta)
    var.copy_((1 - alpha) * (var + alpha * delta * delta))
    count.add_(finite.to(count.dtype))


class _RunningClipper:
    """Shared state handling of the history-based clippers (statistics live on the device)."""

    _float_keys: tuple[str, ...] = ("mean", "var", "count", "threshold", "num_clipped")

    def __init__(self, beta: float, warmup_steps: int, norm_type: float) -> None:
        if not 0.0 <= float(beta) < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta=}")
        check_int("warmup_steps", warmup_steps, 0)
        self.beta = float(beta)
        self.warmup_steps = warmup_steps
        self.norm_type = float(norm_type)
        self.mean = torch.zeros(())
        self.var = torch.zeros(())
        self.count = torch.zeros(())  # finite norms seen so far (float: feeds the weights)
        self.threshold = torch.tensor(math.inf)  # threshold used at the last call
        self.num_clipped = torch.zeros(())  # calls that scaled gradients down
        self.last_clipped = torch.tensor(False)

    def _to(self, device: torch.device) -> None:
        if self.mean.device != device:
            for key in self._float_keys:
                setattr(self, key, getattr(self, key).to(device))
            self.last_clipped = self.last_clipped.to(device)

    def _threshold(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _observed(self, norm: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
        """The value that enters the statistics: the norm after clipping."""
        return torch.minimum(norm, threshold)

    @torch.no_grad()
    def clip(
        self, model_or_params: Parameters, total_norm: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Clip the gradients at the current threshold, update the statistics, return the norm.

        Args:
            model_or_params: A module, a tensor, or an iterable of tensors.
            total_norm: The global gradient norm if already computed (e.g. by a monitor);
                computed here otherwise.

        Returns:
            The global norm before clipping (a 0-d tensor).
        """
        params = _params(model_or_params)
        norm = total_grad_norm(params, self.norm_type) if total_norm is None else total_norm
        self._to(norm.device)
        threshold = self._threshold()
        clip_grads_with_norm_(params, threshold, norm)
        self.last_clipped = norm > threshold
        self.num_clipped.add_(self.last_clipped.to(self.num_clipped.dtype))
        self.threshold = threshold
        # the clipped value of a non-finite norm would be finite: keep the raw norm so it is ignored
        observed = torch.where(torch.isfinite(norm), self._observed(norm, threshold), norm)
        _running_update(self.mean, self.var, self.count, observed, self.beta)
        return norm

    __call__ = clip
    clip_gradients = clip

    def state_dict(self) -> dict[str, Any]:
        """Hyperparameters and statistics (tensors), loadable with ``weights_only=True``."""
        state: dict[str, Any] = {
            k: v for k, v in vars(self).items() if not isinstance(v, torch.Tensor)
        }
        state.update(
            {k: getattr(self, k).detach().clone() for k in (*self._float_keys, "last_clipped")}
        )
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (tensors keep this clipper's device)."""
        missing = [k for k in (*self._float_keys, "last_clipped") if k not in state_dict]
        if missing:
            raise KeyError(f"{type(self).__name__} state_dict is missing {missing}")
        device = self.mean.device
        for key, value in state_dict.items():
            setattr(
                self,
                key,
                value.detach().clone().to(device) if isinstance(value, torch.Tensor) else value,
            )


class AdaptiveGradientClipper(_RunningClipper):
    """Clip the global norm at ``factor`` times the running mean of recent (clipped) norms.

    The rule: with :math:`\\bar g_{t-1}` the exponential mean (weight ``1 - beta``) of the
    norms seen so far, each *after* clipping,

    .. math::  \\tau_t = \\text{factor} \\cdot \\bar g_{t-1}, \\qquad
               g_t \\leftarrow g_t \\cdot \\min(1, \\tau_t / \\lVert g_t \\rVert).

    Feeding the clipped norm back means one spike cannot raise the threshold, while a genuine
    upward drift still can, by at most ``1 + (1 - beta)(factor - 1)`` per step. During the first
    ``warmup_steps`` steps the clipper only observes (threshold ``initial_norm``, default no
    clipping) and records the raw norms. Non-finite norms are never recorded.

    Args:
        factor: Multiple of the running mean at which to clip (> 1).
        beta: Decay of the exponential mean (window of about ``1 / (1 - beta)`` steps).
        warmup_steps: Steps of pure observation before the adaptive threshold applies.
        initial_norm: Threshold during warm-up (``inf``: observe only).
        norm_type: Order of the norm.

    Example:
        >>> import torch
        >>> from trainopt.stability import AdaptiveGradientClipper
        >>> clipper = AdaptiveGradientClipper(factor=2.0, warmup_steps=3)
        >>> w = torch.nn.Parameter(torch.zeros(1))
        >>> for g in [1.0, 1.0, 1.0, 1.0, 50.0]:
        ...     w.grad = torch.tensor([g]); norm = clipper.clip([w])
        >>> norm.item(), round(w.grad.item(), 3)
        (50.0, 2.0)
    """

    def __init__(
        self,
        factor: float = 2.0,
        beta: float = 0.98,
        warmup_steps: int = 20,
        initial_norm: float = math.inf,
        norm_type: float = 2.0,
    ) -> None:
        super().__init__(beta, warmup_steps, norm_type)
        if not float(factor) > 1.0:
            raise ValueError(f"factor must be > 1, got {factor=}")
        self.factor = float(factor)
        self.initial_norm = _positive_float("initial_norm", initial_norm, allow_inf=True)

    def _threshold(self) -> torch.Tensor:
        warm = self.count >= max(self.warmup_steps, 1)
        return torch.where(
            warm, self.factor * self.mean, torch.full_like(self.mean, self.initial_norm)
        )

    def _observed(self, norm: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
        warm = self.count >= max(self.warmup_steps, 1)
        return torch.where(warm, torch.minimum(norm, threshold), norm)


class ZScoreClipper(_RunningClipper):
    """Clip gradient-norm outliers: norms more than ``z_threshold`` deviations above the mean.

    With running mean :math:`\\mu` and variance :math:`\\sigma^2` of recent norms (exponential,
    weight ``1 - beta``), the z-score of a norm is :math:`z = (\\lVert g \\rVert - \\mu) / \\sigma`.
    Past the warm-up, a norm with :math:`z > z_{\\max}` is clipped to
    :math:`\\mu + z_{\\max}\\,\\sigma` and that clipped value enters the statistics, so a spike
    does not widen the band it is judged by. ``sigma`` is floored at ``eps * mu`` so a perfectly
    steady history does not clip every tiny fluctuation. A non-finite norm never enters the
    statistics and is left for the scaler/stabilizer to skip.

    Args:
        z_threshold: Allowed z-score (> 0).
        beta: Decay of the exponential mean and variance.
        warmup_steps: Finite norms to observe before clipping starts (>= 2 for a variance).
        eps: Relative floor of the standard deviation.
        norm_type: Order of the norm.

    Example:
        >>> import torch
        >>> from trainopt.stability import ZScoreClipper
        >>> clipper = ZScoreClipper(z_threshold=2.0, warmup_steps=4)
        >>> w = torch.nn.Parameter(torch.zeros(1))
        >>> for g in [1.0, 3.0, 1.0, 3.0, 100.0]:   # mean 2, std 1 after warm-up
        ...     w.grad = torch.tensor([g]); norm = clipper([w])
        >>> norm.item(), round(w.grad.item(), 3), bool(clipper.last_clipped)
        (100.0, 4.0, True)
    """

    def __init__(
        self,
        z_threshold: float = 2.5,
        beta: float = 0.97,
        warmup_steps: int = 25,
        eps: float = 1e-3,
        norm_type: float = 2.0,
    ) -> None:
        super().__init__(beta, warmup_steps, norm_type)
        self.z_threshold = _positive_float("z_threshold", z_threshold)
        self.eps = _positive_float("eps", eps)

    def _threshold(self) -> torch.Tensor:
        std = torch.maximum(self.var.clamp_min(0).sqrt(), self.eps * self.mean.abs())
        warm = self.count >= max(self.warmup_steps, 2)
        return torch.where(
            warm, self.mean + self.z_threshold * std, torch.full_like(self.mean, math.inf)
        )

    def z_score(self, norm: torch.Tensor) -> torch.Tensor:
        """The z-score of ``norm`` against the current statistics (a tensor, no sync)."""
        std = torch.maximum(self.var.clamp_min(0).sqrt(), self.eps * self.mean.abs())
        return (norm - self.mean.to(norm.device)) / std.to(norm.device)
