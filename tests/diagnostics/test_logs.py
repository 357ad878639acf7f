"""diagnose() on the logs people have, written by real runs: a Hugging Face Trainer's
trainer_state.json and TensorBoard events, and the project's generated runs written by a
SummaryWriter, as CSV and as JSON Lines under other names. Each run is healthy or has a known
fault; the first finding fits the fault, and healthy runs get none. Also the command line."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainopt.diagnostics import diagnose, generate_run
from trainopt.diagnostics.logs import canonical_name, log_format, read_log
from trainopt_site.diagnostics.generate import FITTING

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guides" / "troubleshooting.md"
VOCAB = 32
TRAINER_FITS = {
    "healthy": frozenset(),
    "lr_too_high": FITTING["lr_too_high"],
    "nan_weight": FITTING["nan_sample"],
    "lr_too_low": FITTING["lr_too_low"],
}


def _first(findings) -> str | None:
    return findings[0].symptom if findings else None


@pytest.mark.parametrize("cause", list(TRAINER_FITS))
def test_a_trainer_state_json_gets_the_finding_of_its_fault(trainer_runs, cause):
    out = trainer_runs[cause]
    assert (
        log_format(out) == "trainer_state"
        and log_format(out / "trainer_state.json") == "trainer_state"
    )
    log = read_log(out)
    assert log.files == (out / "trainer_state.json",)
    assert len(log.records) == 100 and {"loss", "lr", "grad_norm", "step"} <= log.records[0].keys()
    findings = diagnose(out / "trainer_state.json", classes=VOCAB)
    if cause == "healthy":
        assert findings == []
    else:
        assert _first(findings) in TRAINER_FITS[cause], [(f.symptom, f.step) for f in findings]


@pytest.mark.parametrize("cause", list(TRAINER_FITS))
def test_the_trainers_tensorboard_events_give_the_same_findings(trainer_runs, cause):
    events = trainer_runs[cause] / "runs"
    assert log_format(events) == "tensorboard"
    from_state = [(f.symptom, f.step) for f in diagnose(trainer_runs[cause], classes=VOCAB)]
    assert [(f.symptom, f.step) for f in diagnose(events, classes=VOCAB)] == from_state


GENERATED = [
    ("healthy", "sgd"),
    ("lr_too_high", "sgd"),
    ("lr_too_low", "adamw"),
    ("nan_sample", "sgd"),
    ("gradient_spike", "sgd"),
]


@pytest.fixture(scope="module")
def generated() -> dict[str, list[dict]]:
    return {
        cause: generate_run(cause, optimizer, hidden=128, seed=0) for cause, optimizer in GENERATED
    }


def _write(records: list[dict], fmt: str, folder: Path) -> Path:
    """The records as a tracker or logger would write them, under other names than the schema's."""
    if fmt == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(folder)) as writer:
            for r in records:
                writer.add_scalar("train/loss", r["loss"], r["step"])
                writer.add_scalar("train/lr", r["lr"], r["step"])
                writer.add_scalar("train/grad_norm", r["grad_norm"], r["step"])
        return folder
    if fmt == "csv":
        path = folder / "metrics.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["global_step", "train/loss", "learning_rate", "grad_norm"])
            writer.writerows([r["step"], r["loss"], r["lr"], r["grad_norm"]] for r in records)
        return path
    path = folder / "metrics.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "iteration": r["step"],
                    "train_loss": r["loss"],
                    "lr": r["lr"],
                    "gradient_norm": r["grad_norm"],
                }
            )
            + "\n"
            for r in records
        )
    )
    return path


@pytest.mark.parametrize("fmt", ["tensorboard", "csv", "jsonl"])
@pytest.mark.parametrize("cause", [cause for cause, _ in GENERATED])
def test_a_generated_run_written_as_a_log_gets_the_finding_of_its_cause(
    generated, tmp_path, fmt, cause
):
    path = _write(generated[cause], fmt, tmp_path)
    findings = diagnose(path, classes=10)
    if cause == "healthy":
        assert findings == []
    else:
        assert _first(findings) in FITTING[cause], [(f.symptom, f.step) for f in findings]
    # the log says what the records say: the same symptoms at the same steps
    assert [(f.symptom, f.step) for f in findings] == [
        (f.symptom, f.step) for f in diagnose(generated[cause], classes=10)
    ]


