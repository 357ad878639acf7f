"""Explosions of the loss and of the gradient norm, from the first step of a run on.

A rolling median needs a history before it can judge a step, and a learning rate far too high
shows itself before that history exists. So each signal is judged twice: against the run's
first values and an absolute sense of scale (a cross-entropy far above ``log(classes)``, the
loss of a uniform guess), and against its own recent median (a jump late in a run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainopt.diagnostics.findings import Finding, finding
from trainopt.diagnostics.robust import noise, onset, rolling_median, spikes

RECOVERY_STEPS = 5
"""A loss has recovered from an explosion once this many steps in a row are back under its
threshold."""


@dataclass(frozen=True)
class Episode:
    """A loss explosion: where it starts, the level it passed, and where the run is back under it.

    Attributes:
        start: Index of the first step of the climb.
        threshold: The loss level that counts as exploded.
        best_before: The lowest loss (3-step median) before the climb.
        recovered: Index from which the loss stays under ``threshold``; None if it never does.

    Example:
        >>> from trainopt.diagnostics.explosions import Episode
        >>> Episode(start=5, threshold=4.6, best_before=1.1, recovered=None).recovered is None
        True
    """

    start: int
    threshold: float
    best_before: float
    recovered: int | None


def _recovery(loss: np.ndarray, after: int, threshold: float) -> int | None:
    below = loss < threshold
    for r in range(after + 1, len(loss) - RECOVERY_STEPS + 1):
        if below[r : r + RECOVERY_STEPS].all():
            return r
    return None


def _describe(kind: str, expected: float, classes: int | None) -> str:
    if kind == "classes":
        return f"log({classes}) = {expected:.3g}, the loss of a uniform guess"
    return (
        f"the expected initial loss {expected:.3g}"
        if kind == "given"
        else f"its first value {expected:.3g}"
    )


def loss_explosion(
    loss: np.ndarray,
    steps: np.ndarray,
    opts: dict[str, float],
    expected: float | None = None,
    classes: int | None = None,
    given: bool = False,
) -> tuple[Finding | None, Episode | None]:
    """The first explosion of the loss, judged against its expected start and its recent median.

    Args:
        loss: Finite losses of the run, one per step.
        steps: Their step numbers.
        opts: Thresholds (see :data:`trainopt.diagnostics.symptoms.DEFAULTS`).
        expected: The loss a fresh model should start at (``log(classes)`` for a cross-entropy);
            None takes the first logged loss.
        classes: The number of classes ``expected`` comes from, to say so in the evidence.
        given: ``expected`` was given by the caller as an initial loss.

    Returns:
        The finding and its :class:`Episode`, or ``(None, None)``.

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.explosions import loss_explosion
        >>> from trainopt.diagnostics.symptoms import DEFAULTS
        >>> loss = np.r_[2.3, 2.2, 1.9, 3.5, 40.0, 900.0, 80.0, 9.0, np.full(60, 2.4)]
        >>> found, episode = loss_explosion(loss, np.arange(len(loss)), DEFAULTS,
        ...                                 expected=np.log(10), classes=10)
        >>> found.symptom, found.step, episode.recovered
        ('loss_explosion', 3, 8)
    """
    n = len(loss)
    if n < 2:
        return None, None
    ratio = opts["loss_spike_ratio"]
    kind = "classes" if classes is not None else "given" if given else "first"
    reference = float(loss[0]) if expected is None else float(expected)
    # The noise that sets the scale is that of the steps that did not pass (1 + ratio) times the
    # reference: a blown-up loss's would raise the scale, and with it the level it is back under.
    calm = loss[loss <= reference + ratio * abs(reference)]
    scale = max(abs(reference), 10 * noise(calm) if len(calm) >= 10 else 0.0, 1e-12)
    absolute = reference + ratio * scale
    crossed = [
        t for t in range(1, n) if loss[t] > absolute and np.median(loss[t : t + 3]) > absolute
    ]

    # Against the recent median: an explosion damages the weights, so the loss stays up for a
    # window of steps. A one-step spike that the next steps undo is a bad batch (see the
    # gradient), not this; nor is a rise that is small next to the loss scale (0.01 to 0.08 on a
    # cross-entropy from 2.3).
    window = max(5, n // 20)
    least = opts["diverge_fraction"] * scale

    def stays_up(t: int, length: int) -> bool:
        before = np.median(loss[t - window : t])
        return bool(np.median(loss[t : t + length]) > before + max(ratio * abs(before), least))

    sustained = (
        [
            t
            for t in spikes(loss, window, opts["spike_sigmas"], ratio)
            if t + window <= n and stays_up(t, 5) and stays_up(t, window)
        ]
        if n >= 20
        else []
    )
    if not crossed and not sustained:
        return None, None
    if crossed and (not sustained or crossed[0] <= sustained[0]):
        t = crossed[0]
        start = onset(loss, t, floor=reference)  # the climb starts where the loss passes its start
        best = float(np.min(rolling_median(loss[:start], 3)))
        threshold = absolute
        evidence = (
            f"the loss rose from {loss[start - 1]:.3g} at step {steps[start - 1]} to {loss[t]:.4g} "
            f"at step {steps[t]}, over {1 + ratio:g}x {_describe(kind, reference, classes)}"
        )
    else:
        t = start = sustained[0]
        best = float(np.median(loss[t - window : t]))
        threshold = best + max(ratio * abs(best), least)
        evidence = (
            f"the loss jumped from a median of {best:.4g} to {loss[t]:.4g} at step {steps[t]} and "
            f"stayed at a median {np.median(loss[t : t + window]):.4g} over the next {window} steps"
        )
    peak = t + int(np.argmax(loss[t:]))
    recovered = _recovery(loss, peak, threshold)
    evidence += f"; it peaked at {loss[peak]:.3g} at step {steps[peak]}"
    if recovered is None:
        evidence += (
            f" and never came back under {threshold:.3g}: "
            f"it ends at {np.median(loss[-window:]):.3g}"
        )
    else:
        evidence += f" and is back under {threshold:.3g} from step {steps[recovered]}"
    early = steps[start] < opts["early_steps"]
    return finding("loss_explosion", steps[start], evidence, early=early), Episode(
        start, threshold, best, recovered
    )


GROWTH_STEPS = 4
"""A gradient norm that rises this many steps in a row, fast and clear of its noise, to
``grad_growth_ratio`` times its median before, is growing out of control: each update makes the
next gradient larger."""


def growth(grad: np.ndarray, window: int, ratio: float) -> tuple[int, int, float] | None:
    """The first climb of the gradient norm out of its noise: :data:`GROWTH_STEPS` steps in a row
    that each rise, each above the largest norm of the ``window`` steps before the climb, that
    together multiply the norm by at least ``sqrt(ratio)``, and end at ``ratio`` times the median
    of that window.

    A converged model's gradient norm is noisy: it can rise four steps in a row from a low to
    three times its median, but not past the largest of its recent values, and not steadily.

    Returns:
        ``(start, t, level)``: the index where the climb began, the index where it passed
        ``ratio`` times ``level``, and ``level``, the median before; or None.

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.explosions import growth
        >>> grad = np.r_[np.ones(50), 1.3 ** np.arange(1, 20)]  # 30 % a step from index 50
        >>> growth(grad, window=15, ratio=3.0)
        (50, 54, 1.0)
        >>> noisy = np.random.default_rng(0).lognormal(0.0, 0.7, size=300)
        >>> growth(noisy, window=15, ratio=3.0) is None
        True
    """
    rising = np.r_[False, grad[1:] > grad[:-1]]
    for t in range(window + GROWTH_STEPS, len(grad)):
        climb = grad[t - GROWTH_STEPS + 1 : t + 1]
        if not rising[t - GROWTH_STEPS + 1 : t + 1].all():
            continue
        start = t
        while start > 1 and rising[start]:  # back to the first step of the climb
            start -= 1
        start += 1
        if start < window:
            continue
        before = grad[start - window : start]
        level = float(np.median(before))
        if (
            grad[t] > ratio * max(level, 1e-12)
            and (climb > np.max(before)).all()
            and grad[t] >= math.sqrt(ratio) * grad[t - GROWTH_STEPS]
        ):
            return start, t, level
    return None


def gradient_explosion(
    grad: np.ndarray, steps: np.ndarray, opts: dict[str, float]
) -> Finding | None:
    """Steps whose gradient norm is ``grad_spike_ratio`` times its median so far, from step 1 on.

    In the first window of steps the median of all the steps before is the reference (the
    first gradient norms of a fresh model are the scale); later, a spike must be that many times
    both the median of the last window and the median of all the steps before it.

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.explosions import gradient_explosion
        >>> from trainopt.diagnostics.symptoms import DEFAULTS
        >>> grad = np.r_[0.4, 0.5, 0.6, 30.0, 900.0, np.full(60, 0.3)]
        >>> found = gradient_explosion(grad, np.arange(len(grad)), DEFAULTS)
        >>> found.step, "first steps" in found.cause or "first step" in found.cause
        (3, True)
    """
    n = len(grad)
    ratio = opts["grad_spike_ratio"]
    window = max(5, n // 20)
    early = [
        t
        for t in range(1, min(window, n))
        if grad[t] > ratio * max(float(np.median(grad[:t])), 1e-12)
    ]
    # Late in a run the gradients of a converged model are small, and one hard batch brings back
    # the norm of the early steps: 10x the recent median, but not 10x the run's usual scale.
    late = [
        t
        for t in (spikes(grad, window, opts["spike_sigmas"], ratio - 1) if n >= 20 else [])
        if grad[t] > ratio * float(np.median(grad[:t]))
    ]
    found = early + late
    growing = growth(grad, window, opts["grad_growth_ratio"])
    if growing is not None and (not found or growing[1] < found[0]):
        start, t, level = growing
        return finding(
            "gradient_explosion",
            steps[start],
            (
                f"the gradient norm grew step after step from {level:.4g} (its median before) to "
                f"{grad[t]:.4g} at step {steps[t]}, {grad[t] / level:.1f}x in {t - start + 1} "
                f"steps; the largest {np.max(grad[t:]):.4g} at step "
                f"{steps[t + int(np.argmax(grad[t:]))]}"
            ),
            early=steps[start] < opts["early_steps"],
        )
    if found:
        t = found[0]
        level = float(np.median(grad[:t] if t < window else grad[t - window : t]))
        start = onset(grad, t, floor=math.sqrt(ratio) * level) if t < window else t
        return finding(
            "gradient_explosion",
            steps[start],
            (
                f"{len(found)} step(s) with a gradient norm over {ratio:.0f}x its median before; "
                f"the first at step {steps[t]}: {grad[t]:.4g} against {level:.4g}; the largest "
                f"{np.max(grad[t:]):.4g} at step {steps[t + int(np.argmax(grad[t:]))]}"
            ),
            early=steps[start] < opts["early_steps"],
        )
    if n < 20:
        return None
    first, last = float(np.median(grad[:window])), float(np.median(grad[-window:]))
    if last > ratio * max(first, 1e-12):
        return finding(
            "gradient_explosion",
            steps[n - window],
            (f"the gradient norm grew from a median of {first:.4g} to {last:.4g}"),
        )
    return None


def overflowed(
    loss: np.ndarray | None,
    grad: np.ndarray | None,
    opts: dict[str, float],
    expected: float | None = None,
) -> bool:
    """Whether the steps just before the first non-finite one were exploding (an overflow, not bad
    data).

    Args:
        loss: The losses logged before the first non-finite step (None: not logged).
        grad: The gradient norms logged before it.
        opts: Thresholds (see :data:`trainopt.diagnostics.symptoms.DEFAULTS`).
        expected: The loss a fresh model should start at; None takes the first one.

    Example:
        >>> import numpy as np
        >>> from trainopt.diagnostics.explosions import overflowed
        >>> from trainopt.diagnostics.symptoms import DEFAULTS
        >>> overflowed(np.array([2.3, 50.0, 4e4, 3e9]), None, DEFAULTS)
        True
        >>> overflowed(np.array([2.3, 2.1, 1.9, 1.8]), None, DEFAULTS)
        False
    """
    if loss is not None and len(loss) >= 2:
        reference = float(loss[0]) if expected is None else expected
        last = loss[max(1, len(loss) - 3) :]
        if np.median(last) > reference + opts["loss_spike_ratio"] * max(abs(reference), 1e-12):
            return True
    if grad is not None and len(grad) >= 2:
        last = grad[max(1, len(grad) - 3) :]
        return bool(np.median(last) > opts["grad_spike_ratio"] * max(float(grad[0]), 1e-12))
    return False
