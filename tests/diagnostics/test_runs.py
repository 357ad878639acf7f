"""The recorder of faulty runs: schema, validation, the command line."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from trainopt.diagnostics.records import load_records
from trainopt_site.diagnostics.runs import FAULTS, main, record_run, write_jsonl

KEYS = {
    "step",
    "loss",
    "grad_norm",
    "lr",
    "step_time",
    "tokens_per_s",
    "comm_time",
    "memory_allocated",
    "memory_reserved",
    "max_memory",
}


def test_a_short_healthy_run_logs_every_key_and_lowers_the_loss() -> None:
    records = record_run("healthy", steps=40)
    assert [r["step"] for r in records] == list(range(40))
    assert all(set(r) == KEYS for r in records)
    assert records[-1]["loss"] < records[0]["loss"]


def test_the_nan_fault_makes_the_loss_nan_from_its_step_on() -> None:
    records = record_run("nan_inf", steps=30)
    assert math.isfinite(records[19]["loss"]) and math.isnan(records[20]["loss"])


def test_an_unknown_fault_is_rejected_with_the_allowed_names() -> None:
    with pytest.raises(ValueError, match="healthy"):
        record_run("exploding")
    with pytest.raises(ValueError, match="steps"):
        record_run("healthy", steps=0)


def test_jsonl_round_trip_keeps_nan(tmp_path: Path) -> None:
    path = write_jsonl([{"step": 0, "loss": math.nan, "lr": 0.1}], tmp_path / "r.jsonl")
    (record,) = load_records(path)
    assert math.isnan(record["loss"]) and record["lr"] == 0.1


def test_main_writes_one_file_per_fault(tmp_path: Path) -> None:
    main(["--out", str(tmp_path), "--steps", "25", "--faults", "healthy", "plateau"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["healthy.jsonl", "plateau.jsonl"]
    assert len(load_records(tmp_path / "plateau.jsonl")) == 25


def test_the_command_line_runs_as_a_module(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainopt_site.diagnostics.runs",
            "--out",
            str(tmp_path),
            "--steps",
            "20",
            "--faults",
            "comm_overhead",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "comm_overhead.jsonl" in out.stdout
    assert set(FAULTS) >= {p.stem for p in tmp_path.iterdir()}


def test_the_troubleshooting_page_command_runs(tmp_path: Path) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "guides" / "troubleshooting.md"
    commands = [
        line[2:].split()
        for line in page.read_text().splitlines()
        if line.startswith("$ python -m trainopt_site.diagnostics.runs")
    ]  # the page's other command is test_logs'
    assert len(commands) == 1 and commands[0][:4] == [
        "python",
        "-m",
        "trainopt_site.diagnostics.runs",
        "--out",
    ]
    args = commands[0][3:]
    args[args.index("--out") + 1] = str(tmp_path)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainopt_site.diagnostics.runs",
            *args,
            "--steps",
            "15",
            "--faults",
            "healthy",
        ],
        check=True,
        capture_output=True,
    )
    assert len(load_records(tmp_path / "healthy.jsonl")) == 15
