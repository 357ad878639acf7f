"""What the stability stack costs per step (trainopt.perf.bench.stability), on a CPU with the tiny GPT."""

from __future__ import annotations

import copy
import statistics
from typing import Any

import pytest

from trainopt.perf.bench.report import render
from trainopt.perf.bench.stability import run


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    return run(size="tiny", device="cpu", batch_size=2, seq_len=16, steps_per_window=2, windows=3,
               warmup_steps=1, max_warmup_steps=6)


def test_run_times_all_three_variants_in_one_run(result: dict[str, Any]) -> None:
    assert set(result["window_ms"]) == {"bare", "stabilizer", "seed_style"}
    assert all(len(times) == 3 and min(times) > 0 for times in result["window_ms"].values())
    assert all(w["steps"] >= 1 + 2 * 2 for w in result["warmup"].values())


def test_ratios_by_hand_from_the_window_times(result: dict[str, Any]) -> None:
    bare = statistics.median(result["window_ms"]["bare"])
    for variant in ("stabilizer", "seed_style"):
        by_hand = statistics.median(result["window_ms"][variant]) / bare  # an inverted ratio would fail here
        assert result["ratios"][f"{variant}/bare"] == pytest.approx(by_hand, rel=1e-12)


def test_run_counts_the_host_syncs_of_fifty_stabilizer_steps(result: dict[str, Any]) -> None:
    sync = result["sync_check"]
    assert sync["steps"] == 50 and sync["syncs"] == 0 and sync["passed"] and sync["error"] is None


def test_run_records_hardware_software_and_date(result: dict[str, Any]) -> None:
    meta = result["meta"]
    assert result["kind"] == "stability" and meta["device"] == "cpu" and meta["torch"]
    assert result["config"]["model"] == "GPT tiny" and result["goal_ratio"] == 1.02


def test_table_shows_the_ratio_and_its_verdict(result: dict[str, Any]) -> None:
    changed = copy.deepcopy(result)
    changed["ms_per_step"] = {"bare": 100.0, "stabilizer": 101.0, "seed_style": 141.0}
    changed["ratios"] = {"stabilizer/bare": 1.01, "seed_style/bare": 1.41}
    table = render(changed)
    assert "| (b) TrainingStabilizer | 101.00 |" in table and "| 1.010 |" in table
    assert "(b)/(a) = 1.010 **meets** the goal of at most 1.020" in table
    changed["ratios"]["stabilizer/bare"] = 1.05
    assert "**misses**" in render(changed)


def test_bad_arguments_raise_before_running() -> None:
    with pytest.raises(ValueError, match="dtype must be"):
        run(size="tiny", device="cpu", dtype="fp16")
    with pytest.raises(ValueError, match="windows must be a positive int"):
        run(size="tiny", device="cpu", windows=0)
