"""Name the likely problem of a training run from its logged metrics.

:func:`diagnose` reads a run's per-step records (a list of dicts, or a JSON Lines file with one
record per line) and returns :class:`Finding` objects: the symptom, the evidence in numbers, the
likely cause and the fix. Every statistic is robust (medians and the median absolute deviation),
so one noisy step neither raises nor hides an alarm, and nothing assumes a positive loss. The
first steps are judged too, against the run's first values and, when the caller says what the
loss should start at (``classes`` or ``initial_loss``), against that absolute scale. The findings
come root cause first (:mod:`~trainopt.diagnostics.causes`).

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
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainopt.diagnostics.advice import fit_to_clipping
from trainopt.diagnostics.causes import root_cause_first
from trainopt.diagnostics.dynamics import loss_dynamics
from trainopt.diagnostics.explosions import gradient_explosion, loss_explosion, overflowed
from trainopt.diagnostics.findings import SYMPTOMS, Finding, finding
from trainopt.diagnostics.records import column
from trainopt.diagnostics.resources import memory_checks, speed_checks
from trainopt.validation import check_int

if TYPE_CHECKING:
    from trainopt.diagnostics.logs.log import Log

__all__ = ["DEFAULTS", "SYMPTOMS", "Finding", "diagnose", "expected_loss", "first_nonfinite"]

DEFAULTS: dict[str, float] = {
    "spike_sigmas": 10.0,
    "loss_spike_ratio": 1.0,
    "grad_spike_ratio": 10.0,
    "grad_growth_ratio": 3.0,
    "diverge_fraction": 0.2,
    "oscillation_fraction": 0.05,
    "min_progress": 0.5,
    "memory_fraction": 0.9,
    "slowdown_ratio": 1.5,
    "comm_fraction": 0.3,
    "early_steps": 20,
}
"""The thresholds of :func:`diagnose`; each can be overridden by keyword."""


def first_nonfinite(values: np.ndarray) -> int | None:
    """The index of the first NaN or infinite value, or None if every value is finite.

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.symptoms import first_nonfinite
        >>> first_nonfinite(np.array([2.3, 1.9, np.inf, np.nan])), first_nonfinite(np.ones(3))
        (2, None)
    """
    bad = np.flatnonzero(~np.isfinite(values))
    return int(bad[0]) if len(bad) else None


def expected_loss(classes: int | None, initial_loss: float | None) -> float | None:
    """The loss a fresh model should start at: ``initial_loss``, else ``log(classes)``, else None.

    ``log(classes)`` is the cross-entropy of a uniform guess over ``classes`` classes.

    Example:
        >>> from trainopt.diagnostics.symptoms import expected_loss
        >>> round(expected_loss(10, None), 4), expected_loss(10, 0.7), expected_loss(None, None)
        (2.3026, 0.7, None)
    """
    if initial_loss is not None:
        if not math.isfinite(initial_loss):
            raise ValueError(f"initial_loss must be finite, got {initial_loss=}")
        return float(initial_loss)
    if classes is not None:
        check_int("classes", classes, 2)
        return math.log(classes)
    return None


def diagnose(
    source: str | Path | Log | Iterable[dict[str, Any]],
    *,
    classes: int | None = None,
    initial_loss: float | None = None,
    max_grad_norm: float | None = None,
    **thresholds: float,
) -> list[Finding]:
    """Name the likely symptoms of a run from its per-step metrics, root causes first.

    Args:
        source: A log (a JSON Lines or CSV file, a Hugging Face ``trainer_state.json`` or
            ``Trainer`` output folder, TensorBoard event files or their folder: see
            :func:`trainopt.diagnostics.logs.read_log`), a log already read, or an iterable of
            per-step dicts (see the module's schema).
        classes: For a classification loss (cross-entropy), the number of classes: a fresh model
            starts near ``log(classes)``, and a loss far above it is an explosion from step 1 on.
        initial_loss: The loss a fresh model should start at, for any other loss (it wins over
            ``classes``). Without either, the run's first logged loss is the reference.
        max_grad_norm: The norm the run clipped its gradients to (0: it didn't), so that the
            advice fits it: a run that already clips at 1.0 is not told to clip at 1.0. Without
            it, the log's own setting where it carries one (a ``Trainer``'s arguments).
        **thresholds: Overrides of :data:`DEFAULTS`: ``spike_sigmas`` (robust sigmas above the
            trailing median for a spike), ``loss_spike_ratio`` (a loss explosion at least doubles
            the loss when 1.0), ``grad_spike_ratio`` (a gradient spike is this many times its
            median before), ``grad_growth_ratio`` (a gradient norm that grows, step after step,
            to this many times its median before is exploding), ``diverge_fraction`` (a rise, or
            a sustained jump, smaller than this fraction of the loss scale is neither a
            divergence nor an explosion), ``oscillation_fraction`` (detrended swing over the loss
            scale), ``min_progress`` (fraction of the starting loss a run should remove),
            ``memory_fraction``, ``slowdown_ratio``, ``comm_fraction``, ``early_steps`` (an
            explosion that starts before this step gets the advice for a learning rate far too
            high).

    Returns:
        Findings, root cause first: an empty list for a healthy run. Without a blow-up they come
        in :data:`SYMPTOMS` order; with one, the earliest blow-up comes first and what followed it
        is tied to it (see :func:`~trainopt.diagnostics.causes.root_cause_first`). A run that
        goes on after a non-finite step (a bad batch, skipped) is judged on its finite steps;
        one that stays non-finite, on the steps before.

    Example:
        >>> from trainopt.diagnostics import diagnose
        >>> import math
        >>> healthy = [{"step": t, "loss": 2.3 * math.exp(-t / 30) + 0.01 * (-1) ** t}
        ...            for t in range(200)]
        >>> diagnose(healthy, classes=10)
        []
        >>> broken = healthy[:150] + [{"step": t, "loss": math.nan} for t in range(150, 200)]
        >>> [f.symptom for f in diagnose(broken)], diagnose(broken)[0].step
        (['nan_inf'], 150)
        >>> blown = [{"step": t, "loss": 2.3 if t < 3 else 5e3 if t < 8 else 2.4}
        ...          for t in range(200)]
        >>> [(f.symptom, f.step, f.after) for f in diagnose(blown, classes=10)]
        [('loss_explosion', 3, None), ('plateau', 8, 3)]
        >>> "already clips" in diagnose(blown, classes=10, max_grad_norm=1.0)[0].fix
        True
    """
    from trainopt.diagnostics.logs.log import Log

    unknown = set(thresholds) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown thresholds {sorted(unknown)}; allowed: {sorted(DEFAULTS)}")
    opts = {**DEFAULTS, **thresholds}
    expected = expected_loss(classes, initial_loss)
    if isinstance(source, (str, Path)):
        from trainopt.diagnostics.logs import read_log  # TensorBoard's reader when a log needs it

        source = read_log(source)
    if isinstance(source, Log):
        records = source.records
        if max_grad_norm is None:
            max_grad_norm = source.settings.get("max_grad_norm")
    else:
        records = list(source)
    if max_grad_norm is not None and not (
        isinstance(max_grad_norm, (int, float)) and max_grad_norm >= 0
    ):
        raise ValueError(
            f"max_grad_norm must be a number >= 0 (0: no clipping), got {max_grad_norm=}"
        )
    if not records:
        return []
    n = len(records)
    step_col = column(records, "step")
    steps = (np.arange(n) if step_col is None or np.isnan(step_col).any() else step_col).astype(int)
    findings: list[Finding] = []
    values = {name: column(records, name) for name in ("loss", "grad_norm")}
    logged = {name: np.array([name in r for r in records]) for name in values}
    end = n
    for name, v in values.items():
        bad = first_nonfinite(np.where(logged[name], v, 0.0)) if v is not None else None
        if bad is not None and bad < end:
            end = bad
            findings = [finding("nan_inf", steps[bad], f"{name} is {v[bad]} at step {steps[bad]}")]
    finite = np.ones(n, dtype=bool)
    for name, v in values.items():
        if v is not None:
            finite &= ~logged[name] | np.isfinite(v)
    # A run that goes on with finite values after its first non-finite step is judged on its
    # finite steps; one that stays non-finite to its end, on the steps before the first.
    keep = finite if end < n and finite[-1] else np.arange(n) < end

    def kept(name: str, rows: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        v = values[name]
        rows = rows & logged[name]
        return (None, steps[:0]) if v is None else (v[rows], steps[rows])

    nan_overflowed = end < n and overflowed(
        kept("loss", np.arange(n) < end)[0],
        kept("grad_norm", np.arange(n) < end)[0],
        opts,
        expected,
    )
    if nan_overflowed:
        findings = [
            replace(
                findings[0],
                evidence=findings[0].evidence
                + "; the values before it were exploding: an overflow",
            )
        ]
    loss, loss_steps = kept("loss", keep)
    grad, grad_steps = kept("grad_norm", keep)
    if loss is not None:
        explosion, episode = loss_explosion(
            loss, loss_steps, opts, expected, classes, initial_loss is not None
        )
        findings += [explosion] if explosion else []
        if episode is None:
            findings += loss_dynamics(loss, loss_steps, opts)
        else:
            # A climb that began before the explosion is its root cause: the run was diverging.
            findings += [
                f
                for f in loss_dynamics(loss[: episode.start], loss_steps[: episode.start], opts)
                if f.symptom == "diverging"
            ]
        if (
            episode is not None and episode.recovered is not None
        ):  # judge what the run became once back
            r = episode.recovered
            start = float(loss[0]) if expected is None else expected
            findings += loss_dynamics(
                loss[r:], loss_steps[r:], opts, start=start, best_before=episode.best_before
            )
    if grad is not None:
        explosion = gradient_explosion(grad, grad_steps, opts)
        findings += [explosion] if explosion else []
    findings += memory_checks(records, steps, opts) + speed_checks(records, steps, opts)
    return [
        replace(f, fix=fit_to_clipping(f.fix, max_grad_norm))
        for f in root_cause_first(findings, nan_overflowed)
    ]
