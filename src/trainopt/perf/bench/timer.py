"""Time training steps: CUDA events on a GPU, the wall clock on a CPU; median and spread."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch

from trainopt.perf.profiling import StepTimer


def time_windows(step: Callable[[], None], device: str | torch.device, steps: int, windows: int) -> list[float]:
    """Seconds per step in each of ``windows`` windows of ``steps`` steps.

    A :class:`~trainopt.perf.profiling.StepTimer` brackets each window: on CUDA with two events
    and no synchronisation, so the steps run asynchronously, as in training; the host waits
    once, on the last event, when the times are read. On a CPU the wall clock is exact.

    Example:
        >>> from trainopt.perf.bench.timer import time_windows
        >>> times = time_windows(lambda: sum(range(1000)), "cpu", steps=3, windows=2)
        >>> len(times), all(t > 0 for t in times)
        (2, True)
    """
    timer = StepTimer(device, warmup=0)
    for _ in range(windows):
        with timer.step():
            for _ in range(steps):
                step()
    return [ms / 1e3 / steps for ms in timer.times_ms()]


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, min and max of ``values``.

    Example:
        >>> from trainopt.perf.bench.timer import spread
        >>> spread([4.0, 1.0, 3.0, 2.0, 5.0])
        {'median': 3.0, 'q1': 2.0, 'q3': 4.0, 'min': 1.0, 'max': 5.0}
    """
    ordered = sorted(values)
    if len(ordered) == 1:
        q1 = q3 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return {"median": statistics.median(ordered), "q1": q1, "q3": q3,
            "min": ordered[0], "max": ordered[-1]}
