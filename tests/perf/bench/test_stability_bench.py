"""Tests of trainopt.perf.bench.stability (CPU, tiny GPT) and of the page's shell commands."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path

import pytest

from trainopt.perf.bench.stability import main, run, stability_bench_table

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "guides" / "training-optimization" / "training-stability.md"


@pytest.fixture(scope="module")
def result() -> dict:
    return run(size="tiny", device="cpu", batch_size=2, seq_len=16, steps_per_window=2, windows=3,
               warmup_steps=1)


def test_run_times_all_three_variants_in_one_run(result: dict) -> None:
    assert set(result["ms_per_step"]) == {"bare", "stabilizer", "seed_style"}
    assert all(len(times) == 3 and min(times) > 0 for times in result["ms_per_step_all_windows"].values())
    assert result["ratios"]["stabilizer/bare"] == pytest.approx(
        result["ms_per_step"]["stabilizer"] / result["ms_per_step"]["bare"])


def test_run_checks_fifty_stabilizer_steps_for_host_syncs(result: dict) -> None:
    sync = result["sync_check"]
    assert sync["steps"] == 50 and sync["passed"] and sync["syncs"] == 0


def test_run_records_hardware_software_and_date(result: dict) -> None:
    assert result["hardware"]["device"] == "cpu" and result["software"]["torch"]
    assert len(result["date"]) == 10 and result["config"]["model"] == "GPT tiny"


def test_cli_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    code = main(["--out", str(out), "--size", "tiny", "--device", "cpu", "--windows", "1",
                 "--steps-per-window", "1", "--batch-size", "2", "--seq-len", "8"])
    assert code == 0 and json.loads(out.read_text())["benchmark"] == "stability"


def test_table_says_not_yet_measured_without_a_gpu_result(tmp_path: Path, result: dict) -> None:
    assert stability_bench_table(tmp_path / "missing.json").startswith("*Not yet measured on a GPU.*")
    cpu_file = tmp_path / "cpu.json"
    cpu_file.write_text(json.dumps(result))
    assert "Not yet measured on a GPU" in stability_bench_table(cpu_file)


def test_table_shows_ratios_and_hardware_of_a_gpu_result(tmp_path: Path, result: dict) -> None:
    gpu = json.loads(json.dumps(result))
    gpu["hardware"] = {"device": "cuda", "name": "NVIDIA H100 80GB HBM3"}
    gpu["ms_per_step"] = {"bare": 100.0, "stabilizer": 101.0, "seed_style": 141.0}
    gpu["ratios"] = {"stabilizer/bare": 1.01, "seed_style/bare": 1.41}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(gpu))
    table = stability_bench_table(path)
    assert "| (b) TrainingStabilizer | 101.00 | 1.010 |" in table and "NVIDIA H100" in table


def _page_commands() -> list[list[str]]:
    lines = PAGE.read_text().splitlines()
    return [shlex.split(line[2:]) for line in lines if line.startswith("$ python -m trainopt.")]


def test_every_command_on_the_page_parses() -> None:
    commands = _page_commands()
    assert len(commands) == 2
    for argv in commands:
        module = importlib.import_module(argv[2])
        args = module.build_parser().parse_args(argv[3:])
        assert str(args.out).startswith("docs/_data/")
