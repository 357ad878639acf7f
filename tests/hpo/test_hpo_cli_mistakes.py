"""``python -m trainopt.hpo``: every mistake is one line, exit status 2, found before anything is
created.

Issue 22, requirements 5 and 8. Each option of the parser has bad values below; an option added
without one fails :func:`test_every_option_has_a_bad_value`. Each case runs in an empty folder
(the working directory), and the folder must hold exactly what it held before: no database, no
journal, no plots folder.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from trainopt.config.cli import run_command
from trainopt.hpo import open_storage
from trainopt.hpo.cli import build_parser, main

SPACE = {"x": {"type": "float", "low": 0.0, "high": 1.0}}
GOOD = {"study": {"sampler": "random", "pruner": None}, "search_space": SPACE}
MINE = """
def objective(trial, params):
    return params["x"]


def two(trial, params):
    return params["x"], 1 - params["x"]


class Objective:
    def __init__(self, trial, params):
        pass
"""
CUDA_MISSING = (
    f"cuda:{torch.cuda.device_count()}"  # one past the last device; cuda:0 on a CPU machine
)

# option -> [(argv after the config, field the error names, words of what is allowed)]
BAD_ARGUMENTS: dict[str, list[tuple[list[str], str, str]]] = {
    "config": [
        (["!missing.yaml"], "missing.yaml", "no such file"),
        (["!folder"], "folder", "is a folder"),
    ],
    "--n-trials": [
        (["--n-trials", "0"], "--n-trials", "must be an int >= 1"),
        (["--n-trials", "ten"], "--n-trials", "must be an int >= 1"),
        (["--n-trials", "-3"], "--n-trials", "must be an int >= 1"),
    ],
    "--storage": [
        (["--n-trials", "2", "--storage", "study.db"], "--storage", "must be an SQLAlchemy URL"),
        (
            ["--n-trials", "2", "--storage", "sqlite:///no/such/folder/x.db"],
            "--storage",
            "cannot open",
        ),
        (["--n-trials", "2", "--storage", "nosuchdb://host/x"], "--storage", "cannot open"),
        (
            ["--n-trials", "2", "--storage", "postgresql+psycopg2://tuner:secret@127.0.0.1:9/hpo"],
            "--storage",
            "cannot open postgresql+psycopg2://tuner:***@127.0.0.1:9/hpo",
        ),
    ],
    "--study-name": [
        (["--n-trials", "2", "--study-name", " "], "--study-name", "must be a non-empty name"),
        (["--study-name", "nosuch"], "--study-name", "no study 'nosuch'"),
    ],
    "--create-only": [
        (["--create-only"], "--create-only", "needs --n-trials N"),
        (["--n-trials", "2", "--create-only=yes"], "--create-only", "ignored explicit argument"),
    ],
    "--plots": [
        (["--n-trials", "2", "--plots", "a-file"], "--plots", "is a file; give a folder"),
        (["--n-trials", "2", "--study-name", "clash"], "--plots", "clash-plots is a file"),
    ],
    "--no-plots": [
        (["--n-trials", "2", "--no-plots", "--plots", "out"], "--no-plots", "can't be combined"),
        (["--n-trials", "2", "--no-plots=1"], "--no-plots", "ignored explicit argument"),
    ],
    "--device": [
        (["--n-trials", "2", "--device", "bogus"], "--device", "'bogus' is not a device"),
        (["--n-trials", "2", "--device", CUDA_MISSING], "--device", CUDA_MISSING),
        (["--n-trials", "2", "--device", "mps"], "--device", "'mps' is not supported"),
        (["mine.yaml", "--n-trials", "2", "--device", "cpu"], "--device", "cpu is for the digits"),
    ],
    "--timeout": [
        (["--n-trials", "2", "--timeout", "0"], "--timeout", "must be a number of seconds > 0"),
        (["--n-trials", "2", "--timeout", "-5"], "--timeout", "must be a number of seconds > 0"),
        (["--n-trials", "2", "--timeout", "nan"], "--timeout", "must be a number of seconds > 0"),
        (["--n-trials", "2", "--timeout", "soon"], "--timeout", "must be a number of seconds > 0"),
    ],
    "--no-progress": [
        (["--n-trials", "2", "--no-progress=1"], "--no-progress", "ignored explicit argument")
    ],
    "--allow-space-change": [
        (["--n-trials", "2", "--allow-space-change=1"], "--allow-space-change", "ignored explicit")
    ],
    "unknown": [(["--n-trials", "2", "--bogus"], "--bogus", "not an argument")],
}

# config -> (field, words of what is allowed); each is written as tune.yaml
BAD_CONFIGS: dict[str, tuple[dict, str, str]] = {
    "seed -1": ({**GOOD, "study": {"seed": -1}}, "study.seed", "from 0 to 2**32 - 1"),
    "seed 2**32": ({**GOOD, "study": {"seed": 2**32}}, "study.seed", "from 0 to 2**32 - 1"),
    "objective os:system": (
        {**GOOD, "objective": "os:system"},
        "objective",
        "must be a function objective(trial",
    ),
    "objective a class": ({**GOOD, "objective": "mine:Objective"}, "objective", "is a class"),
    "objective a module attribute": ({**GOOD, "objective": "os:sep"}, "objective", "is a str"),
    "4 objectives": (
        {
            "objective": "mine:objective",
            "study": {"directions": ["minimize"] * 4, "pruner": None},
            "search_space": SPACE,
        },
        "study.directions",
        "at most 3 objectives",
    ),
    "2 objectives, median pruner": (
        {
            "objective": "mine:two",
            "study": {"directions": ["minimize"] * 2, "pruner": "median"},
            "search_space": SPACE,
        },
        "study.pruner",
        "must be null for a multi-objective study",
    ),
    "digits metric twice": (
        {"study": {"objectives": ["val_loss", "val_loss"]}, "search_space": SPACE},
        "study.objectives",
        "names each metric once",
    ),
    "step larger than the range": (
        {"search_space": {"h": {"type": "int", "low": 1, "high": 4, "step": 8}}},
        "search_space.h.step",
        "must be at most high - low = 3",
    ),
    "float step larger than the range": (
        {"search_space": {"x": {**SPACE["x"], "step": 2.0}}},
        "search_space.x.step",
        "must be at most high - low",
    ),
    "grid over a continuous float": (
        {"study": {"sampler": "grid"}, "search_space": SPACE},
        "search_space.x",
        "a grid search needs 'choices' or a 'step'",
    ),
}


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory with a good config, your objective's module and its config."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(GOOD))
    (tmp_path / "mine.py").write_text(MINE)
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({**GOOD, "objective": "mine:objective"}))
    (tmp_path / "a-file").write_text("not a folder")
    (tmp_path / "clash-plots").write_text("not a folder")
    (tmp_path / "folder").mkdir()
    yield tmp_path
    sys.modules.pop("mine", None)


def _listing(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if "__pycache__" not in p.parts}


def _fails_with_one_line(folder: Path, argv: list[str], field: str, allowed: str) -> str:
    before = _listing(folder)
    stderr = io.StringIO()
    assert run_command(main, argv, stderr=stderr) == 2, argv
    text = stderr.getvalue()
    assert (
        text.count("\n") == 1 and text.startswith(f"error: {field}: ") and "Traceback" not in text
    ), text
    assert allowed in text, text
    assert "secret" not in text
    assert _listing(folder) == before, f"{argv} created {_listing(folder) - before}"
    return text


def test_every_option_has_a_bad_value() -> None:
    """A new option without a bad value here fails this test."""
    options = {
        action.option_strings[0] if action.option_strings else action.dest
        for action in build_parser()._actions
        if action.dest != "help"
    }
    assert options == set(BAD_ARGUMENTS) - {"unknown"}


CASES = [
    (option, argv, field, allowed)
    for option, cases in BAD_ARGUMENTS.items()
    for argv, field, allowed in cases
]


@pytest.mark.parametrize(
    "option, argv, field, allowed", CASES, ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES]
)
def test_a_bad_value_of_each_option_is_one_line_and_creates_nothing(
    folder: Path, option: str, argv: list[str], field: str, allowed: str
) -> None:
    if argv[0].startswith("!"):  # the config itself
        argv = [argv[0][1:], "--n-trials", "2"]
    elif not argv[0].endswith(".yaml"):
        argv = ["tune.yaml", *argv]
    _fails_with_one_line(folder, argv, field, allowed)


@pytest.mark.parametrize("name", list(BAD_CONFIGS))
def test_a_bad_config_is_one_line_and_creates_nothing(folder: Path, name: str) -> None:
    data, field, allowed = BAD_CONFIGS[name]
    (folder / "bad.yaml").write_text(yaml.safe_dump(data))
    _fails_with_one_line(folder, ["bad.yaml", "--n-trials", "2"], field, allowed)


def _trials(folder: Path, name: str) -> list[tuple[int, str]]:
    storage = open_storage(f"sqlite:///{folder / (name + '.db')}")
    return [
        (t.number, t.state.name) for t in optuna.load_study(study_name=name, storage=storage).trials
    ]


@pytest.mark.parametrize("worker", [False, True], ids=["top-up", "worker"])
def test_a_config_whose_directions_differ_from_the_stored_study_runs_nothing(
    folder: Path, worker: bool
) -> None:
    """A maximizing config against a minimize study of the same name (the issue's 0.105-accuracy
    "best")."""
    assert (
        run_command(main, ["tune.yaml", "--n-trials", "2", "--create-only", "--study-name", "same"])
        == 0
    )
    before = _trials(folder, "same")
    (folder / "max.yaml").write_text(
        yaml.safe_dump(
            {"study": {"name": "same", "objectives": ["val_accuracy"]}, "search_space": SPACE}
        )
    )
    text = _fails_with_one_line(
        folder,
        ["max.yaml", *([] if worker else ["--n-trials", "4"])],
        "study.objectives",
        "must match the stored study 'same'",
    )
    assert "['minimize']" in text and "['maximize']" in text
    assert _trials(folder, "same") == before and not any(state == "COMPLETE" for _, state in before)


def test_two_directions_against_a_one_direction_study_runs_nothing(folder: Path) -> None:
    """Today: 2 trials, both FAIL, exit 0."""
    assert run_command(main, ["mine.yaml", "--n-trials", "2", "--create-only"]) == 0
    before = _trials(folder, "mine")
    (folder / "two.yaml").write_text(
        yaml.safe_dump(
            {
                "objective": "mine:two",
                "study": {
                    "name": "mine",
                    "directions": ["minimize", "maximize"],
                    "sampler": "random",
                },
                "search_space": SPACE,
            }
        )
    )
    _fails_with_one_line(
        folder, ["two.yaml"], "study.directions", "which has directions ['minimize']"
    )
    assert _trials(folder, "mine") == before and not any(state == "COMPLETE" for _, state in before)


def test_an_objective_that_returns_too_few_values_stops_at_once_and_loses_no_slot(
    folder: Path,
) -> None:
    """Found only when it returns: the worker stops at its first trial, which is queued again."""
    (folder / "short.yaml").write_text(
        yaml.safe_dump(
            {
                "objective": "mine:objective",
                "study": {"directions": ["minimize", "maximize"], "sampler": "random"},
                "search_space": SPACE,
            }
        )
    )
    stderr = io.StringIO()
    assert run_command(main, ["short.yaml", "--n-trials", "3", "--no-progress"], stderr=stderr) == 2
    assert stderr.getvalue().startswith(
        "error: study.directions: has 2 directions, but mine:objective returned 1 value\n"
    ), stderr.getvalue()
    from trainopt.hpo import budget_trials

    study = optuna.load_study(
        study_name="short", storage=open_storage(f"sqlite:///{folder / 'short.db'}")
    )
    kept = budget_trials(study)
    assert not [t for t in kept if t.state.is_finished()], "no slot is spent"
    assert [t.state.name for t in study.trials if t not in kept] == [
        "FAIL"
    ]  # the stopped trial, queued again
    assert not (folder / "short-plots").exists()


def test_the_command_itself_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    """The real process, for the mistakes that reach furthest: a device and a seed."""
    (tmp_path / "tune.yaml").write_text(yaml.safe_dump(GOOD))
    (tmp_path / "seed.yaml").write_text(yaml.safe_dump({**GOOD, "study": {"seed": -1}}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for argv, field in [
        (["tune.yaml", "--device", CUDA_MISSING], "--device"),
        (["seed.yaml"], "study.seed"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "trainopt.hpo", *argv, "--n-trials", "2"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 2 and result.stdout == "", result
        assert result.stderr.startswith(f"error: {field}: ") and result.stderr.count("\n") == 1, (
            result.stderr
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed.yaml", "tune.yaml"]
