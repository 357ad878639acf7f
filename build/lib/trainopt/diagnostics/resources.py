"""Memory, step time and communication: the symptoms that don't come from the loss.

Each is judged on its own: a slow data pipeline or a leak has no bearing on the learning rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trainopt.diagnostics.findings import Finding, finding
from trainopt.diagnostics.records import column


def memory_checks(
    records: list[dict[str, Any]], steps: np.ndarray, opts: dict[str, float]
) -> list[Finding]:
    """``out_of_memory`` when memory in use nears ``max_memory``; says whether it grows (a leak).

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.resources import memory_checks
        >>> from trainopt.diagnostics.symptoms import DEFAULTS
        >>> records = [{"memory_reserved": (50 + t) * 2**20, "max_memory": 2**27}
        ...            for t in range(100)]
        >>> [f.symptom for f in memory_checks(records, np.arange(100), DEFAULTS)]
        ['out_of_memory']
    """
    capacity = column(records, "max_memory")
    used = column(records, "memory_reserved")
    if used is None or np.all(np.isnan(used)):
        used = column(records, "memory_allocated")
    if capacity is None or used is None or np.all(np.isnan(used)) or np.all(np.isnan(capacity)):
        return []
    fraction = used / np.nanmax(capacity)
    if np.nanmax(fraction) < opts["memory_fraction"]:
        return []
    t = int(np.nanargmax(fraction >= opts["memory_fraction"]))
    growth = float(np.nanmedian(np.diff(used))) if len(used) > 1 else 0.0
    trend = (
        f"; it grows by a median {growth / 2**20:.2f} MiB per step, a leak"
        if growth > 0
        else "; it does not grow step to step"
    )
    return [
        finding(
            "out_of_memory",
            steps[t],
            (
                f"memory in use reached {np.nanmax(fraction):.0%} of the "
                f"{np.nanmax(capacity) / 2**30:.2f} GiB available at step {steps[t]}{trend}"
            ),
        )
    ]


def speed_checks(
    records: list[dict[str, Any]], steps: np.ndarray, opts: dict[str, float]
) -> list[Finding]:
    """``slow_training`` when the median step time rises mid-run; ``comm_overhead`` when
    communication dominates.

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.resources import speed_checks
        >>> from trainopt.diagnostics.symptoms import DEFAULTS
        >>> records = [{"step_time": (0.1 if t < 60 else 0.3) + 0.01 * np.sin(t),
        ...             "comm_time": 0.01} for t in range(100)]
        >>> (found,) = speed_checks(records, np.arange(100), DEFAULTS)
        >>> found.symptom, abs(found.step - 60) <= 5
        ('slow_training', True)
    """
    findings = []
    step_time = column(records, "step_time")
    if step_time is None:
        throughput = column(records, "tokens_per_s")
        step_time = 1.0 / throughput if throughput is not None else None
    if step_time is not None and len(step_time) >= 20:
        skip = max(
            1, len(step_time) // 20
        )  # the first steps include warm-up (allocation, compilation)
        times, n = step_time[skip:], len(step_time) - skip
        best_ratio, best_split = 0.0, 0
        for split in range(max(5, n // 10), n - max(5, n // 10)):
            ratio = np.nanmedian(times[split:]) / max(np.nanmedian(times[:split]), 1e-12)
            if ratio > best_ratio:
                best_ratio, best_split = float(ratio), split
        if best_ratio > opts["slowdown_ratio"]:
            at = skip + best_split
            findings.append(
                finding(
                    "slow_training",
                    steps[at],
                    (
                        f"the median step time rose {best_ratio:.1f}x at step {steps[at]}: "
                        f"{np.nanmedian(times[:best_split]) * 1e3:.3g} ms before, "
                        f"{np.nanmedian(times[best_split:]) * 1e3:.3g} ms after"
                    ),
                )
            )
    comm = column(records, "comm_time")
    if comm is not None and step_time is not None:
        share = float(np.nanmedian(comm / step_time))
        if share > opts["comm_fraction"]:
            findings.append(
                finding(
                    "comm_overhead",
                    steps[0],
                    (f"gradient communication takes a median {share:.0%} of each step"),
                )
            )
    return findings