def test_common_column_names_are_the_schemas():
    names = {
        "train/loss": "loss",
        "Loss": "loss",
        "training_loss": "loss",
        "lr": "lr",
        "learning_rate": "lr",
        "train/learning_rate": "lr",
        "grad_norm": "grad_norm",
        "train/grad_norm": "grad_norm",
        "global_step": "step",
        "Step": "step",
        "trainer/global_step": "step",
        "eval/loss": "eval/loss",
        "val_loss": "val_loss",
        "Loss/train": "loss",  # PyTorch's TensorBoard tutorial
        "GradNorm/train": "grad_norm",
        "Loss/test": "loss/test",
        "grad_2.0_norm_total": "grad_norm",  # Lightning's grad_norm(), LearningRateMonitor
        "grad_inf_norm_total": "grad_norm",
        "grad_2.0_norm/layer.weight": "grad_2.0_norm/layer.weight",
        "lr-AdamW": "lr",
        "lr-SGD/pg1": "lr",
        "lr-SGD/pg2": "lr-sgd/pg2",
        "train_loss_epoch": "train_loss_epoch",
        "train/train_loss": "train/train_loss",  # the Trainer's end-of-run summary
        "train/train_runtime": "train/train_runtime",
        "_step": "step",  # W&B's export
        "train/global_step": "step",
        "_timestamp": "wall_time",
    }
    assert {name: canonical_name(name) for name in names} == names


def test_evaluation_and_summary_entries_are_not_steps(tmp_path):
    state = tmp_path / "trainer_state.json"
    state.write_text(
        json.dumps(
            {
                "log_history": [
                    {"loss": 2.3, "step": 10},
                    {"eval_loss": 2.2, "step": 10},
                    {"loss": 2.1, "step": 20},
                    {"train_runtime": 3.0, "train_loss": 2.2, "step": 20},
                ]
            }
        )
    )
    assert [(r["step"], r["loss"]) for r in read_log(state).records] == [(10, 2.3), (20, 2.1)]


def _command(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainopt.diagnostics", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def test_a_missing_file_is_one_line_and_exit_status_2_without_a_traceback():
    result = _command("no/such/trainer_state.json")
    assert (result.returncode, result.stdout, result.stderr) == (
        2,
        "",
        "error: no/such/trainer_state.json: no such file\n",
    )


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["pyproject.toml"],
            "error: path: pyproject.toml is not a log this reads; give a trainer_state.json",
        ),
        (["--classes", "0", "x.csv"], "error: --classes: "),
        (
            ["{tmp}/metrics.csv"],
            "error: loss: no column is a training loss; name it loss, train/loss or train_loss",
        ),
        (["{tmp}/empty"], "error: path: "),
    ],
)
def test_a_mistake_names_its_field_in_one_line(tmp_path, monkeypatch, args, line):
    from trainopt.config.cli import run_command
    from trainopt.diagnostics.cli import main

    (tmp_path / "metrics.csv").write_text("step,score\n0,1.0\n")
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(ROOT)
    err = io.StringIO()
    assert run_command(main, [a.format(tmp=tmp_path) for a in args], stderr=err) == 2
    assert err.getvalue().startswith(line) and err.getvalue().count("\n") == 1, err.getvalue()


def _masked(text: str) -> str:
    return re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?", "N", text)


def test_the_pages_command_prints_the_finding_the_page_shows(tmp_path):
    block = re.search(
        r"```console\n(\$ python -m trainopt\.diagnostics .*?)```", PAGE.read_text(), flags=re.S
    )
    command, *shown = block[1].splitlines()
    args = command.split()[4:]  # after "$ python -m trainopt.diagnostics"
    records = generate_run("lr_too_high", "sgd", steps=100)  # the log the page's example writes
    (tmp_path / "output").mkdir()
    history = [
        {
            "step": r["step"],
            "loss": r["loss"],
            "grad_norm": r["grad_norm"],
            "learning_rate": r["lr"],
        }
        for r in records
    ]
    (tmp_path / "output" / "trainer_state.json").write_text(
        json.dumps({"global_step": 100, "log_history": history})
    )
    result = _command(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    # The page wraps long lines to fit its column (continuations indented 4 more); the words,
    # their order and every line break of the command's own output must be the same.
    def lines(text_lines):
        out, indent = [], 0
        for line in text_lines:
            if out and len(line) - len(line.lstrip()) >= indent + 4:  # a wrapped continuation
                out[-1] += " " + line.strip()
            else:
                out.append(line.rstrip())
                indent = len(line) - len(line.lstrip())
        return [" ".join(line.split()) for line in out]

    printed, expected = lines(result.stdout.splitlines()), lines(shown)
    assert len(expected) >= 3
    assert [_masked(x) for x in printed[: len(expected)]] == [_masked(x) for x in expected]


def test_rows_of_one_step_are_taken_in_the_order_of_their_wall_time():
    from trainopt.diagnostics.logs import normalize

    rows = [
        {"_step": 1, "_timestamp": 20.0, "train/global_step": 5, "train/loss": 1.0},
        {"_step": 0, "_timestamp": 10.0, "train/global_step": 5, "train/loss": 9.0},
    ]
    assert [(r["step"], r["loss"]) for r in normalize(rows)] == [(5, 1.0)]
