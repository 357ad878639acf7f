"""The benchmark command's plain summary (trainopt.perf.bench.summary): every kind of results
file, a line per measured configuration, only numbers the file holds, and no MyST markup (the
pages' tables are the workshop's, trainopt_site.perf.bench.report)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from trainopt.perf.bench.results import KINDS, read_results
from trainopt.perf.bench.summary import SUMMARIES, summary

DATA = Path(__file__).resolve().parents[3] / "docs" / "_data"
RECORDED = {
    read_results(p)["kind"]: p
    for p in sorted(DATA.glob("*.json"))
    if p.stem.startswith(("bench_", "perf_", "compile_", "memory_estimate_"))
}
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
FORMATS = ("{:.1f}", "{:,.0f}", "{:.2f}", "{:.3f}", "{:g}")


def allowed_numbers(results: Any) -> set[str]:
    """Every number token that the summary's formats can print for a value of the file."""
    allowed: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, str):
            allowed.update(NUMBER.findall(value))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            for scaled in (value, value * 1e3, value * 100, value / 2**20):
                for fmt in (*FORMATS, "{:+.1f}", "{:+.2f}"):
                    allowed.update(NUMBER.findall(fmt.format(scaled)))

    walk(results)
    return allowed


def test_every_kind_has_a_summary_and_a_recorded_file() -> None:
    assert set(SUMMARIES) == set(KINDS) == set(RECORDED)


@pytest.mark.parametrize("kind", sorted(RECORDED))
def test_the_summary_is_plain_text(kind: str) -> None:
    text = summary(RECORDED[kind])
    assert not re.search(r"[|`]|\*\*|^\*", text, flags=re.MULTILINE), text
    assert text.splitlines()[0].startswith(f"{kind} results on CPU (")


@pytest.mark.parametrize("kind", sorted(RECORDED))
def test_the_summary_shows_only_numbers_from_its_file(kind: str) -> None:
    results = read_results(RECORDED[kind])
    stray = set(NUMBER.findall(summary(results))) - allowed_numbers(results)
    assert not stray, f"{kind}: numbers not in the file: {stray}"


def test_the_number_check_catches_a_number_not_in_the_file() -> None:
    results = read_results(RECORDED["bench"])
    text = summary(results) + "speed-up 123456.7x\n"
    assert set(NUMBER.findall(text)) - allowed_numbers(results) == {"123456.7"}


def test_each_configuration_gets_its_own_measured_numbers() -> None:
    results = copy.deepcopy(read_results(RECORDED["bench"]))
    ok = [r for r in results["results"] if r["status"] == "ok"]
    assert len(ok) >= 2
    for i, r in enumerate(ok):  # different, known numbers per configuration
        r["step_time_s"]["median"] = 0.0101 * (i + 1)
        r["tokens_per_s"] = 1000.0 * (i + 3)
    lines = summary(results).splitlines()
    for i, r in enumerate(ok):
        (line,) = [line for line in lines if line.startswith(f"  {r['name']}  ")]
        assert f"{10.1 * (i + 1):.1f} ms" in line and f"{1000 * (i + 3):,.0f}" in line, line


def test_a_failed_configuration_says_so_with_its_error() -> None:
    results = copy.deepcopy(read_results(RECORDED["bench"]))
    results["results"][0].update(status="failed", error="CUDA out of\n memory")
    (line,) = [
        line
        for line in summary(results).splitlines()
        if line.startswith(f"  {results['results'][0]['name']}  ")
    ]
    assert line.endswith("failed: CUDA out of memory")


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    assert (
        summary(tmp_path / "bench_h100.json") == f"no results in {tmp_path / 'bench_h100.json'}\n"
    )


def test_the_stability_summary_shows_each_forms_ratio_and_the_files_goal() -> None:
    results = copy.deepcopy(read_results(RECORDED["stability"]))
    ok = [f for f in results["forms"] if f["status"] == "ok"]
    for i, f in enumerate(ok):
        f["ratio"].update(ratio=1.25 + i / 100, low=1.2, high=1.3 + i / 100)
    results["goal_ratio"] = 1.125
    lines = summary(results).splitlines()
    for i, f in enumerate(ok):
        (line,) = [line for line in lines if line.startswith(f"  {f['form']}  ")]
        assert f"{1.25 + i / 100:.3f} [1.200-{1.3 + i / 100:.3f}]" in line, line
    assert lines[-1] == "goal: a ratio of at most 1.125"
