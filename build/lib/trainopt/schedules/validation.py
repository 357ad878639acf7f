"""Argument checks of the schedules, through :mod:`trainopt.validation`: each error names the
argument."""

from __future__ import annotations

import math
from typing import Any

from trainopt.validation import check_int as _check_int
from trainopt.validation import check_number


def check_int(name: str, value: Any, minimum: int = 0) -> None:
    """Raise ``ValueError`` unless ``value`` is an int (not a bool) of at least ``minimum``.

    Example:
        >>> from trainopt.schedules.validation import check_int
        >>> check_int("total_steps", 10, 1)
        >>> try:
        ...     check_int("total_steps", 2.5, 1)
        ... except ValueError as exc:
        ...     print(exc)
        total_steps must be an int >= 1, got total_steps=2.5
    """
    _check_int(name, value, minimum)


def check_float(name: str, value: Any, low: float = 0.0, high: float = math.inf) -> None:
    """Raise ``ValueError`` unless ``value`` is a number (not a bool) in ``[low, high]``.

    Example:
        >>> from trainopt.schedules.validation import check_float
        >>> check_float("decay_rate", 0.5, 0.0, 1.0)
        >>> try:
        ...     check_float("decay_rate", 1.5, 0.0, 1.0)
        ... except ValueError as exc:
        ...     print(exc)
        decay_rate must be a number in [0, 1], got decay_rate=1.5
    """
    check_number(name, value, low, high, low_open=False, high_open=False)


def check_run(total_steps: int, warmup_steps: int) -> None:
    """Check the length of a run: ``total_steps >= 1`` and ``0 <= warmup_steps < total_steps``.

    Example:
        >>> from trainopt.schedules.validation import check_run
        >>> check_run(total_steps=100, warmup_steps=10)
        >>> try:
        ...     check_run(total_steps=100, warmup_steps=100)
        ... except ValueError as exc:
        ...     print(exc)
        warmup_steps must be less than total_steps, got warmup_steps=100, total_steps=100
    """
    check_int("total_steps", total_steps, 1)
    check_int("warmup_steps", warmup_steps, 0)
    if warmup_steps >= total_steps:
        raise ValueError(
            f"warmup_steps must be less than total_steps, got {warmup_steps=}, {total_steps=}"
        )
