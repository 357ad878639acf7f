"""The cause and the fix of each symptom that :func:`trainopt.diagnostics.diagnose` names.

A symptom's advice depends on what else happened in the run. A plateau on its own means updates
too small; a plateau *after* an explosion means the explosion killed the network, and the same
"raise the learning rate" would make things worse. So each dynamics symptom has its own advice
(:data:`ADVICE`), the advice for an explosion in the first steps (:data:`EARLY`), and the advice
when it follows a blow-up (:data:`AFTER_BLOW_UP`). Each :class:`Advice` says which way it moves
the learning rate, so a test can hold that no diagnosis advises both ways.
"""

from __future__ import annotations

import math
from typing import NamedTuple

GUIDE = "guides/troubleshooting.md"


class Advice(NamedTuple):
    """The likely cause of a symptom, the fix, the section of the page, and the learning-rate move.

    ``cause`` is the likely cause in a sentence; ``fix`` what to do, naming the ``trainopt`` call;
    ``see`` the page (relative to ``docs/``) and its section; ``lr`` is ``"lower"`` or ``"raise"``
    if the fix moves the learning rate that way, else None.

    Example:
        >>> from trainopt.diagnostics.advice import ADVICE
        >>> ADVICE["plateau"].lr, ADVICE["diverging"].lr
        ('raise', 'lower')
    """

    cause: str
    fix: str
    see: str
    lr: str | None


CLIP = "clip with trainopt.stability.clip_gradients(model, max_norm=1.0)"
"""The clause of a fix that clips gradients, for a run that doesn't (:func:`fit_to_clipping`)."""
_ROLL_BACK = "trainopt.stability.TrainingRecovery"

ADVICE: dict[str, Advice] = {
    "nan_inf": Advice(
        "a NaN or Inf in the data, an operation outside its domain (log(0), 0/0), or an fp16 "
        "overflow",
        "check the batch of the first bad step with torch.isfinite: drop or repair a bad sample "
        "and check the data where it is loaded; run the step under torch.autograd.detect_anomaly() "
        "to find an operation that makes NaN; with fp16, a loss scaler "
        "(trainopt.stability.DynamicLossScaler) skips the steps whose gradients overflow, and bf16 "
        "has fp32's range",
        f"{GUIDE}#nan-or-inf",
        None,
    ),
    "loss_explosion": Advice(
        "one or a few updates far too large: a learning-rate spike, a bad batch, no clipping",
        f"{CLIP}, lower the peak learning rate, and roll back with {_ROLL_BACK} "
        "(its skip_batches skips the data around the spike)",
        f"{GUIDE}#loss-explosion",
        "lower",
    ),
    "gradient_explosion": Advice(
        "outlier batches or an unstable layer produce gradients many times their usual size",
        f"{CLIP}, or clip adaptively (trainopt.stability.ZScoreClipper), and check the data of "
        "the flagged steps",
        f"{GUIDE}#gradient-explosion",
        None,
    ),
    "diverging": Advice(
        "the learning rate is above the stable range (often the end of a warm-up to a peak too "
        "high)",
        "lower the peak learning rate (find one with trainopt.schedules.LearningRateFinder) and "
        "warm up with trainopt.schedules.cosine_annealing_schedule(optimizer, total_steps, "
        "warmup_steps)",
        f"{GUIDE}#loss-diverging",
        "lower",
    ),
    "oscillating": Advice(
        "steps too large for this stage of training: a learning rate (with SGD, a momentum) too "
        "high to settle, or batches too small and noisy",
        "decay the learning rate (trainopt.schedules.cosine_annealing_schedule) or lower it; "
        "with SGD, a momentum of 0.9 rather than 0.99; a larger batch lowers the noise",
        f"{GUIDE}#oscillating-loss",
        "lower",
    ),
    "plateau": Advice(
        "updates too small to change the loss: a tiny or fully decayed learning rate",
        "check the learning rate actually applied (trainopt.schedules.LRMonitor); raise it to a "
        "range test's suggestion (trainopt.schedules.LearningRateFinder)",
        f"{GUIDE}#plateau",
        "raise",
    ),
    "slow_convergence": Advice(
        "the learning rate is too small (a run at a higher rate gets further in the same steps), "
        "or it decays too early",
        "run a range test (trainopt.schedules.LearningRateFinder) and raise the rate to its "
        "suggestion; decay later (trainopt.schedules.wsd_schedule)",
        f"{GUIDE}#slow-convergence",
        "raise",
    ),
    "out_of_memory": Advice(
        "a leak (tensors kept with their autograd graph) if memory grows each step; otherwise "
        "activations of a batch too large",
        "keep only detached values (loss.item() every check_every steps, or .detach()), evaluate "
        "under torch.no_grad(); then see trainopt.perf.memory for checkpointing and smaller "
        "batches",
        f"{GUIDE}#out-of-memory",
        None,
    ),
    "slow_training": Advice(
        "something outside the model slowed each step: data loading, a host-device sync, logging",
        "profile a few steps (trainopt.perf.profiling) and compare the slow and fast steps",
        f"{GUIDE}#slow-training",
        None,
    ),
    "comm_overhead": Advice(
        "gradients are sent in many small messages, or communication does not overlap the backward "
        "pass",
        "all-reduce in large buckets and overlap with the backward pass (DDP's bucket_cap_mb; "
        "see trainopt.perf.distributed)",
        f"{GUIDE}#communication-overhead",
        None,
    ),
}
"""The advice for each symptom on its own."""

