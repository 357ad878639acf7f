"""Fault injection on a real training run (digits MLP): every fault is survived.

One module-scoped run of :func:`trainopt_site.stability.faults.run_fault_injection` (a clean run and
a faulty run with the same seed and data order) feeds every test here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainopt.models import digits_mlp
from trainopt_site.stability.faults import (
    DEFAULT_FAULTS,
    EXPECTED,
    fault_injection_table,
    run_fault_injection,
)

ROOT = Path(__file__).resolve().parents[2]
RESULT_FILE = ROOT / "docs" / "_data" / "stability_fault_injection.json"


@pytest.fixture(scope="module")
def result() -> dict:
    return run_fault_injection()


def test_every_injected_fault_is_survived(result: dict) -> None:
    assert [row["fault"] for row in result["rows"]] == sorted(
        DEFAULT_FAULTS, key=DEFAULT_FAULTS.get
    )
    failed = [row for row in result["rows"] if not row["survived"]]
    assert not failed, failed


def test_single_bad_steps_are_skipped_on_the_device(result: dict) -> None:
    for row in result["rows"]:
        if EXPECTED[row["fault"]] == "step skipped":
            assert row["observed"] == "step skipped", row


def test_no_nonfinite_value_reaches_weights_or_optimizer_state(result: dict) -> None:
    faulty = result["faulty"]
    assert faulty["finite"]
    assert all(seen["finite_after"] for seen in faulty["observed"].values())


def test_recovery_rolls_back_after_the_weights_diverge_and_only_then(result: dict) -> None:
    recoveries = result["faulty"]["recoveries"]
    fault_step = result["faulty"]["observed"]["diverged_weights"]["step"]
    check_every = result["config"]["check_every"]
    assert len(recoveries) == 1
    assert fault_step - check_every < recoveries[0]["restored_step"] <= fault_step
    assert recoveries[0]["lr_scale"] == 0.5


def test_clean_run_raises_no_false_alarm(result: dict) -> None:
    assert result["clean"]["skipped_steps"] == 0 and result["clean"]["recoveries"] == []


def test_final_loss_is_within_a_few_percent_of_the_clean_run(result: dict) -> None:
    assert abs(result["final_loss_gap"]) < 0.05, result["final_loss_gap"]
    assert abs(result["faulty"]["val_accuracy"] - result["clean"]["val_accuracy"]) < 0.02


def test_the_injected_faults_are_real_without_the_stabilizer() -> None:
    """The same NaN gradient, in a plain loop, poisons the weights: the test above can fail."""
    model = digits_mlp(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handle = model[0].weight.register_hook(lambda g: g * math.nan)
    F.cross_entropy(model(torch.randn(8, 64)), torch.randint(0, 10, (8,))).backward()
    handle.remove()
    opt.step()
    assert torch.isnan(model[0].weight).all()


def test_page_table_file_matches_a_fresh_run(result: dict) -> None:
    """docs/_data/stability_fault_injection.json (the page's table) is what the code does now."""
    recorded = json.loads(RESULT_FILE.read_text())
    keys = ("fault", "step", "expected", "observed", "survived")
    assert [{k: r[k] for k in keys} for r in recorded["rows"]] == [
        {k: r[k] for k in keys} for r in result["rows"]
    ]
    assert recorded["config"] == result["config"]


def test_page_table_says_whether_each_fault_was_survived() -> None:
    table = fault_injection_table(RESULT_FILE)
    assert table.count("| yes |") == len(DEFAULT_FAULTS)


def test_unknown_faults_are_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="bit_flip"):
        run_fault_injection(faults={"bit_flip": 3})
