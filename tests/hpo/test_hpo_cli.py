"""``python -m trainopt.hpo``: the config names your own objective, and every mistake is one
line."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import yaml

from trainopt.config.cli import run_command
from trainopt.hpo import load_hpo_config, tune
from trainopt.hpo.cli import main

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = "search_space:\n  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}\n"

MY_TRAIN = '''
def objective(trial, params):
    """A stand-in for a training run: the loss is lowest at x = target, and a second value to
    maximize."""
    return (params["x"] - params["target"]) ** 2, params["x"]
'''


def _error(tmp_path: Path, argv: list[str]) -> str:
    """What ``python -m trainopt.hpo ARGV`` prints on stderr, after checking it failed with
    status 2."""
    stderr = io.StringIO()
    assert (
        run_command(main, [*argv, "--storage", f"sqlite:///{tmp_path / 'never.db'}"], stderr=stderr)
        == 2
    )
    return stderr.getvalue()


def _one_line(text: str, field: str, allowed: str) -> None:
    assert text.count("\n") == 1 and "Traceback" not in text, text
    assert text.startswith(f"error: {field}: ") and allowed in text, text


BAD_CONFIGS = [
    (
        "bounds reversed",
        "search_space:\n  lr: {type: float, low: 0.1, high: 1.0e-4}\n",
        "search_space.lr",
        "needs low < high, got low=0.1, high=0.0001",
    ),
    (
        "log with low 0",
        "search_space:\n  lr: {type: float, low: 0, high: 0.1, log: true}\n",
        "search_space.lr.low",
        "must be > 0 when log is true",
    ),
    (
        "unknown type",
        "search_space:\n  lr: {type: double, low: 0.0, high: 1.0}\n",
        "search_space.lr.type",
        "must be one of ['float', 'int', 'categorical'], got 'double'",
    ),
    (
        "unknown sampler",
        "study: {sampler: bayes}\n" + SPACE,
        "study.sampler",
        "'qmc', 'tpe', 'random', 'grid', 'gp'",
    ),
    (
        "unknown pruner",
        "study: {pruner: mean}\n" + SPACE,
        "study.pruner",
        "'median', 'successive-halving'",
    ),
    (
        "empty choices",
        "search_space:\n  opt: {type: categorical, choices: []}\n",
        "search_space.opt.choices",
        "must be a non-empty list, got []",
    ),
    (
        "negative steps",
        "training: {steps: -10}\n" + SPACE,
        "training.steps",
        "must be a positive int, got -10",
    ),
    (
        "negative step",
        "search_space:\n  hidden: {type: int, low: 16, high: 64, step: -16}\n",
        "search_space.hidden.step",
        "must be positive, got -16",
    ),
    (
        "misspelt section",
        "serach_space:\n  lr: {type: float, low: 1.0e-4, high: 0.1}\n",
        "serach_space",
        "unknown section; did you mean 'search_space'?",
    ),
    (
        "misspelt key",
        "study: {prune_afer: 10}\n" + SPACE,
        "study.prune_afer",
        "did you mean 'prune_after'?",
    ),
    (
        "YAML syntax error",
        "search_space:\n  lr: {type: float, low: 0.1\n",
        "{path}",
        "is not valid YAML (line 3",
    ),
    ("empty file", "", "{path}", "is empty; a tuning config has the sections"),
    ("not a mapping", "- lr\n", "{path}", "must be a mapping of sections"),
    (
        "objective not importable",
        "objective: no_such_module:objective\n" + SPACE,
        "objective",
        "cannot import 'no_such_module'",
    ),
    (
        "objective without a function",
        "objective: my_train\n" + SPACE,
        "objective",
        "must be 'module:function'",
    ),
    (
        "directions for the digits example",
        "study: {directions: [maximize]}\n" + SPACE,
        "study.directions",
        "is for your own objective",
    ),
    (
        "heartbeat zero",
        "study: {heartbeat: 0}\n" + SPACE,
        "study.heartbeat",
        "must be a positive int or null, got 0",
    ),
]


@pytest.mark.parametrize(
    "text, field, allowed", [case[1:] for case in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS]
)
def test_a_bad_config_prints_one_line_naming_the_field(
    tmp_path: Path, text: str, field: str, allowed: str
) -> None:
    config = tmp_path / "tune.yaml"
    config.write_text(text)
    _one_line(
        _error(tmp_path, [str(config), "--n-trials", "2"]), field.format(path=config), allowed
    )
    assert not (tmp_path / "never.db").exists(), "nothing is created before the config is checked"


@pytest.mark.parametrize(
    "argv, field, allowed",
    [
        (["missing.yaml"], "missing.yaml", "no such file"),
        (["{config}", "--n-trials", "0"], "--n-trials", "must be an int >= 1, got '0'"),
        (["{config}", "--n-trials", "ten"], "--n-trials", "must be an int >= 1, got 'ten'"),
        (["{config}", "--create-only"], "--create-only", "needs --n-trials N"),
        (
            ["{config}", "--n-trials", "2", "--storage", "study.db"],
            "--storage",
            "must be an SQLAlchemy URL",
        ),
        (
            [
                "{config}",
                "--n-trials",
                "2",
                "--storage",
                "postgresql+psycopg2://tuner:secret@127.0.0.1:9/hpo",
            ],
            "--storage",
            "cannot open postgresql+psycopg2://tuner:***@127.0.0.1:9/hpo",
        ),
        (["{config}", "--bogus"], "--bogus", "not an argument"),
    ],
    ids=[
        "missing file",
        "n-trials 0",
        "n-trials not an int",
        "create-only alone",
        "storage not a URL",
        "database unreachable",
        "unknown argument",
    ],
)
def test_a_bad_argument_prints_one_line_naming_it(
    tmp_path: Path, argv: list[str], field: str, allowed: str
) -> None:
    config = tmp_path / "tune.yaml"
    config.write_text(SPACE)
    argv = [arg.format(config=config) for arg in argv]
    stderr = io.StringIO()
    assert run_command(main, argv, stderr=stderr) == 2
    _one_line(stderr.getvalue(), field, allowed)
    assert "secret" not in stderr.getvalue()


@pytest.mark.parametrize(
    "text, name",
    [("search_space:\n  lr: {type: float, low: 0.1\n", "tune.yaml"), (None, "missing.yaml")],
    ids=["YAML syntax error", "missing file"],
)
def test_the_command_prints_no_traceback(tmp_path: Path, text: str | None, name: str) -> None:
    if text is not None:
        (tmp_path / name).write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "trainopt.hpo", name, "--n-trials", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: {name}: ") and result.stderr.count("\n") == 1, (
        result.stderr
    )


@pytest.fixture(autouse=True)
def _forget_the_module() -> Iterator[None]:
    """The page imports its own ``my_train`` in the same test process: leave no module of this name
    behind."""
    yield
    sys.modules.pop("my_quadratic", None)


def _my_project(tmp_path: Path) -> Path:
    (tmp_path / "my_quadratic.py").write_text(MY_TRAIN)
    (tmp_path / "my_tuning.yaml").write_text(
        yaml.safe_dump(
            {
                "objective": "my_quadratic:objective",
                "study": {
                    "directions": ["minimize", "maximize"],
                    "sampler": "random",
                    "pruner": None,
                    "heartbeat": 5,
                },
                "fixed": {"target": 0.3},
                "search_space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
            }
        )
    )
    return tmp_path


def test_the_config_names_your_objective_and_passes_it_fixed_and_tuned_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(_my_project(tmp_path)))
    config = load_hpo_config(tmp_path / "my_tuning.yaml")
    assert config.objective == "my_quadratic:objective" and config.directions == (
        "minimize",
        "maximize",
    )
    study = tune(
        config.make_objective(),
        config.space,
        6,
        storage=":memory:",
        directions=config.directions,
        sampler=config.sampler,
        pruner=config.make_pruner(),
    )
    for trial in study.trials:
        assert trial.values == pytest.approx([(trial.params["x"] - 0.3) ** 2, trial.params["x"]])


@pytest.mark.parametrize(
    "text, field",
    [
        ("study: {objectives: [val_loss]}\n", "study.objectives"),
        ("training: {steps: 10}\n", "training"),
    ],
)
def test_the_digits_settings_are_refused_with_your_own_objective(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, field: str
) -> None:
    monkeypatch.syspath_prepend(str(_my_project(tmp_path)))
    config = tmp_path / "mixed.yaml"
    config.write_text("objective: my_quadratic:objective\n" + text + SPACE)
    _one_line(_error(tmp_path, [str(config), "--n-trials", "2"]), field, "digits example")


def test_the_command_tunes_your_objective_from_the_folder_it_runs_in(tmp_path: Path) -> None:
    folder = _my_project(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainopt.hpo",
            "my_tuning.yaml",
            "--n-trials",
            "6",
            "--no-progress",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "study my_tuning: 6 trials, 6 complete" in result.stdout and "Pareto front" in result.stdout
    )
    assert (folder / "my_tuning-plots" / "my_tuning-pareto.png").exists()


def test_no_hpo_module_summary_holds_a_double_dash() -> None:
    """The API reference shows each module's first paragraph as plain text, where `--` becomes an
    en-dash."""
    import importlib
    import inspect
    import pkgutil

    import trainopt.hpo

    for info in pkgutil.walk_packages(trainopt.hpo.__path__, prefix="trainopt.hpo."):
        if info.name.rsplit(".", 1)[-1].startswith("_"):
            continue  # not in the reference
        doc = inspect.getdoc(importlib.import_module(info.name)) or ""
        summary = doc.strip().split("\n\n")[0]
        assert "--" not in summary and "\u2013" not in summary, (info.name, summary)
