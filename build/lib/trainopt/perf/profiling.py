"""Profile training steps with ``torch.profiler`` and time them correctly on a GPU.

- :class:`StepProfiler` wraps ``torch.profiler.profile`` with a wait / warm-up / active
  schedule, writes a Chrome trace per active cycle, and returns the top operators.
- :class:`LoaderWait` measures the time a training loop spends blocked on its data loader.
- :class:`StepTimer` times steps with CUDA events (GPU time, no sync per step) or
  ``time.perf_counter`` on a CPU, drops warm-up steps and reports percentiles. It is the one
  timer of trainopt: the benchmarks of :mod:`trainopt.perf.bench` time their windows with it.

CUDA kernels run asynchronously: ``time.perf_counter()`` around a step measures how long
Python took to *queue* the work, not how long the GPU took to do it. Events recorded on the
stream measure the GPU; reading them needs one synchronisation, done once at the end.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from trainopt.validation import check_int


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) with linear interpolation, as ``numpy.percentile``.

    Example:
        >>> from trainopt.perf import percentile
        >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([5.0], 90)
        (2.5, 5.0)
    """
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q=}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def clock_mark(device: str | torch.device) -> Any:
    """A point in time on ``device``: a CUDA event recorded on the current stream, else
    ``perf_counter()``.

    The event costs no synchronisation: the GPU stamps it when it reaches it in the stream.
    :func:`elapsed_ms` reads two marks. Every timer of trainopt (:class:`StepTimer`, the
    benchmarks, :class:`~trainopt.perf.throughput.ThroughputMonitor`) takes its marks here.

    Example:
        >>> import time
        >>> from trainopt.perf.profiling import clock_mark, elapsed_ms
        >>> start = clock_mark("cpu")
        >>> time.sleep(0.01)
        >>> elapsed_ms(start, clock_mark("cpu")) >= 10.0
        True
    """
    if torch.device(device).type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def elapsed_ms(start: Any, end: Any) -> float:
    """Milliseconds between two :func:`clock_mark` marks (CUDA events must have completed).

    Example:
        >>> from trainopt.perf.profiling import elapsed_ms
        >>> elapsed_ms(1.0, 1.25)  # two perf_counter() readings, in seconds
        250.0
    """
    if isinstance(start, float):
        return (end - start) * 1e3
    return start.elapsed_time(end)


def summarize(times_ms: Sequence[float]) -> dict[str, float]:
    """Count, mean, median, p10, p90 and p99 of step times in milliseconds.

    Example:
        >>> from trainopt.perf.profiling import summarize
        >>> summarize([10.0, 12.0, 11.0])["median_ms"]
        11.0
    """
    return {
        "count": float(len(times_ms)),
        "mean_ms": sum(times_ms) / len(times_ms),
        "median_ms": percentile(times_ms, 50),
        "p10_ms": percentile(times_ms, 10),
        "p90_ms": percentile(times_ms, 90),
        "p99_ms": percentile(times_ms, 99),
    }


class StepTimer:
    """Time training steps: CUDA events on a GPU, ``perf_counter`` on a CPU.

    Wrap each step in ``with timer.step():``. On CUDA the timer records a start and an end
    event on the current stream and never synchronises; :meth:`times_ms` synchronises once on
    the last event and converts every pair. The first ``warmup`` steps (allocator growth,
    cuDNN/cuBLAS autotuning, lazy optimizer state) are dropped.

    Example:
        >>> import torch
        >>> from trainopt.perf import StepTimer
        >>> timer = StepTimer("cpu", warmup=1)
        >>> for _ in range(4):
        ...     with timer.step():
        ...         _ = torch.randn(64, 64) @ torch.randn(64, 64)
        >>> len(timer.times_ms()), timer.summary()["median_ms"] > 0
        (3, True)
    """

    def __init__(self, device: str | torch.device = "cpu", warmup: int = 3) -> None:
        check_int("warmup", warmup, 0)
        self.device = torch.device(device)
        self.warmup = warmup
        self.use_cuda_events = self.device.type == "cuda"
        self._pairs: list[tuple[Any, Any]] = []

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Time the enclosed step."""
        start = clock_mark(self.device)
        yield
        self._pairs.append((start, clock_mark(self.device)))

    def times_ms(self) -> list[float]:
        """Step times in milliseconds after warm-up (synchronises once on CUDA)."""
        pairs = self._pairs[self.warmup :]
        if self.use_cuda_events and pairs:
            pairs[-1][1].synchronize()
        return [elapsed_ms(start, end) for start, end in pairs]

    def summary(self) -> dict[str, float]:
        """:func:`summarize` of :meth:`times_ms`."""
        times = self.times_ms()
        if not times:
            raise ValueError(f"no timed steps after warmup={self.warmup}; time more steps")
        return summarize(times)

    def reset(self) -> None:
        """Forget every recorded step."""
        self._pairs.clear()


class LoaderWait:
    """Wrap a data loader and measure the wall time the loop spends blocked in ``next()``.

    Iterating yields the loader's batches unchanged; :attr:`wait_s` holds, per batch, the
    seconds the host waited for it. With enough workers and prefetching the wait is near zero;
    a wait that is a large share of the step time means the input pipeline is the bottleneck.

    Example:
        >>> import time
        >>> from trainopt.perf import LoaderWait
        >>> def slow_batches():
        ...     for i in range(3):
        ...         time.sleep(0.01)
        ...         yield i
        >>> loader = LoaderWait(slow_batches())
        >>> list(loader), len(loader.wait_s), min(loader.wait_s) >= 0.01
        ([0, 1, 2], 3, True)
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.wait_s: list[float] = []

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            self.wait_s.append(time.perf_counter() - start)
            yield batch

    def __len__(self) -> int:
        return len(self.loader)


