"""What :func:`~trainopt.diagnostics.diagnose` reports: the symptoms it knows and one finding.

The symptoms fall in two groups. Training dynamics (the loss and the gradient norm) have causes
that chain: a learning rate far too high blows the run up, and the blow-up leaves a plateau or a
NaN behind. Resources (memory, step time, communication) are judged on their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainopt.diagnostics.advice import advice

SYMPTOMS = (
    "nan_inf",
    "loss_explosion",
    "gradient_explosion",
    "diverging",
    "oscillating",
    "plateau",
    "slow_convergence",
    "out_of_memory",
    "slow_training",
    "comm_overhead",
)
"""Every symptom :func:`~trainopt.diagnostics.diagnose` can name, root causes first."""

BLOW_UPS = frozenset({"loss_explosion", "gradient_explosion", "diverging", "oscillating"})
"""Symptoms of updates too large: the earliest of them is the root cause of what follows it."""

NOUNS = {
    "loss_explosion": "loss explosion",
    "gradient_explosion": "gradient explosion",
    "diverging": "divergence",
    "oscillating": "oscillation",
}
"""How a blow-up is named when a later finding refers to it."""

DYNAMICS = frozenset(SYMPTOMS[:7])
"""Symptoms read from the loss and the gradient norm; a blow-up can cause any of them."""


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
        after: The step of the blow-up this finding follows from (its root cause), or None.

    Example:
        >>> from trainopt.diagnostics import diagnose
        >>> records = [{"step": t, "loss": 2.0 * 0.98**t, "grad_norm": 1.0} for t in range(100)]
        >>> records[60]["grad_norm"] = 50.0
        >>> finding = diagnose(records)[0]
        >>> finding.symptom, finding.step, finding.see, finding.after
        ('gradient_explosion', 60, 'guides/troubleshooting.md#gradient-explosion', None)
    """

    symptom: str
    step: int
    evidence: str
    cause: str
    fix: str
    see: str
    after: int | None = None

    def __str__(self) -> str:
        return (
            f"{self.symptom} (from step {self.step}): {self.evidence}\n"
            f"  cause: {self.cause}\n  fix: {self.fix}"
        )


def finding(symptom: str, step: int, evidence: str, *, early: bool = False) -> Finding:
    """A :class:`Finding` with the cause and fix of :func:`~trainopt.diagnostics.advice.advice`.

    Example:
        >>> from trainopt.diagnostics.findings import finding
        >>> f = finding("loss_explosion", 3, "loss 2.3 -> 900", early=True)
        >>> "far too high" in f.cause, f.after
        (True, None)
    """
    cause, fix, see, _ = advice(symptom, early=early)
    return Finding(symptom, int(step), evidence, cause, fix, see)