_EARLY_FIX = (
    "lower the learning rate about tenfold (trainopt.schedules.LearningRateFinder finds the edge), "
    "warm up to it with trainopt.schedules.cosine_annealing_schedule(optimizer, total_steps, "
    f"warmup_steps), and {CLIP}"
)

EARLY: dict[str, Advice] = {
    "loss_explosion": Advice(
        "a learning rate far too high from the first step (or initial weights far too large): "
        "the first updates overshoot",
        _EARLY_FIX,
        f"{GUIDE}#an-early-blow-up",
        "lower",
    ),
    "gradient_explosion": Advice(
        "a learning rate far too high from the first step (or initial weights far too large): "
        "each update makes the gradients larger",
        _EARLY_FIX,
        f"{GUIDE}#an-early-blow-up",
        "lower",
    ),
}
"""The advice for an explosion in the first steps, before the run could meet a bad batch."""

_RESTART = (
    f"restart from a checkpoint saved before the blow-up ({_ROLL_BACK}) with a lower learning "
    f"rate, and {CLIP}"
)

AFTER_BLOW_UP: dict[str, Advice] = {
    "nan_inf": Advice(
        "the {blow_up} kept growing until the values overflowed",
        f"fix the blow-up first: lower the learning rate and {CLIP}; skipping the "
        "non-finite steps would only hide it",
        f"{GUIDE}#nan-or-inf",
        "lower",
    ),
    "loss_explosion": Advice(
        "the {blow_up} made updates far too large, and they damaged the weights",
        f"{CLIP}, lower the learning rate, and roll back with {_ROLL_BACK}",
        f"{GUIDE}#loss-explosion",
        "lower",
    ),
    "gradient_explosion": Advice(
        "the {blow_up}: the gradients grow with the loss",
        f"fix the blow-up first: lower the learning rate and {CLIP}",
        f"{GUIDE}#gradient-explosion",
        "lower",
    ),
    "diverging": Advice(
        "the learning rate is still above the stable range after the {blow_up}",
        "lower the peak learning rate (trainopt.schedules.LearningRateFinder) and warm up with "
        "trainopt.schedules.cosine_annealing_schedule(optimizer, total_steps, warmup_steps)",
        f"{GUIDE}#loss-diverging",
        "lower",
    ),
    "oscillating": Advice(
        "the learning rate or the momentum is still too high after the {blow_up}",
        "lower the learning rate and decay it (trainopt.schedules.cosine_annealing_schedule); "
        "with SGD, a momentum of 0.9 rather than 0.99",
        f"{GUIDE}#oscillating-loss",
        "lower",
    ),
    "plateau": Advice(
        "updates too large, not too small: after the {blow_up} the loss no longer improves (a "
        "blow-up kills or saturates units; steps too large can't settle)",
        f"{_RESTART}; a higher learning rate would make it worse",
        f"{GUIDE}#an-early-blow-up",
        "lower",
    ),
    "slow_convergence": Advice(
        "the {blow_up} set the run back: it is recovering slowly, far above where it could be",
        f"{_RESTART}; a higher learning rate would make it worse",
        f"{GUIDE}#an-early-blow-up",
        "lower",
    ),
}
"""The advice for a symptom that follows a blow-up (``{blow_up}`` names it: "loss explosion at
step 5")."""

