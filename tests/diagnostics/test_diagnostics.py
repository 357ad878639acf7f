"""diagnose() names the injected fault of each recorded run, and raises no false alarm."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.data import path
from trainopt.diagnostics.advice import ADVICE, AFTER_BLOW_UP, BESIDE_BLOW_UP, EARLY
from trainopt.diagnostics.records import load_records
from trainopt.diagnostics.symptoms import DEFAULTS, SYMPTOMS, Finding, diagnose
from trainopt_site.diagnostics.runs import FAULTS

ROOT = Path(__file__).resolve().parents[2]
RUNS = path("runs")

# Symptoms a faulty run may show besides its own: a learning rate far too high both spikes the
# gradient norm and raises the loss; a leak that fills memory also slows the steps down.
ALSO_ALLOWED = {
    "diverging": {"gradient_explosion", "loss_explosion"},
    "oscillating": {"gradient_explosion", "loss_explosion"},
    "loss_explosion": {"gradient_explosion", "diverging"},
    "out_of_memory": {"slow_training"},
}


def _healthy(n: int = 300, offset: float = 0.0, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "step": t,
            "loss": offset + 2.3 * math.exp(-t / 40) + 0.05 + rng.gauss(0, 0.01),
            "grad_norm": 5.0 * math.exp(-t / 60) + 0.05 * rng.random(),
            "step_time": 0.1 + 0.005 * rng.random(),
        }
        for t in range(n)
    ]


def test_every_fault_has_a_recorded_run() -> None:
    assert sorted(p.stem for p in RUNS.glob("*.jsonl")) == sorted(FAULTS)


def test_healthy_recorded_run_has_no_findings() -> None:
    assert diagnose(RUNS / "healthy.jsonl") == []


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "healthy"])
def test_diagnose_names_the_injected_fault_of_each_recorded_run(fault: str) -> None:
    symptoms = [f.symptom for f in diagnose(RUNS / f"{fault}.jsonl")]
    assert fault in symptoms
    assert set(symptoms) <= {fault} | ALSO_ALLOWED.get(fault, set()), symptoms


def test_no_false_alarm_on_negative_losses() -> None:
    assert diagnose(_healthy(offset=-10.0)) == []


def test_no_false_alarm_when_grad_norm_falls_a_hundredfold() -> None:
    records = _healthy()
    assert records[0]["grad_norm"] / records[-1]["grad_norm"] > 50
    assert diagnose(records) == []


def test_one_noisy_step_is_not_a_loss_explosion() -> None:
    records = _healthy()
    records[200]["loss"] *= 20
    assert "loss_explosion" not in [f.symptom for f in diagnose(records)]


def test_a_sustained_jump_is_a_loss_explosion_at_its_step() -> None:
    records = _healthy()
    for r in records[200:]:
        r["loss"] += 5.0 * math.exp(-(r["step"] - 200) / 80)
    found = {f.symptom: f for f in diagnose(records)}
    assert found["loss_explosion"].step == 200


def test_a_gradient_spike_is_flagged_at_its_step() -> None:
    records = _healthy()
    records[150]["grad_norm"] = 100.0
    (finding,) = diagnose(records)
    assert (finding.symptom, finding.step) == ("gradient_explosion", 150)


def test_nan_is_reported_at_the_first_bad_step_and_checks_use_the_steps_before() -> None:
    records = _healthy()
    for r in records[180:]:
        r["loss"] = math.nan
    findings = diagnose(records)
    assert [(f.symptom, f.step) for f in findings] == [("nan_inf", 180)]


def test_infinite_grad_norm_counts_as_nan_inf() -> None:
    records = _healthy()
    records[90]["grad_norm"] = math.inf
    assert diagnose(records)[0].step == 90


def test_a_rising_loss_is_diverging() -> None:
    records = _healthy()
    for r in records[150:]:
        r["loss"] += 0.02 * (r["step"] - 150)
    assert [f.symptom for f in diagnose(records)] == ["diverging"]


def test_a_flat_loss_is_a_plateau_and_a_slow_fall_is_slow_convergence() -> None:
    rng = random.Random(0)
    flat = [{"loss": 2.3 + rng.gauss(0, 0.01)} for _ in range(300)]
    slow = [{"loss": 2.3 - 0.002 * t + rng.gauss(0, 0.01)} for t in range(300)]
    assert [f.symptom for f in diagnose(flat)] == ["plateau"]
    assert [f.symptom for f in diagnose(slow)] == ["slow_convergence"]


def test_a_step_time_regression_is_slow_training_and_memory_near_the_limit_is_flagged() -> None:
    records = _healthy()
    for r in records:
        r["step_time"] *= 3 if r["step"] >= 200 else 1
        r.update(memory_reserved=(50 + r["step"] * 0.15) * 2**30 / 100, max_memory=2**30)
    found = {f.symptom: f for f in diagnose(records)}
    assert set(found) == {"slow_training", "out_of_memory"}
    assert abs(found["slow_training"].step - 200) <= 2
    assert "leak" in found["out_of_memory"].evidence


def test_missing_keys_turn_off_their_checks_only() -> None:
    records = [{"loss": r["loss"]} for r in _healthy()]
    assert diagnose(records) == []
    assert diagnose([{"step_time": 0.1} for _ in range(50)]) == []
    assert diagnose([]) == []


def test_null_and_string_values_are_read_as_nan(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    lines = [json.dumps({"step": t, "loss": 2.0 * 0.9**t}) for t in range(40)] + [
        '{"step": 40, "loss": null}'
    ]
    path.write_text("\n".join(lines) + "\n")
    assert [(f.symptom, f.step) for f in diagnose(path)] == [("nan_inf", 40)]
    path.write_text('{"step": 0, "loss": "nan"}\n')
    assert diagnose(path)[0].symptom == "nan_inf"


def test_a_line_that_is_not_json_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"loss": 1.0}\nloss=2\n')
    with pytest.raises(ValueError, match=r"run.jsonl:2"):
        load_records(path)


def test_unknown_threshold_is_rejected_with_the_allowed_names() -> None:
    with pytest.raises(ValueError, match="spike_sigmas"):
        diagnose(_healthy(), spike_sigma=3.0)


def test_thresholds_can_be_tightened() -> None:
    records = _healthy()
    for r in records:
        r["grad_norm"] = 0.5 + 0.01 * math.sin(r["step"])
    records[150]["grad_norm"] *= 4
    assert diagnose(records) == []
    assert diagnose(records, grad_spike_ratio=3.0)[0].symptom == "gradient_explosion"


ALL_ADVICE = [
    (f"{name}[{symptom}]", entry)
    for name, table in (
        ("ADVICE", ADVICE),
        ("EARLY", EARLY),
        ("AFTER_BLOW_UP", AFTER_BLOW_UP),
        ("BESIDE_BLOW_UP", BESIDE_BLOW_UP),
    )
    for symptom, entry in table.items()
]


@pytest.mark.parametrize(("where", "entry"), ALL_ADVICE, ids=[where for where, _ in ALL_ADVICE])
def test_every_fix_names_a_call_and_links_a_section_of_the_troubleshooting_page(
    where: str, entry
) -> None:
    cause, fix, see, _ = entry
    assert cause and re.search(r"(trainopt\.\w+|torch\.\w+)", fix)
    page, anchor = see.split("#")
    text = (ROOT / "docs" / page).read_text()
    headings = {
        re.sub(r"[^a-z0-9]+", "-", h.lower()).strip("-")
        for h in re.findall(r"^#+ (.+)$", text, flags=re.M)
    }
    assert anchor in headings, (anchor, sorted(headings))


def test_finding_prints_symptom_step_cause_and_fix() -> None:
    text = str(Finding("plateau", 3, "flat", "lr tiny", "raise it", "x.md#plateau"))
    assert (
        text.startswith("plateau (from step 3): flat")
        and "cause: lr tiny" in text
        and "fix: raise it" in text
    )


def test_defaults_cover_every_documented_threshold() -> None:
    doc = diagnose.__doc__
    assert all(f"``{name}``" in doc for name in DEFAULTS)


@settings(max_examples=25, deadline=None)
@given(
    offset=st.floats(-50, 50),
    height=st.floats(0.5, 20),
    tau=st.floats(10, 60),
    noise=st.floats(0.0, 0.02),
    seed=st.integers(0, 10_000),
)
def test_no_false_alarm_on_any_decaying_loss(
    offset: float, height: float, tau: float, noise: float, seed: int
) -> None:
    rng = random.Random(seed)
    records = [
        {
            "step": t,
            "loss": offset + height * (math.exp(-t / tau) + noise * rng.gauss(0, 1)),
            "grad_norm": height * math.exp(-t / tau) + 0.01,
        }
        for t in range(300)
    ]
    assert diagnose(records) == []


def test_every_symptom_has_advice() -> None:
    assert set(ADVICE) == set(SYMPTOMS)


def test_every_trainopt_object_a_fix_names_exists() -> None:
    import importlib

    for _, (_cause, fix, _, _) in ALL_ADVICE:
        for dotted in re.findall(r"trainopt(?:\.\w+)+", fix):
            try:
                importlib.import_module(dotted)
            except ImportError:
                module, _, name = dotted.rpartition(".")
                assert hasattr(importlib.import_module(module), name), dotted


@pytest.mark.parametrize("tau", [300, 1000])
def test_one_nan_step_in_a_run_that_goes_on_is_its_only_finding(tau: float) -> None:
    # 120 steps of this run alone read as slow convergence; the whole run is healthy
    rng = random.Random(0)
    records = [
        {"step": t, "loss": 2.3 * math.exp(-t / tau) + 0.3 + rng.gauss(0, 0.02)}
        for t in range(1000)
    ]
    records[120]["loss"] = math.nan
    assert [(f.symptom, f.step) for f in diagnose(records)] == [("nan_inf", 120)]
