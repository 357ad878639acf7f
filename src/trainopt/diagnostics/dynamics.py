"""The shape of the loss over a run: diverging, oscillating, a plateau, slow convergence.

The loss is cut into chunks and each chunk read by its median. A healthy run falls fast and
then decelerates; these checks name the runs that don't, including a run that ends far above
where it could be: stuck above its own early minimum, or back from an explosion at a worse level.
"""

from __future__ import annotations

import math

import numpy as np

from trainopt.diagnostics.findings import Finding, finding
from trainopt.diagnostics.robust import noise, rolling_median


def loss_dynamics(
    loss: np.ndarray,
    steps: np.ndarray,
    opts: dict[str, float],
    start: float | None = None,
    best_before: float | None = None,
) -> list[Finding]:
    """Diverging, oscillating, plateau or slow convergence, judged on the loss of (part of) a run.

    Args:
        loss: Finite losses, one per step (at least 20 to judge anything).
        steps: Their step numbers.
        opts: Thresholds (see :data:`trainopt.diagnostics.symptoms.DEFAULTS`).
        start: The loss the run started from; None takes the median of the first 5 values.
        best_before: Set when ``loss`` is what follows an explosion: the lowest loss before it.
            The end is then judged against where the run was, not against its own deceleration.

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.dynamics import loss_dynamics
        >>> from trainopt.diagnostics.symptoms import DEFAULTS
        >>> # after an explosion at step 7:
        >>> dead = np.full(200, 2.36) + 0.01 * np.sin(np.arange(200))
        >>> [f.symptom for f in loss_dynamics(dead, np.arange(30, 230), DEFAULTS, start=2.30,
        ...                                   best_before=1.1)]
        ['plateau']
    """
    findings: list[Finding] = []
    n = len(loss)
    if n < 20:
        return findings
    window = max(5, n // 20)
    own_start = float(np.median(loss[: min(5, n)]))
    start = own_start if start is None else float(start)
    levels = np.array([np.median(chunk) for chunk in np.array_split(loss, max(1, n // window))])
    level_noise = max(noise(loss) / math.sqrt(window), 1e-12)
    scale = max(abs(start), float(np.ptp(levels)), 1e-12)

    lowest = int(np.argmin(levels))
    rise = float(levels[-1] - levels[lowest])
    if (
        lowest < len(levels) - 2
        and rise > max(6 * level_noise, opts["diverge_fraction"] * scale)
        and min(levels[-2:]) > levels[lowest] + 0.5 * rise
    ):
        climb = steps[min(n - 1, lowest * window + window)]
        return [
            finding(
                "diverging",
                climb,
                (
                    f"loss fell to a median of {levels[lowest]:.4g}, then rose to {levels[-1]:.4g} "
                    f"from step {climb} (it started at {start:.4g})"
                ),
            )
        ]  # its tail says nothing about oscillation

    second = loss[n // 2 :]
    spread = float(np.subtract(*np.percentile(second - rolling_median(second, 9), [75, 25])))
    # A swing is a problem when the loss no longer improves: one still falling by more than it
    # swings over the second half (a log read early, batches that are noisy) is on its way.
    falling = float(levels[len(levels) // 2] - levels[-1]) > spread
    if spread > opts["oscillation_fraction"] * scale and not falling:
        findings.append(
            finding(
                "oscillating",
                steps[n // 2],
                (
                    f"in the second half the loss swings by {spread:.3g} around its running median "
                    f"(interquartile range), {spread / scale:.0%} of the loss scale {scale:.3g}"
                ),
            )
        )

    # A healthy run decelerates: most of its progress comes in the first half. Judging progress
    # by the starting loss alone would flag healthy runs whose loss is negative or has a high floor.
    progress = (start - float(levels[-1])) / max(abs(start), 1e-12)
    middle = float(levels[len(levels) // 2])
    early_drop, recent_drop = own_start - middle, middle - float(levels[-1])
    flat = recent_drop <= 4 * level_noise
    if best_before is None:
        decelerated = early_drop > 20 * level_noise and recent_drop < 0.5 * early_drop
        # A run that, at the pace of its second half, removes min_progress of its start within
        # half as many steps again is on its way (a log read midway, a loss speeding up).
        on_its_way = progress + recent_drop / max(abs(start), 1e-12) >= opts["min_progress"]
        if progress >= opts["min_progress"] or decelerated or on_its_way:
            return findings
        if flat:
            change = f"{progress:.1%} lower" if progress >= 0 else f"{-progress:.1%} higher"
            return findings + [
                finding(
                    "plateau",
                    steps[n // 2],
                    (
                        f"loss went from {start:.4g} to {levels[-1]:.4g} ({change}) and did not "
                        f"move beyond its noise ({level_noise:.2g}) over the second half"
                    ),
                )
            ]
        return findings + [
            finding(
                "slow_convergence",
                steps[0],
                (
                    f"loss is still falling steadily ({middle:.4g} to {levels[-1]:.4g} over the "
                    f"second half) but the whole run lowered it by only {progress:.1%}"
                ),
            )
        ]

    # After an explosion, a deceleration proves nothing: the run may have settled at a worse level.
    above = float(levels[-1]) - best_before
    if progress >= opts["min_progress"] and above <= opts["diverge_fraction"] * abs(start):
        return findings
    where = (
        f"the loss ends at a median {levels[-1]:.4g}, against {start:.4g} at the start and "
        f"{best_before:.4g} at its best before the explosion"
    )
    if flat:
        return findings + [
            finding(
                "plateau",
                steps[0],
                f"{where}; it has not moved beyond its noise since step {steps[n // 2]}",
            )
        ]
    return findings + [
        finding(
            "slow_convergence",
            steps[0],
            f"{where}; it is still falling ({middle:.4g} to {levels[-1]:.4g} over the second half)",
        )
    ]