BESIDE_BLOW_UP: dict[str, Advice] = {
    symptom: Advice(
        ADVICE[symptom].cause + "; but the run also had a {blow_up}",
        "fix the blow-up first (the first finding); then tune the learning rate with a range test "
        "(trainopt.schedules.LearningRateFinder)",
        ADVICE[symptom].see,
        None,
    )
    for symptom in ("plateau", "slow_convergence")
}
"""The advice for a plateau or slow convergence that starts before a blow-up in the same run."""


def advice(
    symptom: str, *, early: bool = False, after: str | None = None, beside: str | None = None
) -> Advice:
    """The advice for ``symptom``: on its own, in the first steps, or after or beside a blow-up.

    Args:
        symptom: One of :data:`trainopt.diagnostics.findings.SYMPTOMS`.
        early: The symptom is an explosion in the first steps of the run.
        after: The blow-up it follows, e.g. ``"loss explosion at step 5"``.
        beside: A later blow-up of the same run (for a plateau or slow convergence before it).

    Example:
        >>> from trainopt.diagnostics.advice import advice
        >>> advice("plateau").lr, advice("plateau", after="loss explosion at step 5").lr
        ('raise', 'lower')
        >>> "after the loss explosion at step 5" in advice("plateau",
        ...                                                after="loss explosion at step 5").cause
        True
    """
    if after is not None and symptom in AFTER_BLOW_UP:
        cause, fix, see, lr = AFTER_BLOW_UP[symptom]
        return Advice(cause.format(blow_up=after), fix, see, lr)
    if beside is not None and symptom in BESIDE_BLOW_UP:
        cause, fix, see, lr = BESIDE_BLOW_UP[symptom]
        return Advice(cause.format(blow_up=beside), fix, see, lr)
    if early and symptom in EARLY:
        return EARLY[symptom]
    return ADVICE[symptom]


CLIPPED = (
    "keep clipping at max_norm={norm:g} (the run already clips there; it caps a step, not its "
    "cause)"
)
"""The clause that stands for :data:`CLIP` in a run that already clips at ``max_norm`` <= 1."""

CLIPPED_GRADIENT_FIX = (
    "the run already clips at max_norm={norm:g}, so these steps were capped: check the data of the "
    "flagged steps, clip adaptively (trainopt.stability.ZScoreClipper) to leave outliers out, and "
    "lower the learning rate if the norm keeps growing"
)
"""The fix of a gradient explosion on its own, in a run that already clips at ``max_norm`` <= 1."""


def fit_to_clipping(fix: str, max_grad_norm: float | None) -> str:
    """``fix`` for a run that clips its gradients at ``max_grad_norm`` (None: not known; 0: none).

    A fix that says to clip at 1.0 (:data:`CLIP`) says to keep the clipping of a run that
    already clips at 1.0 or less, and to clip tighter in a run that clips at more.

    Example:
        >>> from trainopt.diagnostics.advice import ADVICE, fit_to_clipping
        >>> fix = ADVICE["loss_explosion"].fix
        >>> fit_to_clipping(fix, None) == fit_to_clipping(fix, 0.0) == fix
        True
        >>> fit_to_clipping(fix, 1.0).split(";")[0]
        'keep clipping at max_norm=1 (the run already clips there'
        >>> "tighter than the run's max_grad_norm=5" in fit_to_clipping(fix, 5.0)
        True
    """
    if not max_grad_norm or not math.isfinite(max_grad_norm) or CLIP not in fix:
        return fix
    if max_grad_norm > 1.0:
        return fix.replace(CLIP, f"{CLIP}, tighter than the run's max_grad_norm={max_grad_norm:g}")
    if fix == ADVICE["gradient_explosion"].fix:
        return CLIPPED_GRADIENT_FIX.format(norm=max_grad_norm)
    return fix.replace(CLIP, CLIPPED.format(norm=max_grad_norm))
