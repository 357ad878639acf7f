"""diagnose() on the logs frameworks write as their documentation shows, each written in this
session by the framework itself (see conftest.py): which file is read, what it reads, and what
each healthy or faulty log gets, read whole and read stopped midway."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
from pathlib import Path

import pytest

from trainopt.diagnostics import diagnose
from trainopt.diagnostics.advice import CLIP
from trainopt.diagnostics.cli import main
from trainopt.diagnostics.logs import read_log

VOCAB = 32


def _symptoms(findings) -> list[tuple[str, int]]:
    return [(f.symptom, f.step) for f in findings]


def _lightning(logs: dict[str, Path], name: str, logger: str) -> Path:
    folder = logs[name] / logger
    return next(folder.glob("**/metrics.csv")) if logger == "csv" else folder


@pytest.fixture(scope="module")
def healthy_logs(framework_logs, trainer_runs, trainer_folders) -> dict[str, tuple[Path, dict]]:
    """Every healthy log a real framework wrote, with what diagnose is told of it."""
    classes = {"classes": VOCAB}
    return {
        "pytorch tutorial (TensorBoard)": (framework_logs["tutorial"], {}),
        "pytorch, restarted (TensorBoard)": (framework_logs["tutorial_restart"], {}),
        "lightning CSVLogger": (_lightning(framework_logs, "lightning", "csv"), {}),
        "lightning TensorBoardLogger": (_lightning(framework_logs, "lightning", "tb"), {}),
        "w&b export": (framework_logs["wandb"], {}),
        "w&b export, resumed": (framework_logs["wandb_restart"], {}),
        "hf trainer_state.json": (trainer_runs["healthy"], classes),
        "hf TensorBoard": (trainer_runs["healthy"] / "runs", classes),
        "hf every 3 steps, checkpoints": (trainer_folders["sparse"], classes),
        "hf every 3 steps (TensorBoard)": (trainer_folders["sparse"] / "runs", classes),
        "hf checkpoint-50 of 100": (trainer_folders["sparse"] / "checkpoint-50", classes),
    }


def test_healthy_framework_logs_get_no_finding_read_whole_or_stopped_midway(
    healthy_logs, generated_runs
):
    flagged = {}
    for name, (path, kwargs) in healthy_logs.items():
        records = read_log(path).records
        assert len(records) >= 15, name
        for part, read in (("whole", records), ("midway", records[: len(records) // 2])):
            if found := _symptoms(diagnose(read, **kwargs)):
                flagged[name, part] = found
    for spec, records in generated_runs:
        if spec.cause == "healthy" and (found := _symptoms(diagnose(records[:150], classes=10))):
            flagged[spec, "midway"] = found
    assert flagged == {}


@pytest.mark.parametrize(
    "name, logger, steps",
    [
        ("tutorial", None, range(160)),
        ("wandb", None, range(160)),
        ("wandb_restart", None, range(160)),
        ("lightning", "csv", range(160)),
        ("lightning", "tb", range(160)),
    ],
)
def test_each_frameworks_names_are_the_schemas(framework_logs, name, logger, steps):
    path = _lightning(framework_logs, name, logger) if logger else framework_logs[name]
    records = read_log(path).records
    assert [r["step"] for r in records] == list(steps)  # W&B: train/global_step, not _step
    wanted = {"loss", "grad_norm"} | ({"lr"} if name != "tutorial" else set())
    assert all(wanted <= r.keys() and math.isfinite(r["loss"]) for r in records), records[0]
    assert all(0 < r["loss"] < 3 and r["grad_norm"] > 0 for r in records)


def test_lightnings_gradient_norm_is_its_grad_norm_total(framework_logs):
    path = _lightning(framework_logs, "lightning_growth", "csv")
    with path.open() as f:
        logged = {
            int(row["step"]): float(row["grad_2.0_norm_total"])
            for row in csv.DictReader(f)
            if row["grad_2.0_norm_total"]
        }
    assert {r["step"]: r["grad_norm"] for r in read_log(path).records} == logged


@pytest.mark.parametrize("logger", ["csv", "tb"])
def test_a_gradient_growing_30_percent_a_step_in_lightning_is_named_within_five_steps(
    framework_logs, logger
):
    records = read_log(_lightning(framework_logs, "lightning_growth", logger)).records
    assert records[150]["grad_norm"] > 1e4 * records[99]["grad_norm"]  # the fault is real
    (found,) = diagnose(records)
    assert found.symptom == "gradient_explosion" and 95 <= found.step <= 101, found
    named = next(t for t in range(100, 160) if diagnose(records[: t + 1]))
    assert named <= 105, named
    assert diagnose(records[:100]) == []


@pytest.mark.parametrize("logger", ["csv", "tb"])
def test_the_newest_of_two_runs_in_a_folder_is_read_and_named(
    framework_logs, trainer_folders, logger
):
    output = trainer_folders["two_runs"]
    if logger == "csv":  # the newer run saved checkpoint-40; the older one, checkpoint-100
        log = read_log(output)
        assert log.files == (output / "checkpoint-40" / "trainer_state.json",)
        assert {
            output / "trainer_state.json",
            output / "checkpoint-100" / "trainer_state.json",
        } <= set(log.others)
    else:
        log = read_log(output / "runs")
        assert len(log.files) == 1 and len(log.others) == 1
        assert log.files[0].stat().st_mtime > log.others[0].stat().st_mtime
    assert [r["step"] for r in log.records] == list(range(1, 41))
    assert diagnose(log, classes=VOCAB)[0].symptom == "loss_explosion"
    tutorial = read_log(framework_logs["tutorial_two_runs"])
    assert tutorial.files[0].parent.name == "b" and tutorial.others[0].parent.name == "a"
    assert diagnose(tutorial, classes=10)[0].symptom == "loss_explosion"


def test_the_command_says_which_file_it_read(trainer_folders):
    output = trainer_folders["two_runs"]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main([str(output), "--classes", str(VOCAB)]) == 0
    first, newest, settings, finding = printed.getvalue().splitlines()[:4]
    assert first.startswith(f"{output / 'checkpoint-40' / 'trainer_state.json'}: trainer_state")
    assert newest.startswith(f"  the newest of 6 logs in {output}; not read: ")
    assert settings == "  settings: max_grad_norm=1" and finding.startswith("loss_explosion")


@pytest.mark.parametrize("where", ["trainer_state", "events"])
def test_the_trainers_summary_is_not_a_step(trainer_folders, where):
    # logged every 3 steps of 100: the summary comes at step 100, where nothing else is logged
    output = trainer_folders["sparse"]
    records = read_log(output if where == "trainer_state" else output / "runs").records
    assert [r["step"] for r in records] == list(range(3, 100, 3))
    state = json.loads((output / "trainer_state.json").read_text())
    assert state["log_history"][-1]["step"] == 100 and "train_loss" in state["log_history"][-1]
    losses = {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}
    assert all(math.isclose(r["loss"], losses[r["step"]], rel_tol=1e-6) for r in records)


@pytest.mark.parametrize("name", ["tutorial_restart", "wandb_restart"])
def test_a_restarted_run_is_read_with_the_steps_it_rewrote(framework_logs, name):
    # weights NaN after step 100, restarted from the step-90 checkpoint: steps 90-159 again
    log = read_log(framework_logs[name])
    assert [r["step"] for r in log.records] == list(range(160))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in log.records)
    if name == "tutorial_restart":
        assert len(log.files) == 2  # the dead run's events and the restart's, in one folder
    assert diagnose(log) == []


@pytest.mark.parametrize("at", [120, 50])
@pytest.mark.parametrize("fmt", ["w&b", "csv", "jsonl"])
def test_one_skipped_nan_batch_is_the_only_finding(framework_logs, tmp_path, fmt, at):
    # the run goes on: judged on its finite steps, its first 50 alone would read as slow
    export = framework_logs["wandb_bad_batch" if at == 120 else "wandb_early_bad_batch"]
    path = export
    if fmt != "w&b":  # the same run, under the schema's names
        records = read_log(export).records
        path = tmp_path / f"metrics.{fmt}"
        if fmt == "csv":
            rows = [f"{r['step']},{r['loss']},{r['grad_norm']}" for r in records]
            path.write_text("step,loss,grad_norm\n" + "\n".join(rows) + "\n")
        else:
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
    findings = diagnose(path, classes=10)
    assert _symptoms(findings) == [("nan_inf", at)]


def test_the_trainer_logs_a_nan_loss_as_0_and_it_is_read_as_nan(trainer_runs):
    state = json.loads((trainer_runs["nan_weight"] / "trainer_state.json").read_text())
    logged = [e for e in state["log_history"] if "loss" in e]
    assert all(e["loss"] == 0.0 and math.isnan(e["grad_norm"]) for e in logged[51:])
    assert 1.0 < logged[49]["loss"] < 4.0  # before the weight turned NaN
    records = read_log(trainer_runs["nan_weight"]).records
    assert all(math.isnan(r["loss"]) for r in records[51:])


@pytest.mark.parametrize("where", ["trainer_state", "events"])
def test_the_advice_fits_the_trainers_clipping(trainer_runs, where):
    output = trainer_runs["lr_too_high"]
    log = read_log(output if where == "trainer_state" else output / "runs")
    assert log.settings == {"max_grad_norm": 1.0}  # the Trainer's default, from its arguments
    findings = diagnose(log, classes=VOCAB)
    assert findings and all(CLIP not in f.fix for f in findings)
    assert "keep clipping at max_norm=1 (the run already clips there" in findings[0].fix
    unclipped = diagnose(log.records, classes=VOCAB, max_grad_norm=0.0)
    assert CLIP in unclipped[0].fix
