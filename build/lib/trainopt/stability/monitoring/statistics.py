"""Robust statistics on the device: medians, maxima, range and MAD scores that need no host sync."""

from __future__ import annotations

import math

import torch

MAD_TO_SIGMA = 1.4826


"""``1 / Φ⁻¹(3/4)``: the median absolute deviation times this estimates σ for normal data."""


def nanmedian(x: torch.Tensor) -> torch.Tensor:
    """Median of the non-NaN entries of a 1-d tensor (mean of the two middle values), without a
    sync.

    Sorting puts NaN last; the middle index comes from an on-device count of the non-NaN
    entries and is read with ``gather``, so nothing is copied to the host (some torch builds'
    ``nanmedian`` kernels read the count on the host). NaN when every entry is NaN.

    Example:
        >>> import torch
        >>> from trainopt.stability.monitoring.statistics import nanmedian
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
        >>> import torch
        >>> from trainopt.stability.monitoring.statistics import robust_zscore
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


def nanmax(x: torch.Tensor) -> torch.Tensor:
    """Largest non-NaN entry of a tensor, without a sync; NaN when every entry is NaN.

    Example:
        >>> import torch
        >>> from trainopt.stability.monitoring.statistics import nanmax
        >>> nanmax(torch.tensor([3.0, float("nan"), 1.0])), nanmax(torch.tensor([float("nan")]))
        (tensor(3.), tensor(nan))
    """
    flat = x.reshape(-1)
    largest = torch.where(torch.isnan(flat), torch.full_like(flat, -math.inf), flat).max()
    return torch.where(largest == -math.inf, torch.full_like(largest, math.nan), largest)


def tail_score(
    value: torch.Tensor,
    window: torch.Tensor,
    rel_floor: float = 1e-2,
    abs_floor: float = 1e-8,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """How far ``value`` lies above ``window``, in units of the window's own upper range.

    ``(value - median) / (max - median)``, NaN entries of the window ignored: 1 is the largest
    value the window holds, 3 is three times as far above the median as that. The unit is the
    window's own spread above its median, so a run whose per-batch loss is heavy-tailed (a
    converged classifier at small batches: median 1e-3, hard batches 100 times that) scores its
    hard batches near 1, while a batch with every label wrong scores in the tens. A robust z-score
    (median and MAD) calls those same hard batches spikes: the MAD sees only the typical batch.
    The unit is floored at ``rel_floor · |median|`` and ``abs_floor``, so a flat window does not
    turn every wiggle into a spike. Defined for zero and negative values (an RL loss) too.

    Several series are scored at once with a 2-d ``window`` (one row each) and a 1-d ``value``
    (one entry per row): one sort for all of them, the same numbers as one call per row (the
    stabilizer scores the loss and the gradient norm this way).

    Args:
        value: The new observation (0-d tensor), or one per row of ``window`` (1-d).
        window: Past accepted observations (1-d tensor, NaN for "missing"), or one row per series.
        rel_floor: Smallest unit relative to ``|median|``.
        abs_floor: Smallest unit in absolute terms.
        out: Where to write the score (a tensor of ``value``'s shape), or ``None``.

    Returns:
        A tensor of ``value``'s shape on ``window``'s device; NaN where the value is NaN or the
        window (row) is all NaN.

    Example:
        >>> import torch
        >>> from trainopt.stability import tail_score
        >>> window = torch.tensor([1e-3, 2e-3, 1e-3, 0.2, 3e-3])  # one hard batch at 0.2
        >>> round(tail_score(torch.tensor(0.15), window).item(), 2)  # another hard batch: in range
        0.75
        >>> round(tail_score(torch.tensor(4.0), window).item(), 1)  # every label wrong: far out
        20.2
    """
    median, largest = _median_and_max(window)
    unit = torch.maximum(largest - median, rel_floor * median.abs()).clamp_min(abs_floor)
    return torch.div(value.to(window.dtype) - median, unit, out=out)


_HALVES: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _median_and_max(window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`nanmedian` and :func:`nanmax` of ``window`` from one sort and one gather.

    A 2-d ``window`` gives one median and one maximum per row (the stabilizer's step scores the
    loss and the gradient norm as two rows), still from one sort: its operators are the
    stabilizer's per-step cost. Sorting puts NaN
    last; with ``n`` non-NaN entries the two middle ones sit at ``(n - 1) // 2`` and ``n // 2``
    and the largest at ``n - 1``, all three ``(n * a + b) // 2`` for constant ``a``, ``b``.
    """
    rows = window.dim() == 2
    ordered = torch.sort(window if rows else window.reshape(-1), dim=-1).values
    count = (ordered == ordered).sum(-1, keepdim=rows)  # NaN != NaN
    if window.device not in _HALVES:
        _HALVES[window.device] = (
            torch.tensor([1, 1, 2], device=window.device),
            torch.tensor([-1, 0, -2], device=window.device),
        )
    scale, shift = _HALVES[window.device]
    index = torch.div(count * scale + shift, 2, rounding_mode="floor").clamp_(
        0, max(ordered.shape[-1] - 1, 0)
    )
    picked = ordered.gather(-1, index)
    return picked[..., :2].mean(-1), picked[..., 2]


def _as_finite_or_nan(x: torch.Tensor) -> torch.Tensor:
    x = x.detach().float()
    return torch.where(torch.isfinite(x), x, math.nan)
