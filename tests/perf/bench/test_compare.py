"""The comparison of two sets of step times: the ratio of medians and its bootstrap interval."""

from __future__ import annotations

import contextlib
import io
import itertools
import statistics
from pathlib import Path

import numpy as np
import pytest

from trainopt.perf.bench.cli import main
from trainopt.perf.bench.compare import compare_results, ratio_of_medians, verdict
from trainopt.perf.bench.results import new_results, write_results


def exact_bootstrap_quantile(a: list[float], b: list[float], level: float) -> float:
    """The ``level`` quantile of median(a*)/median(b*) over every resample, enumerated (no
    sampling)."""
    medians_a = [statistics.median(r) for r in itertools.product(a, repeat=len(a))]
    medians_b = [statistics.median(r) for r in itertools.product(b, repeat=len(b))]
    ratios = sorted(x / y for x in medians_a for y in medians_b)  # every pair equally likely
    return ratios[min(len(ratios) - 1, int(level * len(ratios)))]


@pytest.mark.parametrize(
    "a, b", [([3.0, 4.0, 6.0], [1.0, 2.5, 2.0]), ([10.0, 11.0, 9.5, 12.0], [10.5, 9.0, 11.5, 10.0])]
)
def test_interval_matches_the_enumerated_bootstrap_distribution(
    a: list[float], b: list[float]
) -> None:
    ci = ratio_of_medians(a, b, confidence=0.9, resamples=40_000)
    assert ci["ratio"] == statistics.median(a) / statistics.median(b)
    # the Monte Carlo quantiles fall between the exact quantiles one and a half points either side
    assert exact_bootstrap_quantile(a, b, 0.035) <= ci["low"] + 1e-12
    assert ci["low"] <= exact_bootstrap_quantile(a, b, 0.065) + 1e-12
    assert exact_bootstrap_quantile(a, b, 0.935) <= ci["high"] + 1e-12
    assert ci["high"] <= exact_bootstrap_quantile(a, b, 0.965) + 1e-12


def test_constant_times_give_a_zero_width_interval_at_the_hand_ratio() -> None:
    ci = ratio_of_medians([0.03] * 5, [0.01] * 7)
    assert (
        ci["low"] == pytest.approx(3.0)
        and ci["high"] == pytest.approx(3.0)
        and ci["ratio"] == pytest.approx(3.0)
    )


def test_interval_covers_the_true_ratio_about_as_often_as_it_claims() -> None:
    rng = np.random.default_rng(1)
    covered = 0
    for trial in range(200):
        a = 2.0 * rng.lognormal(0.0, 0.1, 15)  # true median ratio: 2
        b = rng.lognormal(0.0, 0.1, 15)
        ci = ratio_of_medians(a, b, confidence=0.9, resamples=1000, seed=trial)
        covered += ci["low"] <= 2.0 <= ci["high"]
    assert 0.8 <= covered / 200 <= 0.98


def test_the_same_data_give_the_same_interval() -> None:
    assert ratio_of_medians([1.0, 2.0, 3.0], [1.5, 1.0, 2.0]) == ratio_of_medians(
        [1.0, 2.0, 3.0], [1.5, 1.0, 2.0]
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"confidence": 1.0}, "confidence"),
        ({"resamples": 0}, "resamples"),
        ({"candidate": []}, "non-empty"),
    ],
)
def test_bad_arguments_raise(kwargs: dict, message: str) -> None:
    args = {"baseline": [1.0], "candidate": [1.0], **kwargs}
    with pytest.raises(ValueError, match=message):
        ratio_of_medians(**args)


def test_verdict_reads_the_interval_against_one() -> None:
    assert [
        verdict({"low": lo, "high": hi}) for lo, hi in [(1.01, 2), (0.5, 0.99), (0.9, 1.1)]
    ] == ["faster", "slower", "no clear difference"]


def bench_file(path: Path, times: dict[str, list[float]]) -> Path:
    results = new_results("bench", "cpu")
    results["results"] = [
        {"name": n, "status": "ok", "window_step_times_s": t} for n, t in times.items()
    ]
    results["results"].append({"name": "fp16", "status": "unsupported"})
    write_results(results, path)
    return path


def test_compare_command_prints_the_speed_up_of_each_shared_configuration(tmp_path: Path) -> None:
    a = bench_file(tmp_path / "a.json", {"fp32": [0.040, 0.042, 0.041], "only-a": [1.0]})
    b = bench_file(tmp_path / "b.json", {"fp32": [0.020, 0.021, 0.0205], "only-b": [1.0]})
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["compare", str(a), str(b)]) == 0
    rows = [line for line in out.getvalue().splitlines() if line.startswith("| fp32 |")]
    # by hand: 41 / 20.5 = 2; a resample's median is the largest A time (42) with probability 7/27,
    # and B's is its smallest (20) with 7/27, so 42/20 = 2.10 has probability 0.067 > 2.5%: the
    # 95% interval ends there, and likewise starts at 40/21 = 1.90
    assert rows == ["| fp32 | 41.00 | 20.50 | 2.00× | 1.90–2.10 | faster |"]
    assert "only-a" not in out.getvalue() and "only-b" not in out.getvalue()


def test_compare_results_skips_what_did_not_run() -> None:
    ok = {"results": [{"name": "x", "status": "ok", "window_step_times_s": [1.0]}]}
    failed = {"results": [{"name": "x", "status": "oom"}]}
    assert compare_results(ok, failed) == []
