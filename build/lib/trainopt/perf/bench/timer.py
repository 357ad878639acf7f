"""The timer of every benchmark: warm up until the step time is stable, then time windows.

All timing goes through :class:`~trainopt.perf.profiling.StepTimer` (CUDA events on a GPU,
``perf_counter`` on a CPU): the harness, the stability benchmark and the performance
experiments time their steps with the same code the profiling page teaches.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from trainopt.perf.profiling import StepTimer

STABLE_WITHIN = 0.10  # two consecutive warm-up windows within 10% of each other: warmed up


def interleaved_windows(
    steps: Mapping[str, Callable[[], Any]],
    device: str | torch.device,
    steps_per_window: int,
    windows: int,
) -> dict[str, list[float]]:
    """Seconds per step of each named step function, in ``windows`` interleaved windows.

    Window ``w`` runs every function for ``steps_per_window`` steps, the order rotated by ``w``,
    so that drift of the clock or of the machine's load hits all of them alike. A
    :class:`~trainopt.perf.profiling.StepTimer` per function brackets each window: on CUDA two
    events and no synchronisation; the host waits once per function, when the times are read.

    Example:
        >>> import statistics, time
        >>> from trainopt.perf.bench.timer import interleaved_windows
        >>> times = interleaved_windows({"short": lambda: time.sleep(0.002),
        ...                              "long": lambda: time.sleep(0.02)},
        ...                             "cpu", steps_per_window=2, windows=3)
        >>> median = statistics.median
        >>> lengths = [len(times["short"]), len(times["long"])]
        >>> lengths, median(times["long"]) > median(times["short"])
        ([3, 3], True)
    """
    timers = {name: StepTimer(device, warmup=0) for name in steps}
    names = list(steps)
    for window in range(windows):
        for name in names[window % len(names) :] + names[: window % len(names)]:
            with timers[name].step():
                for _ in range(steps_per_window):
                    steps[name]()
    return {
        name: [ms / 1e3 / steps_per_window for ms in timer.times_ms()]
        for name, timer in timers.items()
    }


def time_windows(
    step: Callable[[], Any], device: str | torch.device, steps: int, windows: int
) -> list[float]:
    """Seconds per step in each of ``windows`` windows of ``steps`` steps
    (:func:`interleaved_windows`).

    Example:
        >>> from trainopt.perf.bench.timer import time_windows
        >>> times = time_windows(lambda: sum(range(1000)), "cpu", steps=3, windows=2)
        >>> len(times), all(t > 0 for t in times)
        (2, True)
    """
    return interleaved_windows({"step": step}, device, steps, windows)["step"]


def warm_up(
    step: Callable[[], Any],
    device: str | torch.device,
    *,
    min_steps: int,
    window: int,
    max_steps: int,
    tolerance: float = STABLE_WITHIN,
) -> dict[str, Any]:
    """Run ``step`` until its time per step is stable; return how long that took.

    First ``min_steps`` untimed steps (``torch.compile`` compiles here), then timed windows of
    ``window`` steps until two consecutive windows agree within ``tolerance`` (relative to the
    faster one), or until ``max_steps`` steps in all; ``stable`` says which ended it.

    Returns:
        ``steps`` (warm-up steps run), ``stable``, ``window_s`` (seconds per step of each timed
        warm-up window) and ``seconds`` (wall time of the whole warm-up).

    Example:
        >>> import itertools, time
        >>> from trainopt.perf.bench.timer import warm_up
        >>> slow_start = itertools.chain([0.2] * 3, itertools.repeat(0.05))
        >>> result = warm_up(lambda: time.sleep(next(slow_start)), "cpu", min_steps=0, window=3,
        ...                  max_steps=30)
        >>> result["stable"], result["steps"]  # the first window is slow; the next two agree
        (True, 9)
    """
    begin = time.perf_counter()
    for _ in range(min_steps):
        step()
    done, times = min_steps, []
    stable = False
    while done + window <= max(max_steps, min_steps + 2 * window) and not stable:
        times.append(time_windows(step, device, window, 1)[0])
        done += window
        stable = len(times) >= 2 and abs(times[-1] - times[-2]) <= tolerance * min(times[-2:])
    return {
        "steps": done,
        "stable": stable,
        "window_s": times,
        "seconds": time.perf_counter() - begin,
    }


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
    return {
        "median": statistics.median(ordered),
        "q1": q1,
        "q3": q3,
        "min": ordered[0],
        "max": ordered[-1],
    }
