"""The one check of a numeric argument: every error names the argument and what it allows.

Every function and class of trainopt checks its integer and numeric arguments with these two
functions, so a mistake reads the same everywhere: ``check_every must be an int >= 1, got
check_every=0``.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["check_int", "check_number"]


def check_int(
    name: str,
    value: Any,
    low: int = 1,
    *,
    none_ok: bool = False,
    owner: str | None = None,
    error: type[Exception] = ValueError,
) -> None:
    """Refuse ``value`` unless it is an int (not a bool) of at least ``low``, or ``None`` if
    allowed.

    Args:
        name: The argument's name, as the caller spells it.
        value: Its value.
        low: The smallest value allowed.
        none_ok: Also allow ``None``.
        owner: The class or group the argument belongs to, named before it
            (``Rollback.save_every``).
        error: The exception to raise.

    Example:
        >>> from trainopt.validation import check_int
        >>> check_int("check_every", 100)
        >>> try:
        ...     check_int("check_every", 0)
        ... except ValueError as error:
        ...     print(error)
        check_every must be an int >= 1, got check_every=0
        >>> try:
        ...     check_int("keep_last", 2.5, none_ok=True, owner="Rollback")
        ... except ValueError as error:
        ...     print(error)
        Rollback.keep_last must be an int >= 1 or None, got keep_last=2.5
    """
    if none_ok and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        where = f"{owner}.{name}" if owner else name
        allowed = f"an int >= {low}" + (" or None" if none_ok else "")
        raise error(f"{where} must be {allowed}, got {name}={value!r}")


def check_number(
    name: str,
    value: Any,
    low: float = 0.0,
    high: float = math.inf,
    *,
    low_open: bool = True,
    high_open: bool = True,
    none_ok: bool = False,
    owner: str | None = None,
) -> None:
    """Refuse ``value`` unless it is a number (not a bool) between ``low`` and ``high``.

    The default range is ``(0, inf)``: a positive finite number. ``low_open`` and ``high_open``
    say whether each end is excluded.

    Example:
        >>> from trainopt.validation import check_number
        >>> check_number("spike_factor", 4.0)
        >>> try:
        ...     check_number("lr_factor", 2.0, high=1.0, high_open=False, owner="Rollback")
        ... except ValueError as error:
        ...     print(error)
        Rollback.lr_factor must be a number in (0, 1], got lr_factor=2.0
        >>> try:
        ...     check_number("spike_factor", float("inf"))
        ... except ValueError as error:
        ...     print(error)
        spike_factor must be a positive finite number, got spike_factor=inf
    """
    if none_ok and value is None:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    inside = (
        number
        and (low < value if low_open else low <= value)
        and (value < high if high_open else value <= high)
    )
    if not inside:
        where = f"{owner}.{name}" if owner else name
        if low == 0 and low_open and high == math.inf and high_open:
            allowed = "a positive finite number"
        else:
            allowed = (
                f"a number in {'(' if low_open else '['}{low:g}, {high:g}"
                f"{')' if high_open else ']'}"
            )
        allowed += " or None" if none_ok else ""
        raise ValueError(f"{where} must be {allowed}, got {name}={value!r}")
