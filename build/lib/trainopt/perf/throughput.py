"""Monitor training throughput: tokens/s, step-time percentiles, MFU and memory, with alerts.

:class:`ThroughputMonitor` records one CUDA event per step (no host sync) and resolves the
events only once they have completed (``event.query()``), so the numbers arrive a few steps
late but the step never waits for the GPU. Every ``log_every`` steps it writes a record to
JSONL and, where ``tensorboard`` is installed, to TensorBoard, and runs its alerts.

Model FLOPs utilisation (MFU) and the peak it divides by are defined once, in
:mod:`trainopt.perf.bench.mfu`: the dense peak of the precision in use, looked up by GPU name;
an unknown GPU needs ``peak_flops``, and a CPU has none (no MFU is recorded).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainopt.perf.bench.mfu import mfu, peak_flops_for
from trainopt.perf.profiling import clock_mark, elapsed_ms, percentile
from trainopt.validation import check_int


@dataclass(frozen=True)
class ThroughputDropAlert:
    """Fire when tokens/s falls below ``fraction`` × the best window seen so far.

    Example:
        >>> from trainopt.perf import ThroughputDropAlert
        >>> alert = ThroughputDropAlert(fraction=0.8)
        >>> history = [{"step": 10, "tokens_per_s": 1000.0}]
        >>> alert({"step": 20, "tokens_per_s": 900.0}, history) is None
        True
        >>> alert({"step": 30, "tokens_per_s": 700.0}, history)
        'throughput dropped to 700 tokens/s at step 30, below 80% of the best 1,000'
    """

    fraction: float = 0.8

    def __call__(self, record: dict[str, Any], history: Sequence[dict[str, Any]]) -> str | None:
        best = max((r["tokens_per_s"] for r in history), default=None)
        if best and record["tokens_per_s"] < self.fraction * best:
            return (
                f"throughput dropped to {record['tokens_per_s']:,.0f} tokens/s at step "
                f"{record['step']}, below {self.fraction:.0%} of the best {best:,.0f}"
            )
        return None


@dataclass(frozen=True)
class MemoryNearLimitAlert:
    """Fire when peak allocated memory exceeds ``fraction`` of ``limit_bytes``
    (default: the CUDA device's total memory).

    Example:
        >>> from trainopt.perf import MemoryNearLimitAlert
        >>> alert = MemoryNearLimitAlert(fraction=0.9, limit_bytes=8 * 2**30)
        >>> alert({"step": 5, "memory_peak_bytes": 4 * 2**30}, []) is None
        True
        >>> alert({"step": 6, "memory_peak_bytes": int(7.5 * 2**30)}, [])
        'peak memory 7.50 GiB at step 6 is above 90% of 8.00 GiB'
    """

    fraction: float = 0.9
    limit_bytes: int | None = None

    def __call__(self, record: dict[str, Any], history: Sequence[dict[str, Any]]) -> str | None:
        peak, limit = (
            record.get("memory_peak_bytes"),
            self.limit_bytes or record.get("memory_total_bytes"),
        )
        if peak is not None and limit and peak > self.fraction * limit:
            return (
                f"peak memory {peak / 2**30:.2f} GiB at step {record['step']} is above "
                f"{self.fraction:.0%} of {limit / 2**30:.2f} GiB"
            )
        return None


def warn_alert(message: str) -> None:
    """Default alert handler: a ``RuntimeWarning``.

    Example:
        >>> import warnings
        >>> from trainopt.perf.throughput import warn_alert
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_alert("throughput dropped")
        >>> caught[0].category.__name__, str(caught[0].message)
        ('RuntimeWarning', 'throughput dropped')
    """
    warnings.warn(message, RuntimeWarning, stacklevel=3)


class ThroughputMonitor:
    """Tokens/s, samples/s, step-time percentiles, MFU and memory every ``log_every`` steps.

    Call :meth:`step` once at the end of every training step. The first call only marks the
    start; each later call closes one step interval. Records land in :attr:`records`, in
    ``jsonl_path`` (one JSON object a line) and in TensorBoard when ``tensorboard_dir`` is set
    and ``tensorboard`` is installed (or pass any ``writer`` with ``add_scalar``).

    Args:
        tokens_per_step: Tokens each step processes (batch size × sequence length).
        samples_per_step: Sequences each step processes (default: not reported).
        flops_per_token: Training FLOPs per token, for MFU (default: not reported).
        peak_flops: Device peak FLOP/s; default: the dense peak of ``precision`` for the CUDA
            device (:func:`~trainopt.perf.bench.mfu.peak_flops_for`; a GPU missing from its
            table raises). A CPU has no default peak: no MFU unless given.
        precision: Which peak to use: ``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp16"``.
        device: The training device (CUDA events there; ``perf_counter`` elsewhere).
        log_every: Step intervals per record.
        alerts: Callables ``(record, history) -> message or None``.
        on_alert: Called with each alert message (default: a ``RuntimeWarning``).

    Example:
        >>> import torch
        >>> from trainopt.perf import ThroughputMonitor
        >>> monitor = ThroughputMonitor(tokens_per_step=1024, flops_per_token=1e6,
        ...                             peak_flops=1e12, log_every=2)
        >>> for _ in range(5):
        ...     _ = torch.randn(128, 128) @ torch.randn(128, 128)
        ...     monitor.step()
        >>> len(monitor.records), monitor.records[0]["tokens_per_s"] > 0
        (2, True)
    """

    def __init__(
        self,
        tokens_per_step: int,
        *,
        samples_per_step: int | None = None,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        precision: str = "bf16",
        device: str | torch.device = "cpu",
        log_every: int = 10,
        jsonl_path: str | Path | None = None,
        tensorboard_dir: str | Path | None = None,
        writer: Any = None,
        alerts: Sequence[Callable[..., str | None]] = (),
        on_alert: Callable[[str], None] = warn_alert,
    ) -> None:
        check_int("tokens_per_step", tokens_per_step, 1)
        check_int("log_every", log_every, 1)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        if peak_flops is None and flops_per_token is not None:
            peak_flops, _ = peak_flops_for(self.device, precision)
        self.tokens_per_step, self.samples_per_step = tokens_per_step, samples_per_step
        self.flops_per_token, self.peak = flops_per_token, peak_flops
        self.log_every, self.alerts, self.on_alert = log_every, list(alerts), on_alert
        self.jsonl_path = Path(jsonl_path) if jsonl_path is not None else None
        self.writer = writer if writer is not None else _tensorboard_writer(tensorboard_dir)
        self.records: list[dict[str, Any]] = []
        self.steps = 0
        self._pending: list[tuple[int, Any]] = []  # (step, mark) not yet resolved
        self._last: tuple[Any, float] | None = None  # last resolved mark and its wall time
        self._window: list[float] = []  # resolved step times (ms) of the current window
        self._resolved_step = -1

    def step(self) -> None:
        """Mark the end of a step. On CUDA: one event record, no sync."""
        self._pending.append((self.steps, clock_mark(self.device)))
        self.steps += 1
        self._resolve(block=False)

    def flush(self) -> None:
        """Wait for the pending steps and write a record for any partial window."""
        self._resolve(block=True)
        if self._window:
            self._emit()

    def _resolve(self, block: bool) -> None:
        while self._pending:
            step, mark = self._pending[0]
            if self.cuda and not block and not mark.query():
                return  # the GPU hasn't reached this step yet: read it later
            if self.cuda and block:
                mark.synchronize()
            self._pending.pop(0)
            if self._last is not None:
                previous = self._last[0]
                self._window.append(elapsed_ms(previous, mark))
            self._last = (mark, time.time())
            self._resolved_step = step
            if len(self._window) == self.log_every:
                self._emit()

    def _emit(self) -> None:
        times, self._window = self._window, []
        seconds = sum(times) / 1e3
        record: dict[str, Any] = {
            "step": self._resolved_step + 1,
            "time": self._last[1] if self._last else time.time(),
            "steps": len(times),
            "step_time_median_ms": percentile(times, 50),
            "step_time_p90_ms": percentile(times, 90),
            "tokens_per_s": self.tokens_per_step * len(times) / seconds
            if seconds > 0
            else float("inf"),
        }
        if self.samples_per_step is not None:
            record["samples_per_s"] = (
                record["tokens_per_s"] * self.samples_per_step / self.tokens_per_step
            )
        if self.flops_per_token is not None and self.peak:
            record["mfu"] = mfu(self.flops_per_token, record["tokens_per_s"], self.peak)
        if self.cuda:  # host-side allocator counters: reading them does not sync
            record["memory_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            record["memory_peak_bytes"] = torch.cuda.max_memory_allocated(self.device)
            record["memory_reserved_bytes"] = torch.cuda.memory_reserved(self.device)
            record["memory_total_bytes"] = torch.cuda.get_device_properties(
                self.device
            ).total_memory
            torch.cuda.reset_peak_memory_stats(self.device)
        for alert in self.alerts:
            message = alert(record, self.records)
            if message:
                self.on_alert(message)
        self.records.append(record)
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        if self.jsonl_path is not None:
            self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
            with self.jsonl_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key not in ("step", "time"):
                    self.writer.add_scalar(f"throughput/{key}", value, record["step"])

    def state_dict(self) -> dict[str, Any]:
        """Steps and records so far (pending CUDA events are not saved)."""
        return {"steps": self.steps, "records": list(self.records)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; the next :meth:`step` starts a new interval."""
        self.steps, self.records = int(state["steps"]), list(state["records"])
        self._pending, self._last, self._window = [], None, []


def _tensorboard_writer(log_dir: str | Path | None) -> Any:
    if log_dir is None:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        warnings.warn(
            "tensorboard is not installed (pip install tensorboard): writing JSONL only",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return SummaryWriter(log_dir=str(log_dir))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Read the records a monitor wrote to ``path``.

    Example:
        >>> from pathlib import Path
        >>> from trainopt.perf import ThroughputMonitor
        >>> from trainopt.perf import read_jsonl
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = Path(tmp, "throughput.jsonl")
        ...     monitor = ThroughputMonitor(256, log_every=2, jsonl_path=path)
        ...     for _ in range(5):
        ...         monitor.step()
        ...     records = read_jsonl(Path(tmp, "throughput.jsonl"))
        >>> len(records), records[-1]["step"], records == monitor.records
        (2, 5, True)
    """
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
