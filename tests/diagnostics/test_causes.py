"""Root cause first, and advice that never contradicts it: over every pair of symptoms that can
occur together.

Each symptom is either a shape of the loss (the run's baseline) or an event laid over it, so any
two combine into one synthetic run: a plateau after an early explosion, a gradient spike on a
slow run, a NaN at the end of an oscillating one.
"""

from __future__ import annotations

import math
import random
import re
from itertools import combinations

import pytest

from trainopt.diagnostics import diagnose
from trainopt.diagnostics.advice import ADVICE, AFTER_BLOW_UP, BESIDE_BLOW_UP, EARLY, advice
from trainopt.diagnostics.causes import root_cause_first
from trainopt.diagnostics.findings import BLOW_UPS, DYNAMICS, SYMPTOMS, finding

N = 300
SHAPES = ("plateau", "slow_convergence", "diverging", "oscillating")

# Pairs that diagnose never names together, by construction: a diverging run's tail is not judged
# for oscillation or progress (it climbs), and a run without progress is either flat or falling.
EXCLUSIVE = {
    frozenset({"diverging", "oscillating"}),
    frozenset({"diverging", "plateau"}),
    frozenset({"diverging", "slow_convergence"}),
    frozenset({"plateau", "slow_convergence"}),
}
PAIRS = [(a, b) for a, b in combinations(SYMPTOMS, 2) if frozenset({a, b}) not in EXCLUSIVE]


def _swing(t: int) -> float:
    """From step 100, the loss swings up and back with a period of 7 steps."""
    return 0.25 * (1 + math.sin(2 * math.pi * t / 7)) if t >= 100 else 0.0


def _loss(shape: str | None, t: int, rng: random.Random) -> float:
    noise = rng.gauss(0, 0.01)
    if shape == "plateau":
        return 2.3 + noise
    if shape == "slow_convergence":
        return 2.3 - 0.002 * t + noise
    healthy = 2.3 * math.exp(-t / 40) + 0.05 + noise
    return healthy + 0.02 * max(0, t - 150) if shape == "diverging" else healthy


def scenario(*symptoms: str, seed: int = 0) -> list[dict]:
    """A 300-step run that shows each of ``symptoms``."""
    rng = random.Random(seed)
    shapes = [s for s in symptoms if s in SHAPES and s != "oscillating"]
    base = shapes[0] if shapes else None
    records = []
    for t in range(N):
        loss = _loss(base, t, rng) + (_swing(t) if "oscillating" in symptoms else 0.0)
        records.append(
            {
                "step": t,
                "loss": loss,
                "grad_norm": 5.0 * math.exp(-t / 60) + 0.05 * rng.random() + 0.05,
                "step_time": 0.1 + 0.005 * rng.random(),
            }
        )
    if "loss_explosion" in symptoms:  # an early blow-up the run comes back from
        for t, value in zip(range(3, 9), (6.0, 80.0, 900.0, 300.0, 40.0, 8.0)):
            records[t]["loss"] = value
    if "gradient_explosion" in symptoms:
        records[120]["grad_norm"] = 100.0
    if "nan_inf" in symptoms:  # a bad sample: it comes out of nowhere
        for r in records[280:]:
            r["loss"] = math.nan
    if "out_of_memory" in symptoms:
        for r in records:
            r.update(memory_reserved=(50 + r["step"] * 0.15) * 2**30 / 100, max_memory=2**30)
    if "slow_training" in symptoms:
        for r in records[200:]:
            r["step_time"] *= 3
    if "comm_overhead" in symptoms:
        for r in records:
            r["comm_time"] = 0.6 * r["step_time"]
    return records


def _advises_raising(f) -> bool:
    return re.search(r"\braise", f.fix) is not None


def _check_root_cause_first(findings) -> None:
    """The invariants every diagnosis holds (see causes.root_cause_first)."""
    blow_ups = sorted((f for f in findings if f.symptom in BLOW_UPS), key=lambda f: f.step)
    if not blow_ups:
        assert [f.symptom for f in findings] == sorted(
            (f.symptom for f in findings), key=SYMPTOMS.index
        )
        return
    root = blow_ups[0]
    first = findings[0]
    assert (
        first.step == root.step
        and first.symptom in BLOW_UPS
        or (first.symptom == "nan_inf" and first.after is None)
    )
    assert not [f for f in findings if _advises_raising(f)], (
        "a blow-up, and advice to raise the learning rate"
    )
    for f in findings:
        if f.symptom in DYNAMICS and f.step > root.step + 3 and f.symptom != "nan_inf":
            assert (
                f.after == root.step
                and f"at step {root.step}" in f.evidence
                and f"at step {root.step}" in f.cause
            )


