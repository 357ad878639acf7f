"""The benchmark harness (trainopt.perf.bench), its report (bench_report) and its command line."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure

from trainopt.models import GPT, gpt_config
from trainopt.perf.bench.configs import BenchConfig, build_matrix
from trainopt.perf.bench.harness import build_model, build_optimizer, make_train_step, measure, run_matrix, speedup
from trainopt.perf.precision import Precision
from trainopt.perf.bench.mfu import peak_flops_for
from trainopt.perf.bench.timer import spread, time_windows
from trainopt.perf.bench.report import (
    fmt_gb,
    fmt_ms,
    fmt_percent,
    fmt_rate,
    fmt_ratio,
    fmt_ratio3,
    fmt_seconds,
    goals_summary,
    plot_results,
    profile_table,
    recipe_summary,
    results_table,
    stability_summary,
)

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "advanced" / "performance" / "benchmarking.md"
DATA = ROOT / "docs" / "_data"
FAST = dict(warmup_steps=1, steps=2, windows=2)


@pytest.fixture(scope="module")
def cpu_results() -> dict[str, Any]:
    """A small real run: the plain loop and a bf16 + fused configuration, plus a CPU-impossible one."""
    configs = [BenchConfig(batch_size=2, seq_len=16, label="plain"),
               BenchConfig(batch_size=2, seq_len=16, precision="bf16", optimizer="fused", label="bf16 fused"),
               BenchConfig(batch_size=2, seq_len=16, precision="fp16", label="fp16")]
    results = run_matrix(configs, "cpu", peak_tflops=1.0, progress=False, profile_steps=1, **FAST)
    results["recipe"] = speedup(results, "plain", "bf16 fused")
    return results


# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [
    ("size", "1b"), ("precision", "fp8"), ("compile", "fast"), ("compile_backend", "tvm"),
    ("optimizer", "sgd"), ("attention", "xformers"), ("checkpointing", 1),
])
def test_config_names_the_field_and_the_allowed_values(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be one of \[.+\], got {field}="):
        BenchConfig(**{field: value})


@pytest.mark.parametrize("field, value", [("batch_size", 0), ("batch_size", True), ("seq_len", 65), ("seq_len", -1)])
def test_config_rejects_bad_shapes(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        BenchConfig(**{field: value})


def test_sequence_length_zero_means_block_size() -> None:
    config = BenchConfig(size="tiny", batch_size=3)
    assert config.sequence_length == gpt_config("tiny").block_size
    assert config.tokens_per_step == 3 * gpt_config("tiny").block_size


def test_matrix_varies_one_field_at_a_time_around_the_base() -> None:
    base = BenchConfig()
    configs = build_matrix(base, {"precision": ["fp32", "bf16", "fp16"], "compile": ["default"]})
    assert configs[0] == base
    assert len(configs) == 4
    for config in configs[1:]:
        changed = [k for k in ("precision", "compile") if getattr(config, k) != getattr(base, k)]
        assert len(changed) == 1


def test_grid_matrix_is_the_cartesian_product() -> None:
    configs = build_matrix(BenchConfig(), {"precision": ["fp32", "bf16"], "batch_size": [2, 4, 8]}, grid=True)
    assert {(c.precision, c.batch_size) for c in configs} == {(p, b) for p in ("fp32", "bf16") for b in (2, 4, 8)}


def test_matrix_rejects_an_unknown_axis() -> None:
    with pytest.raises(ValueError, match="axes keys must be fields of BenchConfig"):
        build_matrix(BenchConfig(), {"learning_rate": [1e-3]})


# ---------------------------------------------------------------------------------------------
# Timing and statistics
# ---------------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=1e-6, max_value=10.0), min_size=1, max_size=30))
def test_spread_agrees_with_numpy_percentiles(values: list[float]) -> None:
    s = spread(values)
    expected = np.percentile(values, [25, 50, 75])
    assert np.allclose([s["q1"], s["median"], s["q3"]], expected, rtol=1e-9, atol=1e-12)
    assert s["min"] <= s["q1"] <= s["median"] <= s["q3"] <= s["max"]


def test_cpu_windows_measure_at_least_the_work_done() -> None:
    times = time_windows(lambda: time.sleep(0.01), "cpu", steps=3, windows=2)
    assert len(times) == 2 and all(t >= 0.01 for t in times)


class _FakeEvent:
    log: list[str] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing

    def record(self) -> None:
        self.log.append("record")

    def synchronize(self) -> None:
        self.log.append("sync")

    def elapsed_time(self, other: _FakeEvent) -> float:
        return 30.0


def test_cuda_windows_record_two_events_each_and_sync_once_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    _FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    times = time_windows(lambda: _FakeEvent.log.append("step"), torch.device("cuda"), steps=3, windows=2)
    window = ["record", "step", "step", "step", "record"]
    assert _FakeEvent.log == window * 2 + ["sync"]
    assert times == [pytest.approx(0.030 / 3)] * 2


def test_peak_flops_by_gpu_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, tflops in [("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA A100-SXM4-80GB", 312.0)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        peak, source = peak_flops_for(torch.device("cuda"))
        assert peak == tflops * 1e12 and str(tflops) in source


def test_peak_flops_override_wins_and_must_be_positive() -> None:
    assert peak_flops_for("cpu", 2.0)[0] == 2e12
    with pytest.raises(ValueError, match="peak_tflops must be positive"):
        peak_flops_for("cpu", 0.0)


# ---------------------------------------------------------------------------------------------
# Building and measuring
# ---------------------------------------------------------------------------------------------


def test_checkpointed_model_gives_the_same_loss_and_gradients() -> None:
    x = torch.randint(0, 512, (2, 16))
    y = torch.randint(0, 512, (2, 16))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model(BenchConfig(checkpointing=checkpointing), "cpu")
        loss = model(x, targets=y)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[0][1], grads[1][1]))


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_uses_the_chosen_adamw_implementation(impl: str) -> None:
    model = GPT(gpt_config("tiny"))
    optimizer = build_optimizer(BenchConfig(optimizer=impl), model)
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults[impl] is True


def test_measure_derives_tokens_per_s_and_mfu_from_the_median(cpu_results: dict[str, Any]) -> None:
    record = cpu_results["results"][0]
    model = GPT(gpt_config("tiny"))
    assert record["status"] == "ok"
    assert record["flops_per_token"] == model.flops_per_token(16)
    assert record["tokens_per_s"] == record["tokens_per_step"] / record["step_time_s"]["median"]
    assert record["mfu"] == pytest.approx(record["tokens_per_s"] * record["flops_per_token"] / 1e12)
    assert record["step_time_s"]["median"] == spread(record["window_step_times_s"])["median"]


def test_measure_reports_an_unsupported_precision_instead_of_failing(cpu_results: dict[str, Any]) -> None:
    record = cpu_results["results"][2]
    assert record["status"] == "unsupported" and "fp16" in record["error"] and "['fp32', 'bf16']" in record["error"]


def test_measure_and_run_matrix_validate_step_counts_before_running() -> None:
    with pytest.raises(ValueError, match="windows must be a positive int, got windows=0"):
        measure(BenchConfig(), windows=0)
    with pytest.raises(ValueError, match="warmup_steps must be a non-negative int, got warmup_steps=-1"):
        run_matrix([BenchConfig()], "cpu", warmup_steps=-1, progress=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_train_step_makes_no_host_sync_on_cuda() -> None:
    config = BenchConfig(precision="bf16", optimizer="fused", batch_size=4)
    model = build_model(config, "cuda")
    optimizer = build_optimizer(config, model)
    precision = Precision.from_name("bf16", "cuda")
    x, y = torch.randint(0, 512, (2, 4, 64), device="cuda")
    step = make_train_step(model, optimizer, precision, x, y)
    step()  # first step allocates optimizer state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------------------------------------
# Running a matrix
# ---------------------------------------------------------------------------------------------


def test_run_matrix_writes_results_with_environment(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    run_matrix([BenchConfig(batch_size=2, seq_len=8)], "cpu", out=out, progress=False, **FAST)
    saved = json.loads(out.read_text())
    for key in ("date", "git_commit", "torch", "cuda", "device", "peak_flops", "peak_source", "windows"):
        assert key in saved["meta"]
    assert saved["meta"]["torch"] == torch.__version__
    assert [r["status"] for r in saved["results"]] == ["ok"]


def test_time_budget_skips_a_configuration_whose_size_ran_longer_than_the_time_left(tmp_path: Path) -> None:
    earlier = run_matrix([], "cpu", progress=False)
    earlier["results"].append({"name": "slow", "config": {"size": "tiny"}, "status": "ok", "duration_s": 1000.0})
    configs = [BenchConfig(batch_size=2, seq_len=8), BenchConfig(size="small", batch_size=2, seq_len=8)]
    results = run_matrix(configs, "cpu", time_budget_s=100.0, progress=False, results=earlier,
                         out=tmp_path / "r.json", **FAST)
    assert [r["status"] for r in results["results"]] == ["ok", "skipped", "ok"]
    assert "time budget of 100 s reached" in results["results"][1]["error"]


def test_time_budget_spent_skips_everything_and_keeps_the_file(tmp_path: Path) -> None:
    results = run_matrix([BenchConfig(batch_size=2, seq_len=8)], "cpu", time_budget_s=5.0,
                         started=time.perf_counter() - 10.0, progress=False, out=tmp_path / "r.json", **FAST)
    assert [r["status"] for r in results["results"]] == ["skipped"]
    assert json.loads((tmp_path / "r.json").read_text()) == results


def test_a_failing_configuration_is_recorded_and_the_run_goes_on() -> None:
    configs = [BenchConfig(batch_size=2, seq_len=8, attention="cudnn"), BenchConfig(batch_size=2, seq_len=8)]
    if torch.cuda.is_available():
        pytest.skip("cuDNN attention may run on this machine")
    results = run_matrix(configs, "cpu", progress=False, **FAST)
    assert [r["status"] for r in results["results"]] == ["error", "ok"]


def test_speedup_is_the_throughput_ratio_and_the_step_time_ratio_at_equal_shapes(cpu_results: dict[str, Any]) -> None:
    plain, fused = cpu_results["results"][:2]
    assert plain["tokens_per_step"] == fused["tokens_per_step"]
    assert cpu_results["recipe"]["speedup"] == fused["tokens_per_s"] / plain["tokens_per_s"]
    assert cpu_results["recipe"]["speedup"] == pytest.approx(
        plain["step_time_s"]["median"] / fused["step_time_s"]["median"], rel=1e-12)
    with pytest.raises(ValueError, match="no results named"):
        speedup(cpu_results, "plain", "nope")


# ---------------------------------------------------------------------------------------------
# Reports: every number comes from a results file
# ---------------------------------------------------------------------------------------------

NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
FORMATS = (fmt_ms, fmt_rate, fmt_percent, fmt_gb, fmt_ratio, fmt_ratio3, fmt_seconds, str)
RENDERERS = (results_table, recipe_summary, goals_summary, profile_table, stability_summary)


def allowed_numbers(results: Any) -> set[str]:
    """Every number token that formatting the values of a results file can print."""
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
            for fmt in FORMATS:
                allowed.update(NUMBER.findall(fmt(value)))

    walk(results)
    return allowed


def rendered(results: Any) -> str:
    return "\n".join(render(results) for render in RENDERERS) + goals_summary(results, "tiny")


def test_rendered_numbers_all_come_from_the_results(cpu_results: dict[str, Any]) -> None:
    text = rendered(cpu_results)
    assert "tokens/s" in text and "Speed-up" in text and "MFU" in text
    stray = set(NUMBER.findall(text)) - allowed_numbers(cpu_results)
    assert not stray, f"numbers not in the results: {stray}"


def test_peak_memory_is_shown_in_gb_from_the_recorded_bytes(cpu_results: dict[str, Any]) -> None:
    results = json.loads(json.dumps(cpu_results))
    results["results"][0]["peak_memory_bytes"] = 41_263_000_000
    table = results_table(results)
    assert "| 41.3 |" in table
    assert not set(NUMBER.findall(table)) - allowed_numbers(results)


def test_an_error_message_cannot_break_the_table(cpu_results: dict[str, Any]) -> None:
    results = json.loads(json.dumps(cpu_results))
    results["results"][2]["error"] = "bad | pipe\nand a second line"
    row = next(line for line in results_table(results).splitlines() if line.startswith("| fp16 |"))
    assert row.count("|") == 7 and "bad / pipe and a second line" in row


def test_the_number_check_catches_a_number_not_in_the_results(cpu_results: dict[str, Any]) -> None:
    text = rendered(cpu_results) + "\nThe recipe is 123456.7 times faster."
    assert set(NUMBER.findall(text)) - allowed_numbers(cpu_results) == {"123456.7"}


@pytest.mark.parametrize("path", sorted(DATA.glob("bench_*.json")), ids=lambda p: p.name)
def test_committed_result_files_render_only_their_own_numbers(path: Path) -> None:
    results = json.loads(path.read_text())
    text = "\n".join(render(path) for render in RENDERERS)
    assert not set(NUMBER.findall(text)) - allowed_numbers(results)


def page_renders() -> list[tuple[str, str]]:
    """``(function, data path)`` of every ``trainopt-render`` block of the benchmarking page."""
    return re.findall(r"```\{trainopt-render\} (\S+)\n:data: (\S+)\n", PAGE.read_text())


def test_every_table_on_the_page_shows_only_numbers_from_its_results_file() -> None:
    import importlib

    renders = page_renders()
    assert len(renders) >= 5 and all(path.startswith("_data/bench_") for _, path in renders)
    for dotted, data in renders:
        module, name = dotted.rsplit(".", 1)
        path = ROOT / "docs" / data
        text = getattr(importlib.import_module(module), name)(path)
        results = json.loads(path.read_text()) if path.exists() else {}
        stray = set(NUMBER.findall(text)) - allowed_numbers(results) - set(NUMBER.findall(path.name))
        assert not stray, f"{dotted} on {data} shows numbers not in the file: {stray}"


def test_a_missing_results_file_renders_as_not_yet_measured(tmp_path: Path) -> None:
    for render in RENDERERS:
        assert "Not yet measured on a GPU" in render(tmp_path / "bench_h100.json")


def test_goal_summary_says_met_or_missed_with_the_measured_figure(cpu_results: dict[str, Any]) -> None:
    best = max((r for r in cpu_results["results"] if r["status"] == "ok"), key=lambda r: r["tokens_per_s"])
    for goal, verdict in ((best["mfu"] * 2, "misses"), (best["mfu"] / 2, "meets")):
        results = {**cpu_results, "meta": {**cpu_results["meta"], "mfu_goal": goal}}
        text = goals_summary(results, "tiny")
        assert f"**{verdict}**" in text and fmt_percent(best["mfu"]) in text and best["name"] in text


def test_profile_shares_add_up_and_the_table_shows_the_fastest(cpu_results: dict[str, Any]) -> None:
    profiled = [r for r in cpu_results["results"] if r["status"] == "ok"]
    for record in profiled:
        categories = record["profile"]["categories"].values()
        assert sum(c["share"] for c in categories) == pytest.approx(1.0)
        assert sum(c["s_per_step"] for c in categories) == pytest.approx(record["profile"]["busy_s_per_step"])
    fastest = max(profiled, key=lambda r: r["tokens_per_s"])
    assert profile_table(cpu_results, "tiny").startswith(f"Profile of {fastest['name']}")


def test_chart_has_one_bar_per_measured_configuration(cpu_results: dict[str, Any]) -> None:
    fig = plot_results(cpu_results)
    assert isinstance(fig, Figure)
    assert len(fig.axes[0].patches) == sum(r["status"] == "ok" for r in cpu_results["results"])


def test_page_types_no_result_table_by_hand() -> None:
    rows = [line for line in PAGE.read_text().splitlines() if line.lstrip().startswith("|")]
    assert rows == []


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def console_commands() -> list[list[str]]:
    """The ``$ python -m trainopt.perf.bench ...`` commands of the page's console blocks."""
    return [shlex.split(line.split("$ ", 1)[1]) for line in PAGE.read_text().splitlines()
            if line.startswith("$ python -m trainopt.perf.bench")]


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_page_matrix_command_runs_and_writes_a_table_and_json(tmp_path: Path) -> None:
    command = next(c for c in console_commands() if c[3] == "matrix")
    result = run_cli(command[1:], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / command[command.index("--out") + 1]
    saved = json.loads(out.read_text())
    statuses = {r["name"]: r["status"] for r in saved["results"]}
    assert statuses["tiny fp32 foreach 8x64"] == "ok" and statuses["tiny fp16 foreach 8x64"] == "unsupported"
    assert "| tiny fp32 foreach 8x64 |" in result.stdout
    assert "%" in result.stderr or "done" in result.stderr  # the progress bar goes to stderr


def test_page_gpu_command_runs_at_tiny_size_on_cpu(tmp_path: Path) -> None:
    command = next(c for c in console_commands() if c[3] == "all")
    out = tmp_path / "bench_h100.json"
    command[command.index("--out") + 1] = str(out)
    tiny = ["--size", "tiny", "--batch-size", "2", "--compile-backend", "eager", "--warmup", "1", "--steps", "1",
            "--windows", "1", "--no-progress"]
    result = run_cli(command[1:] + tiny, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = json.loads(out.read_text())
    assert saved["meta"]["preset"] == "h100" and saved["meta"]["command"].startswith("python -m trainopt.perf.bench all")
    assert saved["recipe"]["speedup"] is not None and saved["stability"]["status"] == "ok"
    assert saved["stability"]["sync_check"]["passed"]
    assert all("profile" in r for r in saved["results"] if r["status"] == "ok")
    assert {r["config"]["size"] for r in saved["results"]} == {"tiny"}
    assert "Speed-up" in result.stdout


def test_cli_rejects_an_invalid_choice_naming_the_allowed_values(tmp_path: Path) -> None:
    result = run_cli(["-m", "trainopt.perf.bench", "matrix", "--precision", "fp8"], tmp_path)
    assert result.returncode == 2 and "--precision" in result.stderr and "'bf16'" in result.stderr


def test_every_bench_command_on_the_page_parses() -> None:
    from trainopt.perf.bench.cli import build_parser

    commands = console_commands()
    assert {c[3] for c in commands} == {"matrix", "recipe", "all"}
    for command in commands:
        args = build_parser().parse_args(command[3:])
        assert args.command == command[3]


def test_recipe_command_compares_the_two_loops_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainopt.perf.bench.cli import main

    out = tmp_path / "recipe.json"
    code = main(["recipe", "--size", "tiny", "--batch-size", "2", "--seq-len", "16", "--compile-backend", "eager",
                 "--warmup", "1", "--steps", "1", "--windows", "1", "--no-progress", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert code == 0 and [r["status"] for r in saved["results"]] == ["ok", "ok"]
    assert saved["recipe"] == speedup(saved, "tiny plain PyTorch loop", "tiny trainopt recipe")
    assert "Speed-up" in capsys.readouterr().out


def test_stability_command_delegates_to_the_stability_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    from trainopt.perf.bench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["stability", "--help"])
    assert exit_info.value.code == 0 and "trainopt.perf.bench.stability" in capsys.readouterr().out
