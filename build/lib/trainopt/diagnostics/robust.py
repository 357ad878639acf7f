"""Robust statistics of a logged signal: medians and the median absolute deviation.

One noisy step moves none of them much, so it neither raises an alarm nor hides one.
"""

from __future__ import annotations

import numpy as np


def mad(x: np.ndarray) -> float:
    """Median absolute deviation scaled to estimate a standard deviation (1.4826 × MAD).

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.robust import mad
        >>> round(mad(np.array([1.0, 2.0, 3.0, 4.0, 100.0])), 3)
        1.483
    """
    return float(1.4826 * np.median(np.abs(x - np.median(x)))) if len(x) else 0.0


def rolling_median(x: np.ndarray, width: int) -> np.ndarray:
    """The median of each value's centred window of ``width`` values (shorter at the ends).

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.robust import rolling_median
        >>> rolling_median(np.array([1.0, 9.0, 2.0, 3.0]), 3).tolist()
        [5.0, 2.0, 3.0, 2.5]
    """
    half, n = width // 2, len(x)
    out = np.array(
        [
            np.median(x[max(0, i - half) : i + half + 1]) if i < half or i >= n - half else np.nan
            for i in range(n)
        ]
    )
    if n > 2 * half:
        out[half : n - half] = np.median(
            np.lib.stride_tricks.sliding_window_view(x, 2 * half + 1), axis=1
        )
    return out


def noise(x: np.ndarray) -> float:
    """Step-to-step noise of a signal: the MAD of its residual around a 9-step rolling median.

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.robust import noise
        >>> noise(np.linspace(2.0, 1.0, 50)) < 1e-9
        True
    """
    return mad(x - rolling_median(x, 9)) if len(x) else 0.0


def spikes(x: np.ndarray, window: int, threshold: float, ratio: float) -> list[int]:
    """Indices where ``x`` jumps above its trailing median by ``threshold`` robust sigmas and by
    ``ratio`` × its level.

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.robust import spikes
        >>> x = np.ones(40)
        >>> x[30] = 50.0
        >>> spikes(x, window=10, threshold=10.0, ratio=9.0)
        [30]
    """
    found = []
    for t in range(window, len(x)):
        past = x[t - window : t]
        level = np.median(past)
        sigma = max(mad(past), 1e-3 * abs(level), 1e-12)
        jump = x[t] - level
        if jump > threshold * sigma and jump > ratio * max(abs(level), 1e-12):
            found.append(t)
    return found


def onset(x: np.ndarray, t: int, floor: float) -> int:
    """The first step of the stretch above ``floor`` that ends at step ``t`` (never step 0).

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.robust import onset
        >>> onset(np.array([2.3, 1.8, 1.1, 2.9, 4.0, 9.1]), 5, floor=2.3)
        3
    """
    while t > 1 and x[t - 1] > floor:
        t -= 1
    return t
