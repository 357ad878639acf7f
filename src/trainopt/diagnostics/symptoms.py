"""Name the likely problem of a training run from its logged metrics.

:func:`diagnose` reads a run's per-step records (a list of dicts, or a JSON Lines file with one
record per line) and returns :class:`Finding` objects: the symptom, the evidence in numbers, the
likely cause and the fix. Every statistic is robust (medians and the median absolute deviation),
so one noisy step neither raises nor hides an alarm, and nothing assumes a positive loss.

Record schema (every key is optional except ``loss`` for the loss checks; a missing key turns
off the checks that need it, and ``null``, ``NaN`` or ``"nan"`` values are read as NaN):

==================== ======================================================================
``step``             optimizer step (defaults to the record's position)
``loss``             training loss of the step (any sign)
``grad_norm``        global gradient norm *before* clipping
``lr``               learning rate of the first parameter group
``step_time``        wall-clock seconds of the whole step, data loading included
``tokens_per_s``     throughput (tokens, or samples, per second)
``comm_time``        seconds spent in gradient communication (all-reduce)
``memory_allocated`` bytes held by tensors
``memory_reserved``  bytes held by the allocator (cached included)
``max_memory``       bytes the run may use (the device's capacity, or a budget)
==================== ======================================================================

The records :class:`trainopt.perf.throughput.ThroughputMonitor` writes are read too: its
``step_time_median_ms``, ``memory_allocated_bytes``, ``memory_reserved_bytes`` and
``memory_total_bytes`` stand in for ``step_time``, ``memory_*`` and ``max_memory``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from trainopt.diagnostics.advice import ADVICE
from trainopt.diagnostics.records import _column, load_records

SYMPTOMS = (
    "nan_inf", "loss_explosion", "gradient_explosion", "diverging", "oscillating", "plateau",
    "slow_convergence", "out_of_memory", "slow_training", "comm_overhead",
)


"""Every symptom :func:`diagnose` can name, in the order it reports them (root causes first)."""


@dataclass(frozen=True)
class Finding:
    """One diagnosed symptom.

    Attributes:
        symptom: One of :data:`SYMPTOMS`.
        step: The step where the evidence starts.
        evidence: What in the metrics shows it, with numbers.
        cause: The likely cause.
        fix: What to do, naming the ``trainopt`` call.
        see: The page (relative to ``docs/``) and section that explain the fix.

    Example:
        >>> from trainopt.diagnostics import diagnose
        >>> records = [{"step": t, "loss": 2.0 * 0.98**t, "grad_norm": 1.0} for t in range(100)]
        >>> records[60]["grad_norm"] = 50.0
        >>> finding = diagnose(records)[0]
        >>> finding.symptom, finding.step, finding.see
        ('gradient_explosion', 60, 'guides/troubleshooting.md#gradient-explosion')
    """

    symptom: str
    step: int
    evidence: str
    cause: str
    fix: str
    see: str

    def __str__(self) -> str:
        return f"{self.symptom} (from step {self.step}): {self.evidence}\n  cause: {self.cause}\n  fix: {self.fix}"


def _mad(x: np.ndarray) -> float:
    """Median absolute deviation scaled to estimate a standard deviation (1.4826 × MAD)."""
    return float(1.4826 * np.median(np.abs(x - np.median(x)))) if len(x) else 0.0


def _rolling_median(x: np.ndarray, width: int) -> np.ndarray:
    half = width // 2
    return np.array([np.median(x[max(0, i - half) : i + half + 1]) for i in range(len(x))])


def _finding(symptom: str, step: int, evidence: str) -> Finding:
    cause, fix, see = ADVICE[symptom]
    return Finding(symptom, int(step), evidence, cause, fix, see)


def _first_bad(values: np.ndarray) -> int | None:
    bad = np.flatnonzero(~np.isfinite(values))
    return int(bad[0]) if len(bad) else None


def _spikes(x: np.ndarray, window: int, threshold: float, ratio: float) -> list[int]:
    """Indices where ``x`` jumps above its trailing median by ``threshold`` robust sigmas and by ``ratio`` × scale."""
    found = []
    for t in range(window, len(x)):
        past = x[t - window : t]
        level = np.median(past)
        sigma = max(_mad(past), 1e-3 * abs(level), 1e-12)
        jump = x[t] - level
        if jump > threshold * sigma and jump > ratio * max(abs(level), 1e-12):
            found.append(t)
    return found


def _loss_checks(loss: np.ndarray, steps: np.ndarray, opts: dict[str, float]) -> list[Finding]:
    findings = []
    n = len(loss)
    if n < 20:
        return findings
    window = max(5, n // 20)
    start = float(np.median(loss[: min(5, n)]))
    levels = np.array([np.median(chunk) for chunk in np.array_split(loss, max(1, n // window))])
    noise = _mad(loss - _rolling_median(loss, 9))
    level_noise = max(noise / math.sqrt(window), 1e-12)
    scale = max(abs(start), float(np.ptp(levels)), 1e-12)

    # An explosion damages the weights: the loss stays up for a window of steps. A one-step
    # spike that the next steps undo is a bad batch (see the gradient check), not an explosion.
    def stays_up(t: int, length: int) -> bool:
        before = np.median(loss[t - window : t])
        return bool(np.median(loss[t : t + length]) > before + opts["loss_spike_ratio"] * max(abs(before), 1e-12))

    sustained = [t for t in _spikes(loss, window, opts["spike_sigmas"], opts["loss_spike_ratio"])
                 if t + window <= n and stays_up(t, 5) and stays_up(t, window)]
    if sustained:
        t = sustained[0]
        before = float(np.median(loss[t - window : t]))
        findings.append(_finding("loss_explosion", steps[t], (
            f"loss jumped from a median of {before:.4g} to {loss[t]:.4g} at step {steps[t]} "
            f"and stayed at a median {np.median(loss[t : t + window]):.4g} over the next {window} steps")))

    lowest = int(np.argmin(levels))
    rise = float(levels[-1] - levels[lowest])
    if (lowest < len(levels) - 2 and rise > max(6 * level_noise, opts["diverge_fraction"] * scale)
            and min(levels[-2:]) > levels[lowest] + 0.5 * rise):
        onset = steps[min(n - 1, lowest * window + window)]
        findings.append(_finding("diverging", onset, (
            f"loss fell to a median of {levels[lowest]:.4g}, then rose to {levels[-1]:.4g} "
            f"from step {onset} (it started at {start:.4g})")))
        return findings  # a diverged run's tail says nothing about oscillation or plateaus

    second = loss[n // 2 :]
    spread = float(np.subtract(*np.percentile(second - _rolling_median(second, 9), [75, 25])))
    if spread > opts["oscillation_fraction"] * scale:
        findings.append(_finding("oscillating", steps[n // 2], (
            f"in the second half the loss swings by {spread:.3g} around its running median "
            f"(interquartile range), {spread / scale:.0%} of the loss scale {scale:.3g}")))

    # A healthy run decelerates: most of its progress comes in the first half. Judging progress
    # by the starting loss alone would flag healthy runs whose loss is negative or has a high floor.
    progress = (start - float(levels[-1])) / max(abs(start), 1e-12)
    middle = float(levels[len(levels) // 2])
    early_drop, recent_drop = start - middle, middle - float(levels[-1])
    decelerated = early_drop > 20 * level_noise and recent_drop < 0.5 * early_drop
    if progress < opts["min_progress"] and not decelerated and not sustained:
        if recent_drop <= 4 * level_noise:
            findings.append(_finding("plateau", steps[n // 2], (
                f"loss went from {start:.4g} to {levels[-1]:.4g} ({progress:.1%} lower) and did not "
                f"move beyond its noise ({level_noise:.2g}) over the second half")))
        else:
            findings.append(_finding("slow_convergence", steps[0], (
                f"loss is still falling steadily ({middle:.4g} to {levels[-1]:.4g} over the second half) "
                f"but the whole run lowered it by only {progress:.1%}")))
    return findings


def _grad_checks(grad: np.ndarray, steps: np.ndarray, opts: dict[str, float]) -> list[Finding]:
    n = len(grad)
    if n < 20:
        return []
    window = max(5, n // 20)
    spikes = _spikes(grad, window, opts["spike_sigmas"], opts["grad_spike_ratio"] - 1)
    if spikes:
        t = spikes[0]
        level = float(np.median(grad[t - window : t]))
        return [_finding("gradient_explosion", steps[t], (
            f"{len(spikes)} step(s) with a gradient norm over {opts['grad_spike_ratio']:.0f}x its recent "
            f"median; the first at step {steps[t]}: {grad[t]:.4g} against {level:.4g}"))]
    first, last = float(np.median(grad[:window])), float(np.median(grad[-window:]))
    if last > opts["grad_spike_ratio"] * max(first, 1e-12):
        return [_finding("gradient_explosion", steps[n - window], (
            f"the gradient norm grew from a median of {first:.4g} to {last:.4g}"))]
    return []


def _memory_checks(records: list[dict[str, Any]], steps: np.ndarray, opts: dict[str, float]) -> list[Finding]:
    capacity = _column(records, "max_memory")
    used = _column(records, "memory_reserved")
    if used is None or np.all(np.isnan(used)):
        used = _column(records, "memory_allocated")
    if capacity is None or used is None or np.all(np.isnan(used)) or np.all(np.isnan(capacity)):
        return []
    fraction = used / np.nanmax(capacity)
    if np.nanmax(fraction) < opts["memory_fraction"]:
        return []
    t = int(np.nanargmax(fraction >= opts["memory_fraction"]))
    growth = float(np.nanmedian(np.diff(used))) if len(used) > 1 else 0.0
    trend = (f"; it grows by a median {growth / 2**20:.2f} MiB per step, a leak" if growth > 0
             else "; it does not grow step to step")
    return [_finding("out_of_memory", steps[t], (
        f"memory in use reached {np.nanmax(fraction):.0%} of the {np.nanmax(capacity) / 2**30:.2f} GiB "
        f"available at step {steps[t]}{trend}"))]


def _speed_checks(records: list[dict[str, Any]], steps: np.ndarray, opts: dict[str, float]) -> list[Finding]:
    findings = []
    step_time = _column(records, "step_time")
    if step_time is None:
        throughput = _column(records, "tokens_per_s")
        step_time = 1.0 / throughput if throughput is not None else None
    if step_time is not None and len(step_time) >= 20:
        skip = max(1, len(step_time) // 20)  # the first steps include warm-up (allocation, compilation)
        times, n = step_time[skip:], len(step_time) - skip
        best_ratio, best_split = 0.0, 0
        for split in range(max(5, n // 10), n - max(5, n // 10)):
            ratio = np.nanmedian(times[split:]) / max(np.nanmedian(times[:split]), 1e-12)
            if ratio > best_ratio:
                best_ratio, best_split = float(ratio), split
        if best_ratio > opts["slowdown_ratio"]:
            at = skip + best_split
            findings.append(_finding("slow_training", steps[at], (
                f"the median step time rose {best_ratio:.1f}x at step {steps[at]}: "
                f"{np.nanmedian(times[:best_split]) * 1e3:.3g} ms before, {np.nanmedian(times[best_split:]) * 1e3:.3g} ms after")))
    comm = _column(records, "comm_time")
    if comm is not None and step_time is not None:
        share = float(np.nanmedian(comm / step_time))
        if share > opts["comm_fraction"]:
            findings.append(_finding("comm_overhead", steps[0], (
                f"gradient communication takes a median {share:.0%} of each step")))
    return findings


DEFAULTS: dict[str, float] = {
    "spike_sigmas": 10.0, "loss_spike_ratio": 1.0, "grad_spike_ratio": 10.0, "diverge_fraction": 0.2,
    "oscillation_fraction": 0.05, "min_progress": 0.5, "memory_fraction": 0.9, "slowdown_ratio": 1.5,
    "comm_fraction": 0.3,
}


def diagnose(source: str | Path | Iterable[dict[str, Any]], **thresholds: float) -> list[Finding]:
    """Name the likely symptoms of a run from its per-step metrics, root causes first.

    Args:
        source: A JSON Lines path, or an iterable of per-step dicts (see the module's schema).
        **thresholds: Overrides of :data:`DEFAULTS`: ``spike_sigmas`` (robust sigmas above the
            trailing median for a spike), ``loss_spike_ratio`` (a loss explosion at least doubles
            the loss when 1.0), ``grad_spike_ratio`` (a gradient spike is this many times its
            recent median), ``diverge_fraction``, ``oscillation_fraction`` (detrended swing over
            the loss scale), ``min_progress`` (fraction of the starting loss a run should remove),
            ``memory_fraction``, ``slowdown_ratio``, ``comm_fraction``.

    Returns:
        Findings ordered as :data:`SYMPTOMS`; an empty list for a healthy run.

    Example:
        >>> from trainopt.diagnostics import diagnose
        >>> import math
        >>> healthy = [{"step": t, "loss": 2.3 * math.exp(-t / 30) + 0.01 * (-1) ** t} for t in range(200)]
        >>> diagnose(healthy)
        []
        >>> broken = healthy[:150] + [{"step": t, "loss": math.nan} for t in range(150, 200)]
        >>> [f.symptom for f in diagnose(broken)], diagnose(broken)[0].step
        (['nan_inf'], 150)
    """
    unknown = set(thresholds) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown thresholds {sorted(unknown)}; allowed: {sorted(DEFAULTS)}")
    opts = {**DEFAULTS, **thresholds}
    records = load_records(source) if isinstance(source, (str, Path)) else list(source)
    if not records:
        return []
    step_col = _column(records, "step")
    steps = (np.arange(len(records)) if step_col is None or np.isnan(step_col).any() else step_col).astype(int)
    findings: list[Finding] = []
    loss, grad = _column(records, "loss"), _column(records, "grad_norm")
    end = len(records)
    for name, values in (("loss", loss), ("grad_norm", grad)):
        bad = _first_bad(values) if values is not None else None
        if bad is not None and bad < end:
            end = bad
            findings = [_finding("nan_inf", steps[bad], f"{name} is {values[bad]} at step {steps[bad]}")]
    if loss is not None:
        findings += _loss_checks(loss[:end], steps[:end], opts)
    if grad is not None:
        findings += _grad_checks(grad[:end], steps[:end], opts)
    findings += _memory_checks(records, steps, opts) + _speed_checks(records, steps, opts)
    return sorted(findings, key=lambda f: SYMPTOMS.index(f.symptom))
