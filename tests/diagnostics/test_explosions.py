"""Early steps are judged: explosions before any rolling history exists, against an absolute
scale."""

from __future__ import annotations

import math
import random

import pytest

from trainopt.diagnostics import diagnose


def _blown_up(at: int = 3, n: int = 300, dead: float = 2.8, seed: int = 0) -> list[dict]:
    """A cross-entropy over 10 classes that explodes at step ``at`` and then sits on ``dead``."""
    rng = random.Random(seed)
    climb = [4.0, 40.0, 1e4, 3e3, 60.0]
    records = []
    for t in range(n):
        loss = (
            2.3 - 0.1 * t
            if t < at
            else climb[t - at]
            if t - at < len(climb)
            else dead + rng.gauss(0, 0.02)
        )
        grad = 0.3 if t < at else 3e3 if t - at < len(climb) else 0.01
        records.append({"step": t, "loss": loss, "grad_norm": grad})
    return records


def test_an_explosion_in_the_first_steps_is_found_with_no_history() -> None:
    findings = diagnose(_blown_up(at=3), classes=10)
    first = findings[0]
    assert first.symptom in ("loss_explosion", "gradient_explosion") and first.step == 3
    assert "far too high" in first.cause and "log(10)" in " ".join(f.evidence for f in findings)


@pytest.mark.parametrize("at", [1, 2, 5, 9])
def test_the_explosion_is_found_at_any_early_step_without_the_number_of_classes(at: int) -> None:
    findings = diagnose(_blown_up(at=at))
    assert findings[0].step == at and findings[0].symptom in (
        "loss_explosion",
        "gradient_explosion",
    )


def test_the_dead_network_after_an_early_explosion_is_a_plateau_tied_to_it() -> None:
    findings = diagnose(_blown_up(at=5), classes=10)
    plateau = [f for f in findings if f.symptom == "plateau"]
    assert len(plateau) == 1 and plateau[0].after == 5
    assert plateau[0].evidence.startswith("collapsed after the") and "step 5" in plateau[0].evidence
    assert "raise" not in plateau[0].fix and "lower learning rate" in plateau[0].fix


def test_a_run_that_recovers_from_an_explosion_to_a_worse_level_is_not_healthy() -> None:
    # AdamW with a learning rate far too high: 100x at step 1, back, then stuck near 1.5.
    rng = random.Random(1)
    loss = [2.3, 230.0, 90.0, 20.0, 6.0] + [
        1.5 + 0.6 * math.exp(-t / 20) + rng.gauss(0, 0.03) for t in range(295)
    ]
    findings = diagnose([{"step": t, "loss": v} for t, v in enumerate(loss)], classes=10)
    assert [f.symptom for f in findings][0] == "loss_explosion" and len(findings) == 2
    assert findings[1].symptom in ("plateau", "slow_convergence") and findings[1].after == 1


def test_a_loss_stuck_well_above_its_early_minimum_is_diverging() -> None:
    rng = random.Random(2)
    loss = [
        2.3 * math.exp(-t / 15) + 0.3 if t < 60 else 0.3 + min(1.2, 0.015 * (t - 60))
        for t in range(300)
    ]
    findings = diagnose([{"loss": v + rng.gauss(0, 0.01)} for v in loss], classes=10)
    assert [f.symptom for f in findings] == ["diverging"]


def test_a_cross_entropy_far_above_log_classes_is_an_explosion_even_when_the_run_starts_there() -> (
    None
):
    # The log starts late, already blown up: only the absolute scale can tell.
    records = [{"step": t, "loss": 60.0 + 0.1 * math.sin(t)} for t in range(100)]
    assert diagnose(records) == [] or diagnose(records)[0].symptom != "loss_explosion"
    assert diagnose(records, classes=10)[0].symptom == "loss_explosion"


def test_an_initial_loss_gives_the_scale_of_any_other_loss() -> None:
    records = [{"step": t, "loss": 0.5 * 0.99**t} for t in range(200)]
    records[2]["loss"] = records[3]["loss"] = records[4]["loss"] = 5.0
    assert diagnose(records, initial_loss=0.5)[0].symptom == "loss_explosion"
    assert diagnose(records, initial_loss=50.0) == []


def test_an_early_gradient_explosion_is_judged_against_the_first_norms() -> None:
    records = [
        {"step": t, "loss": 2.3 * 0.99**t, "grad_norm": 0.4 if t != 2 else 40.0} for t in range(200)
    ]
    (found,) = diagnose(records, classes=10)
    assert (found.symptom, found.step) == (
        "gradient_explosion",
        2,
    ) and "far too high" in found.cause


def test_early_steps_sets_which_explosions_get_the_early_advice() -> None:
    records = _blown_up(at=8)
    assert "far too high" in diagnose(records, classes=10)[0].cause
    assert "far too high" not in diagnose(records, classes=10, early_steps=5)[0].cause


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"classes": 1}, "classes"),
        ({"classes": 2.5}, "classes"),
        ({"classes": True}, "classes"),
        ({"initial_loss": math.nan}, "initial_loss"),
    ],
)
def test_a_bad_expectation_is_rejected_with_its_value(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        diagnose([{"loss": 1.0}], **kwargs)


def test_one_hard_batch_late_in_a_converged_run_is_not_a_gradient_explosion() -> None:
    records = [
        {
            "step": t,
            "loss": 2.3 * math.exp(-t / 30) + 0.01,
            "grad_norm": 2.0 * math.exp(-t / 60) + 0.02,
        }
        for t in range(300)
    ]
    records[200]["grad_norm"] = (
        15 * records[199]["grad_norm"]
    )  # back to the norm of the early steps
    assert diagnose(records) == []
    records[200]["grad_norm"] = 100.0  # a corrupt batch
    assert diagnose(records)[0].symptom == "gradient_explosion"


def _growing(n: int = 300, start: int = 200, seed: int = 0) -> list[dict]:
    """A healthy run whose gradient norm grows 30 % a step from step ``start`` on."""
    rng = random.Random(seed)
    return [
        {
            "step": t,
            "loss": 2.3 * math.exp(-t / 40) + 0.05 + rng.gauss(0, 0.01),
            "grad_norm": (1.0 + 0.1 * rng.random()) * 1.3 ** max(0, t - start),
        }
        for t in range(n)
    ]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_gradient_norm_growing_30_percent_a_step_is_named_by_its_fifth_step(seed: int) -> None:
    records = _growing(seed=seed)
    named = next(t for t in range(200, 300) if diagnose(records[: t + 1]))
    assert named <= 205, named
    (found,) = diagnose(records[: named + 1])
    assert found.symptom == "gradient_explosion" and 199 <= found.step <= 201
    assert diagnose(records)[0].step == found.step  # the whole run says the same
    assert diagnose(records[:200]) == []


@pytest.mark.parametrize("times", [25, 50, 100])
def test_a_loss_that_stays_far_above_its_start_is_not_said_to_be_back(times: int) -> None:
    rng = random.Random(times)
    loss = [2.3 - 0.01 * t for t in range(50)] + [1e4] * 5
    loss += [2.3 * times * math.exp(rng.gauss(0, 1.0)) for _ in range(245)]
    findings = diagnose([{"step": t, "loss": v} for t, v in enumerate(loss)])
    assert [f.symptom for f in findings] == ["loss_explosion"]
    assert "is back under" not in findings[0].evidence
    assert "never came back under 4.6" in findings[0].evidence
