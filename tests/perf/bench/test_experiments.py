"""Tests of trainopt.perf.bench.experiments (the GPU measurements) and trainopt.perf.bench.tables (tables)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainopt.perf.bench import tables as report
from trainopt.perf.bench.experiments import _relative, main, run

ROOT = Path(__file__).resolve().parents[3]
TINY = ["--size", "tiny", "--device", "cpu", "--batch-size", "2", "--seq-len", "16", "--steps", "2", "--warmup", "1"]
RENDERERS = [report.render_environment, report.render_precision_table, report.render_checkpointing_table,
             report.render_estimate_table, report.render_phase_table, report.render_top_operators,
             report.render_throughput_table]


@pytest.fixture(scope="module")
def cpu_results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("perf") / "perf_cpu.json"
    main(["--out", str(out), *TINY])
    return out


def test_cli_writes_every_section_with_environment(cpu_results):
    data = json.loads(cpu_results.read_text())
    assert set(data) >= {"environment", "model", "settings", "precision", "checkpointing", "phases",
                         "top_operators", "command"}
    assert data["environment"]["torch"] == torch.__version__ and data["environment"]["date"]
    assert data["command"].startswith("python -m trainopt.perf.bench.experiments --out ")
    assert data["model"]["tokens_per_step"] == 2 * 16


def test_unsupported_precisions_are_recorded_with_the_reason(cpu_results):
    rows = {r["precision"]: r for r in json.loads(cpu_results.read_text())["precision"]}
    assert rows["fp32"]["supported"] and rows["bf16"]["supported"]
    assert not rows["fp16"]["supported"] and "needs a CUDA GPU" in rows["fp16"]["reason"]
    assert rows["bf16"]["step_time_median_ms"] > 0 and rows["bf16"]["loss"] > 0


def test_checkpointing_rows_cover_every_policy_against_the_same_baseline(cpu_results):
    section = json.loads(cpu_results.read_text())["checkpointing"]
    assert [r["policy"] for r in section["rows"]] == ["none", "every block", "every 2nd block", "selective"]
    assert [r["checkpointed_layers"] for r in section["rows"]] == [0, 2, 1, 2]
    assert section["rows"][0]["time_change"] == 0.0
    estimates = [r["estimate_bytes"] for r in section["rows"][:3]]
    assert estimates[0] > estimates[2] > estimates[1]  # more checkpointing, lower estimate


def test_cpu_run_records_no_memory_numbers(cpu_results):
    data = json.loads(cpu_results.read_text())
    assert all(r["peak_memory_bytes"] is None for r in data["precision"] if r["supported"])
    assert data["phases"]["rows"] == []


def test_relative_change_and_goal():
    base = {"policy": "none", "checkpointed_layers": 0, "step_time_median_ms": 100.0,
            "peak_memory_bytes": 1000, "estimate_bytes": None}
    good = base | {"policy": "every block", "step_time_median_ms": 118.0, "peak_memory_bytes": 650}
    slow = good | {"step_time_median_ms": 125.0}
    assert _relative(good, base)["memory_change"] == pytest.approx(-0.35)
    assert _relative(good, base)["meets_goal"] is True
    assert _relative(slow, base)["meets_goal"] is False


def test_cli_rejects_zero_steps(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x.json"), "--steps", "0"])
    assert "--steps and --warmup must be >= 1" in capsys.readouterr().err


def test_module_runs_as_a_command(tmp_path):
    out = tmp_path / "perf.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    quick = ["--size", "tiny", "--device", "cpu", "--batch-size", "1", "--seq-len", "8", "--steps", "1", "--warmup", "1"]
    result = subprocess.run([sys.executable, "-m", "trainopt.perf.bench.experiments", "--out", str(out), *quick],
                            capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(out.read_text())["model"]["size"] == "tiny"


@pytest.mark.parametrize("render", RENDERERS, ids=lambda f: f.__name__)
def test_tables_say_not_yet_measured_while_the_file_is_missing(render, tmp_path):
    text = render(tmp_path / "perf_h100.json")
    assert text.startswith("*Not yet measured on a GPU") and "|" not in text  # a note, no table


@pytest.mark.parametrize("render", RENDERERS, ids=lambda f: f.__name__)
def test_tables_from_a_cpu_run_are_labelled_as_cpu(render, cpu_results):
    assert render(cpu_results).startswith("*These numbers come from a CPU run")


def test_precision_table_shows_measured_values_from_the_file(cpu_results):
    data = json.loads(cpu_results.read_text())
    fp32 = next(r for r in data["precision"] if r["precision"] == "fp32")
    table = report.render_precision_table(cpu_results)
    assert f"| fp32 | {fp32['step_time_median_ms']:.1f} |" in table
    assert "| fp16 | not supported here |" in table


def test_estimate_rows_compute_the_error_against_measured_peaks(cpu_results):
    data = json.loads(cpu_results.read_text())
    for row in data["precision"]:
        if row["supported"]:
            row["peak_memory_bytes"] = row["estimate_bytes"] // 2
    rows = report.estimate_rows(data)
    assert rows[0]["error"] == pytest.approx(1.0, rel=1e-3)


def test_committed_gpu_results_if_present_come_from_cuda():
    path = ROOT / "docs" / "_data" / "perf_h100.json"
    if not path.exists():
        pytest.skip("docs/_data/perf_h100.json has not been produced yet")
    data = json.loads(path.read_text())
    assert data["environment"]["device_type"] == "cuda" and data["environment"]["cuda"]
    failed = [r for r in data["precision"] + data["checkpointing"]["rows"] if "error" in r]
    assert not failed, f"configurations that failed on the GPU: {failed}"
    assert all(r["peak_memory_bytes"] for r in data["precision"] if r["supported"])


def test_a_failing_configuration_is_recorded_and_the_rest_still_run(monkeypatch):
    from trainopt.perf.bench import experiments

    real = experiments.measure

    def flaky(**kwargs):
        if kwargs.get("policy") == "every 2nd block":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(**kwargs)

    monkeypatch.setattr(experiments, "measure", flaky)
    results = run("tiny", batch_size=1, seq_len=8, steps=1, warmup=1)  # device: cuda if available
    assert results["environment"]["device_type"] == ("cuda" if torch.cuda.is_available() else "cpu")
    rows = {r["policy"]: r for r in results["checkpointing"]["rows"]}
    assert rows["every 2nd block"]["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert "error" not in rows["every block"] and "error" not in rows["selective"]
    assert "| every 2nd block | failed: OutOfMemoryError" in report.render_checkpointing_table_from(results)


PAGES = ["mixed-precision", "memory-optimization", "profiling", "monitoring"]


def _console_commands() -> list[tuple[str, str]]:
    commands = []
    for page in PAGES:
        in_console = False
        for line in (ROOT / "docs" / "advanced" / "performance" / f"{page}.md").read_text().splitlines():
            if line.startswith("```"):
                in_console = line.strip() == "```console"
                continue
            if in_console and line.startswith("$ "):
                commands.append((page, line[2:]))
    return commands


def test_pages_show_console_commands():
    assert {page for page, _ in _console_commands()} >= {"mixed-precision", "memory-optimization"}


@pytest.mark.parametrize("page, command", _console_commands())
def test_every_console_command_on_the_pages_parses(page, command):
    import shlex

    from trainopt.perf.bench.experiments import build_parser
    from trainopt.perf.memory import allocator_settings

    words = shlex.split(command)
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        assert name == "PYTORCH_CUDA_ALLOC_CONF" and allocator_settings(value)
    assert words[:3] == ["python", "-m", "trainopt.perf.bench.experiments"], command
    args = build_parser().parse_args(words[3:])
    assert args.out.suffix == ".json" and args.size in ("124m", "350m")


def _with_checkpointing(cpu_results: Path, changes: dict[str, tuple[float, float]]) -> Path:
    data = json.loads(cpu_results.read_text())
    for row in data["checkpointing"]["rows"]:
        if row["policy"] in changes:
            row["memory_change"], row["time_change"] = changes[row["policy"]]
            row["meets_goal"] = row["memory_change"] <= -0.30 and row["time_change"] <= 0.20
    out = cpu_results.with_name(f"ckpt_{len(changes)}_{sum(m for m, _ in changes.values()):.2f}.json")
    out.write_text(json.dumps(data))
    return out


def test_recommendation_picks_the_cheapest_policy_meeting_the_goal(cpu_results):
    path = _with_checkpointing(cpu_results, {"every block": (-0.40, 0.18), "every 2nd block": (-0.31, 0.09),
                                             "selective": (-0.10, 0.02)})
    text = report.render_checkpointing_recommendation(path)
    assert text.startswith("*These numbers come from a CPU run")
    assert "Recommended on this setup: **every 2nd block** (-31% peak memory, +9% step time)" in text


def test_recommendation_says_when_no_policy_meets_the_goal(cpu_results):
    path = _with_checkpointing(cpu_results, {"every block": (-0.29, 0.22), "every 2nd block": (-0.15, 0.11),
                                             "selective": (-0.05, 0.03)})
    text = report.render_checkpointing_recommendation(path)
    assert "No policy met the goal" in text and "largest saving came from **every block**" in text
    assert "cheapest policy was **selective**" in text


def test_recommendation_without_measured_memory_makes_none(cpu_results, tmp_path):
    assert "no recommendation" in report.render_checkpointing_recommendation(cpu_results)
    assert report.render_checkpointing_recommendation(tmp_path / "missing.json").startswith("*Not yet measured")
