"""Root cause first: put the blow-up that started a run's trouble first, and tie what followed to
it.

A learning rate far too high blows a run up in its first steps; the network then dies and the
loss sits on a plateau. Read on its own, the plateau asks for a *higher* learning rate: the
opposite of the truth. So the earliest sign of updates too large (a loss or gradient explosion,
a divergence, an oscillation) is the root cause. Each later symptom of the loss or the gradient
is reported after it, says so ("collapsed after the loss explosion at step 5"), and takes the
advice for what follows a blow-up, which never raises the learning rate.
"""

from __future__ import annotations

from dataclasses import replace

from trainopt.diagnostics.advice import advice
from trainopt.diagnostics.findings import BLOW_UPS, DYNAMICS, NOUNS, SYMPTOMS, Finding

SAME_EVENT_STEPS = 3
"""Blow-ups that start within this many steps of the first one are the same event, not its
consequence."""


def _name(f: Finding) -> str:
    return f"{NOUNS[f.symptom]} at step {f.step}"


def _tie(f: Finding, root: Finding) -> Finding:
    cause, fix, see, _ = advice(f.symptom, after=_name(root))
    lead = "collapsed after" if f.symptom == "plateau" and "explosion" in root.symptom else "after"
    return replace(
        f,
        evidence=f"{lead} the {_name(root)}: {f.evidence}",
        cause=cause,
        fix=fix,
        see=see,
        after=root.step,
    )


def _beside(f: Finding, root: Finding) -> Finding:
    cause, fix, see, _ = advice(f.symptom, beside=_name(root))
    return replace(f, cause=cause, fix=fix, see=see)


def root_cause_first(findings: list[Finding], nan_overflowed: bool = False) -> list[Finding]:
    """Order findings root cause first and tie each consequence of a blow-up to it.

    Args:
        findings: A run's findings, in any order.
        nan_overflowed: The first NaN came at the end of an explosion (an overflow). A NaN that
            arrives out of nowhere (bad data) is a root cause of its own and comes first.

    Returns:
        Without a blow-up, the findings in :data:`~trainopt.diagnostics.findings.SYMPTOMS`
        order. With one: an independent NaN, then the earliest blow-up (and any that start with
        it), then the symptoms that followed it, tied to it (``after`` is its step), then the rest.

    Example:
        >>> from trainopt.diagnostics.causes import root_cause_first
        >>> from trainopt.diagnostics.findings import finding
        >>> plateau = finding("plateau", 40, "the loss sits at 2.36")
        >>> explosion = finding("loss_explosion", 5, "2.3 -> 1e4", early=True)
        >>> first, then = root_cause_first([plateau, explosion])
        >>> first.symptom, then.symptom, then.after, then.evidence
        ('loss_explosion', 'plateau', 5,
            'collapsed after the loss explosion at step 5: the loss sits at 2.36')
        >>> "raise" in then.fix
        False
    """
    by_symptom = SYMPTOMS.index
    blow_ups = sorted(
        (f for f in findings if f.symptom in BLOW_UPS),
        key=lambda f: (f.step, by_symptom(f.symptom)),
    )
    if not blow_ups:
        return sorted(findings, key=lambda f: by_symptom(f.symptom))
    root = blow_ups[0]
    independent, roots, tied, rest = [], [], [], []
    for f in findings:
        if f.symptom not in DYNAMICS:
            rest.append(f)
        elif f.symptom == "nan_inf" and not nan_overflowed:
            independent.append(f)
        elif f.symptom in BLOW_UPS and f.step - root.step <= SAME_EVENT_STEPS:
            roots.append(f)
        elif f.step >= root.step:
            tied.append(_tie(f, root))
        else:
            rest.append(_beside(f, root))
    return (
        independent
        + sorted(roots, key=lambda f: (f.step, by_symptom(f.symptom)))
        + sorted(tied, key=lambda f: by_symptom(f.symptom))
        + sorted(rest, key=lambda f: by_symptom(f.symptom))
    )
