"""Compare two sets of step times: the ratio of their medians with a bootstrap confidence interval.

Two spreads that overlap can still differ, and two that don't can come from one drifting
machine. The comparison here rests on *interleaved* windows (the two configurations take turns,
so drift hits both alike; :func:`~trainopt.perf.bench.timer.interleaved_windows`) and on a
percentile bootstrap of the ratio of medians (Efron and Tibshirani 1993):

.. code-block:: text

    speed-up = median(baseline step times) / median(candidate step times)

Resample each set with replacement, recompute the ratio, and take the ``(1 - c)/2`` and
``(1 + c)/2`` quantiles of the resampled ratios as the ``c`` interval. An interval that holds 1
says the data can't tell the two apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trainopt.perf.bench.results import Results, read_results
from trainopt.validation import check_int


def ratio_of_medians(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 4000,
    seed: int = 0,
) -> dict[str, float]:
    """``median(baseline) / median(candidate)`` with a percentile-bootstrap interval.

    For step times this is the candidate's speed-up (above 1: the candidate is faster).

    Args:
        baseline, candidate: Step times (or any positive measurements), at least one each.
        confidence: Coverage of the interval, in (0, 1).
        resamples: Bootstrap resamples.
        seed: Of the resampling, so the same data give the same interval.

    Returns:
        ``ratio``, ``low``, ``high``, ``confidence`` and ``resamples``.

    Example:
        >>> from trainopt.perf.bench.compare import ratio_of_medians
        >>> ci = ratio_of_medians([2.0, 2.1, 1.9, 2.0, 2.2], [1.0, 1.1, 0.9, 1.0, 1.0])
        >>> ci["ratio"], 1.7 < ci["low"] <= 2.0 <= ci["high"] < 2.5
        (2.0, True)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence=}")
    check_int("resamples", resamples, 1)
    a, b = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    if a.size == 0 or b.size == 0 or not (a > 0).all() or not (b > 0).all():
        raise ValueError("baseline and candidate must be non-empty and positive")
    rng = np.random.default_rng(seed)
    resampled_a = np.median(a[rng.integers(0, a.size, (resamples, a.size))], axis=1)
    resampled_b = np.median(b[rng.integers(0, b.size, (resamples, b.size))], axis=1)
    low, high = np.quantile(resampled_a / resampled_b, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {
        "ratio": float(np.median(a) / np.median(b)),
        "low": float(low),
        "high": float(high),
        "confidence": confidence,
        "resamples": resamples,
    }


def verdict(interval: dict[str, float]) -> str:
    """``"faster"``, ``"slower"`` or ``"no clear difference"`` (the interval holds 1).

    Example:
        >>> from trainopt.perf.bench.compare import verdict
        >>> verdict({"low": 1.1, "high": 1.3}), verdict({"low": 0.9, "high": 1.2})
        ('faster', 'no clear difference')
    """
    if interval["low"] > 1:
        return "faster"
    if interval["high"] < 1:
        return "slower"
    return "no clear difference"


def compare_results(
    baseline: Results, candidate: Results, *, confidence: float = 0.95, resamples: int = 4000
) -> list[dict[str, Any]]:
    """Every configuration measured in both results files, by name: speed-up of ``candidate``.

    Runs of separate processes are not interleaved: machine drift between the two runs enters
    the ratio, and the interval does not see it. Compare files written back to back on an idle
    machine, or time both sides in one process (:func:`interleaved_windows`).

    Example:
        >>> from trainopt.perf.bench.compare import compare_results
        >>> before = {"results": [{"name": "tiny", "status": "ok", "window_step_times_s": [2.0, 2.0,
        ...                                                                                2.1]}]}
        >>> after = {"results": [{"name": "tiny", "status": "ok", "window_step_times_s": [1.0, 1.0,
        ...                                                                               1.05]}]}
        >>> [(row["name"], row["ratio"], row["verdict"]) for row in compare_results(before, after)]
        [('tiny', 2.0, 'faster')]
    """

    def measured(results: Results) -> dict[str, list[float]]:
        return {
            r["name"]: r["window_step_times_s"]
            for r in results.get("results", [])
            if r.get("status") == "ok" and r.get("window_step_times_s")
        }

    a, b = measured(baseline), measured(candidate)
    rows = []
    for name in (n for n in a if n in b):
        interval = ratio_of_medians(a[name], b[name], confidence=confidence, resamples=resamples)
        rows.append(
            {
                "name": name,
                "baseline_s": float(np.median(a[name])),
                "candidate_s": float(np.median(b[name])),
                **interval,
                "verdict": verdict(interval),
            }
        )
    return rows


def render_comparison(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of :func:`compare_results`.

    Example:
        >>> from trainopt.perf.bench.compare import render_comparison
        >>> row = {"name": "tiny", "baseline_s": 0.02, "candidate_s": 0.01, "ratio": 2.0,
        ...        "low": 1.8, "high": 2.2, "confidence": 0.95, "verdict": "faster"}
        >>> print(render_comparison([row]).splitlines()[2])
        | tiny | 20.00 | 10.00 | 2.00× | 1.80–2.20 | faster |
    """
    level = f"{rows[0]['confidence']:.0%}" if rows else "95%"
    lines = [
        f"| configuration | baseline ms | candidate ms | speed-up | {level} interval | verdict |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    lines += [
        f"| {r['name']} | {r['baseline_s'] * 1e3:.2f} | {r['candidate_s'] * 1e3:.2f} "
        f"| {r['ratio']:.2f}× "
        f"| {r['low']:.2f}–{r['high']:.2f} | {r['verdict']} |"
        for r in rows
    ]
    return "\n".join(lines)


def load_pair(baseline: str, candidate: str) -> tuple[Results, Results]:
    """Read two results files; a missing one raises ``FileNotFoundError`` naming it.

    Example:
        >>> from trainopt.perf.bench.compare import load_pair
        >>> try:
        ...     load_pair("no/such/a.json", "no/such/b.json")
        ... except FileNotFoundError as error:
        ...     print(error)
        no/such/a.json
    """
    loaded = []
    for path in (baseline, candidate):
        results = read_results(path)
        if results is None:
            raise FileNotFoundError(path)
        loaded.append(results)
    return loaded[0], loaded[1]
