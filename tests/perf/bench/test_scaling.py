"""Scaling efficiency of gloo processes on a CPU: 1 process against N, interleaved."""

from __future__ import annotations

import statistics

import pytest

from trainopt.perf.bench.scaling import run
from trainopt_site.perf.bench.report import render


@pytest.fixture(scope="module")
def results() -> dict:
    return run(2, "tiny", batch_size=2, seq_len=16, steps=2, windows=4, max_warmup_windows=3)


def test_efficiency_is_the_one_process_median_over_the_two_process_median(results: dict) -> None:
    one, two = (results["window_step_times_s"][k] for k in ("1", "2"))
    assert len(one) == len(two) == 4 and all(t > 0 for t in one + two)
    by_hand = (2 * 2 * 16 / statistics.median(two)) / (2 * (2 * 16 / statistics.median(one)))
    assert results["efficiency"]["ratio"] == pytest.approx(by_hand, rel=1e-12)
    assert (
        results["efficiency"]["low"]
        <= results["efficiency"]["ratio"]
        <= results["efficiency"]["high"]
    )


def test_throughput_counts_the_tokens_of_every_process(results: dict) -> None:
    for k in ("1", "2"):
        median = statistics.median(results["window_step_times_s"][k])
        assert results["tokens_per_s"][k] == pytest.approx(int(k) * 2 * 16 / median, rel=1e-12)


def test_results_say_the_processes_stand_in_for_gpus(results: dict) -> None:
    assert results["kind"] == "scaling" and results["meta"]["device"] == "cpu"
    assert "stand-ins for GPUs" in results["meta"]["note"]
    assert 1 <= results["warmup"]["windows"] <= 3
    text = render(results)
    assert "Scaling efficiency with 2 processes" in text and "stand-ins for GPUs" in text


@pytest.mark.parametrize("kwargs", [{"processes": 1}, {"windows": 1}, {"batch_size": 0}])
def test_bad_arguments_raise_before_any_process_starts(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must be an int >="):
        run(**kwargs)