@pytest.mark.parametrize("symptom", SYMPTOMS)
def test_each_synthetic_symptom_alone_is_named_alone(symptom: str) -> None:
    assert [f.symptom for f in diagnose(scenario(symptom))] == [symptom]


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_every_pair_of_symptoms_is_named_root_cause_first_with_advice_that_agrees(
    a: str, b: str
) -> None:
    findings = diagnose(scenario(a, b))
    assert {a, b} <= {f.symptom for f in findings}, [f.symptom for f in findings]
    _check_root_cause_first(findings)
    first = findings[0]
    if re.search(r"too (high|large)", first.cause):
        assert not _advises_raising(first)
    if re.search(r"too (small|low)", first.cause) and "not too small" not in first.cause:
        assert "lower the learning rate" not in first.fix


def test_the_pairs_cover_every_pair_that_is_not_exclusive_by_construction() -> None:
    assert len(PAIRS) + len(EXCLUSIVE) == len(SYMPTOMS) * (len(SYMPTOMS) - 1) // 2
    assert all(pair <= DYNAMICS for pair in EXCLUSIVE)


def test_every_advice_moves_the_learning_rate_as_it_says() -> None:
    tables = [
        ADVICE,
        EARLY,
        BESIDE_BLOW_UP,
        {s: advice(s, after="loss explosion at step 5") for s in AFTER_BLOW_UP},
    ]
    for table in tables:
        for symptom, (_cause, fix, _, lr) in table.items():
            assert (lr == "raise") == ("raise" in fix), (symptom, fix)
            assert lr != "lower" or "lower" in fix, (symptom, fix)
    assert {a.lr for a in AFTER_BLOW_UP.values()} | {a.lr for a in EARLY.values()} <= {
        "lower",
        None,
    }
    assert {a.lr for a in BESIDE_BLOW_UP.values()} == {None}
    assert {s for s, a in ADVICE.items() if a.lr == "raise"} == {"plateau", "slow_convergence"}


@pytest.mark.parametrize("later", sorted(DYNAMICS - {"nan_inf"}))
@pytest.mark.parametrize("root", sorted(BLOW_UPS))
def test_any_dynamics_symptom_after_any_blow_up_is_tied_to_it(root: str, later: str) -> None:
    findings = root_cause_first([finding(later, 40, "later"), finding(root, 5, "first")])
    assert (findings[0].symptom, findings[0].step) == (root, 5)
    tied = findings[1]
    assert tied.after == 5 and tied.evidence.endswith("later") and not _advises_raising(tied)


def test_a_plateau_before_a_blow_up_is_not_told_to_raise_the_learning_rate() -> None:
    plateau, explosion = root_cause_first(
        [finding("plateau", 100, "flat"), finding("loss_explosion", 200, "up")]
    )[::-1]
    assert explosion.symptom == "loss_explosion" and plateau.after is None
    assert not _advises_raising(plateau) and "loss explosion at step 200" in plateau.cause


def test_a_nan_from_an_overflow_is_tied_to_the_explosion_and_comes_after_it() -> None:
    records = [{"step": t, "loss": 2.3 * 0.99**t, "grad_norm": 0.5} for t in range(60)]
    for t in range(40, 60):
        records[t]["loss"] = 10.0 ** (t - 38) if t < 50 else math.inf
    findings = diagnose(records, classes=10)
    assert [f.symptom for f in findings][:2] == ["loss_explosion", "nan_inf"]
    assert findings[1].after == findings[0].step and "overflow" in findings[1].evidence


def test_a_nan_out_of_nowhere_comes_first_even_after_an_explosion() -> None:
    findings = diagnose(scenario("loss_explosion", "nan_inf"))
    assert [f.symptom for f in findings] == ["nan_inf", "loss_explosion"] and findings[
        0
    ].after is None
