"""The argparse types of ``python -m trainopt.perf.bench``: each rejects a bad value in one line."""

from __future__ import annotations

import argparse

from trainopt.perf.bench.mfu import parse_peak_tflops


def non_negative_int(text: str) -> int:
    """An argparse ``type``: an int of at least 0.

    Example:
        >>> from trainopt.perf.bench.arguments import non_negative_int
        >>> non_negative_int("0"), non_negative_int("12")
        (0, 12)
    """
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0 or str(value) != text.strip().lstrip("+"):
        raise argparse.ArgumentTypeError(f"must be an int >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse ``type``: a number above 0.

    Example:
        >>> from trainopt.perf.bench.arguments import positive_float
        >>> positive_float("2.5")
        2.5
    """
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def peak_tflops(text: str) -> dict[str, float]:
    """The argparse ``type`` of ``--peak-tflops``
    (:func:`~trainopt.perf.bench.mfu.parse_peak_tflops`).

    Example:
        >>> from trainopt.perf.bench.arguments import peak_tflops
        >>> peak_tflops("bf16=835.5")
        {'bf16': 835.5}
    """
    try:
        return parse_peak_tflops(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def fraction(text: str) -> float:
    """An argparse ``type``: a number strictly between 0 and 1.

    Example:
        >>> from trainopt.perf.bench.arguments import fraction
        >>> fraction("0.9")
        0.9
    """
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {text!r}")
    return value


def at_least_two(text: str) -> int:
    """An argparse ``type``: an int of at least 2.

    Example:
        >>> from trainopt.perf.bench.arguments import at_least_two
        >>> at_least_two("4")
        4
    """
    value = non_negative_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be an int >= 2, got {text!r}")
    return value