@dataclass(frozen=True)
class OperatorStat:
    """One row of the profiler's operator table; times in microseconds.

    :meth:`StepProfiler.top_operators` returns these.

    Example:
        >>> from trainopt.perf.profiling import OperatorStat
        >>> stat = OperatorStat("aten::mm", calls=54, self_cpu_us=864.0, self_device_us=0.0)
        >>> stat.name, stat.self_cpu_us / stat.calls
        ('aten::mm', 16.0)
    """

    name: str
    calls: int
    self_cpu_us: float
    self_device_us: float


class StepProfiler:
    """``torch.profiler`` over a few training steps, with a schedule and Chrome traces.

    The schedule skips ``wait`` steps, warms up for ``warmup`` (profiling, results thrown
    away: the first profiled steps carry the profiler's own start-up cost), then records
    ``active`` steps, ``repeat`` times. Call :meth:`step` at the end of every training step.
    Each completed cycle writes ``<trace_dir>/trace_<n>.json``; open it in
    ``chrome://tracing`` or https://ui.perfetto.dev.

    Example:
        >>> import torch
        >>> from trainopt.perf import StepProfiler
        >>> model = torch.nn.Linear(32, 32)
        >>> with StepProfiler("cpu", wait=1, warmup=1, active=2) as prof:
        ...     for _ in range(prof.total_steps):
        ...         model(torch.randn(8, 32)).sum().backward()
        ...         prof.step()
        >>> any(op.name == "aten::addmm" for op in prof.top_operators(20))
        True
    """

    def __init__(
        self,
        device: str | torch.device = "cpu",
        *,
        wait: int = 1,
        warmup: int = 1,
        active: int = 3,
        repeat: int = 1,
        trace_dir: str | Path | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
    ) -> None:
        for name, value, low in (
            ("wait", wait, 0),
            ("warmup", warmup, 0),
            ("active", active, 1),
            ("repeat", repeat, 1),
        ):
            check_int(name, value, low)
        self.device = torch.device(device)
        self.total_steps = (wait + warmup + active) * repeat
        self.trace_dir = Path(trace_dir) if trace_dir is not None else None
        self.traces: list[Path] = []
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        # Keep the operator statistics of every cycle, not only the last (torch >= 2.4).
        keep = (
            {"acc_events": True}
            if repeat > 1 and "acc_events" in inspect.signature(profile).parameters
            else {}
        )
        self._profile = profile(
            **keep,
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
            on_trace_ready=self._on_trace_ready,
            record_shapes=record_shapes,
            profile_memory=profile_memory,
            with_stack=with_stack,
        )

    def _on_trace_ready(self, prof: profile) -> None:
        if self.trace_dir is None:
            return
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        path = self.trace_dir / f"trace_{len(self.traces)}.json"
        prof.export_chrome_trace(str(path))
        self.traces.append(path)

    def __enter__(self) -> StepProfiler:
        self._profile.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._profile.__exit__(*exc)

    def step(self) -> None:
        """Mark the end of a training step (advances the schedule)."""
        self._profile.step()

    def top_operators(self, n: int = 10) -> list[OperatorStat]:
        """The ``n`` operators with the most self time (device time on CUDA, else CPU)."""
        key = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        rows = [
            OperatorStat(e.key, e.count, e.self_cpu_time_total, _self_device_us(e))
            for e in self._profile.key_averages()
        ]
        attr = "self_device_us" if key == "self_device_time_total" else "self_cpu_us"
        return sorted(rows, key=lambda r: getattr(r, attr), reverse=True)[:n]

    def table(self, row_limit: int = 10) -> str:
        """``key_averages().table(...)`` sorted by self device (CUDA) or self CPU time."""
        sort_by = "self_cpu_time_total"
        if self.device.type == "cuda":
            sort_by = "self_device_time_total" if _has_device_time() else "self_cuda_time_total"
        return self._profile.key_averages().table(sort_by=sort_by, row_limit=row_limit)


def _self_device_us(event: Any) -> float:
    return float(
        getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0))
    )


def _has_device_time() -> bool:
    from torch.autograd.profiler_util import FunctionEventAvg

    return hasattr(FunctionEventAvg(), "self_device_time_total")


def profile_steps(
    step_fn: Callable[[], Any], device: str | torch.device = "cpu", **kwargs: Any
) -> StepProfiler:
    """Run ``step_fn`` under a :class:`StepProfiler` for its full schedule and return it.

    Example:
        >>> import torch
        >>> from trainopt.perf import profile_steps
        >>> model = torch.nn.Linear(16, 16)
        >>> prof = profile_steps(lambda: model(torch.randn(4, 16)).sum().backward(), active=2)
        >>> "aten::addmm" in prof.table()
        True
    """
    with StepProfiler(device, **kwargs) as prof:
        for _ in range(prof.total_steps):
            step_fn()
            prof.step()
    return prof
