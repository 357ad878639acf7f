"""Read a run's logged metrics: JSON Lines or dicts, with aliases and NaN for missing values."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSON Lines metrics file (blank lines skipped; ``NaN``/``Infinity`` allowed).

    Example:
        >>> from trainopt.diagnostics import load_records
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
        >>> _ = open(path, "w").write('{"step": 0, "loss": 2.3}\\n\\n{"step": 1, "loss": NaN}\\n')
        >>> [r["step"] for r in load_records(path)]
        [0, 1]
    """
    records = []
    for n, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON record ({exc.msg})") from exc
    return records


ALIASES: dict[str, tuple[str, float]] = {
    "step_time": ("step_time_median_ms", 1e-3),
    "memory_allocated": ("memory_allocated_bytes", 1.0),
    "memory_reserved": ("memory_reserved_bytes", 1.0),
    "max_memory": ("memory_total_bytes", 1.0),
}
"""``key -> (the name ThroughputMonitor writes, factor to the key's unit)``."""


def column(records: list[dict[str, Any]], key: str) -> np.ndarray | None:
    """The values of ``key`` as floats (NaN where missing or unreadable), or None if no record has
    it.

    A key that no record has is read from its alias in :data:`ALIASES` (the names
    :class:`~trainopt.perf.ThroughputMonitor` writes), converted to seconds or bytes.

    Example:
        >>> from trainopt.diagnostics.records import column
        >>> column([{"loss": 2.3}, {"loss": None}, {}], "loss").tolist()
        [2.3, nan, nan]
        >>> column([{"step_time_median_ms": 250.0}], "step_time").tolist(), column([{}], "lr")
        ([0.25], None)
    """
    factor = 1.0
    if not any(key in r for r in records):
        if key not in ALIASES or not any(ALIASES[key][0] in r for r in records):
            return None
        key, factor = ALIASES[key]
    values = []
    for r in records:
        value = r.get(key)
        value = value * factor if isinstance(value, (int, float)) else value
        try:
            values.append(float(value) if value is not None else math.nan)
        except (TypeError, ValueError):
            values.append(math.nan)
    return np.asarray(values, dtype=float)
