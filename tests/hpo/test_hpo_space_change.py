"""A resumed study whose config changed its search space is refused before any trial (issue 32).

Each case runs 2 trials with ``x`` in [0, 1], then resumes with a changed space. The command
prints one line naming the parameter and both distributions, exits with status 2 and adds no
trial, unless ``--allow-space-change`` (or ``allow_space_change=True``) is given; a change of
type Optuna can't hold in one study is refused even then, so it burns no trial of the budget.
"""

from __future__ import annotations

import io
from pathlib import Path

import optuna
import pytest
import yaml

from trainopt.config.cli import run_command
from trainopt.config.errors import ConfigError
from trainopt.hpo import SearchSpace, create_study, open_storage, run_worker
from trainopt.hpo.cli import main

X = {"type": "float", "low": 0.0, "high": 1.0}
Y = {"type": "int", "low": 1, "high": 4}
C = {"type": "categorical", "choices": ["a", "b"]}
FIRST = {"x": X, "y": Y, "c": C}

# case -> (changed space, the parameter the line names, words of the line, compatible)
CHANGES = {
    "a new range": ({**FIRST, "x": {**X, "high": 2.0}}, "x", "high=2.0", True),
    "a step": ({**FIRST, "x": {**X, "step": 0.25}}, "x", "step=0.25", True),
    "log scale": ({**FIRST, "x": {**X, "low": 1e-3, "log": True}}, "x", "log=True", False),
    "another type": ({**FIRST, "y": {**C, "choices": [1, 2]}}, "y", "Categorical", False),
    "other choices": ({**FIRST, "c": {**C, "choices": ["a", "c"]}}, "c", "'a', 'c'", False),
    "an added parameter": ({**FIRST, "z": X}, "z", "has no parameter 'z'", True),
    "a dropped parameter": ({"x": X, "c": C}, "y", "this config drops it", True),
}


def _config(folder: Path, space: dict, name: str = "tune.yaml") -> str:
    study = {"name": "tune", "sampler": "random", "pruner": None, "heartbeat": None}
    data = {"objective": "space_change_objective:objective", "study": study, "search_space": space}
    (folder / name).write_text(yaml.safe_dump(data))
    return name


def _trials(folder: Path) -> list[tuple[int, str]]:
    study = optuna.load_study(
        study_name="tune", storage=open_storage(f"sqlite:///{folder}/tune.db")
    )
    return [(t.number, t.state.name) for t in study.trials]


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A study of 2 complete trials drawn from ``FIRST``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "space_change_objective.py").write_text(
        "def objective(trial, params):\n    return params['x']\n"
    )
    argv = [_config(tmp_path, FIRST), "--n-trials", "2", "--no-plots", "--no-progress"]
    assert run_command(main, argv, stderr=io.StringIO()) == 0
    assert _trials(tmp_path) == [(0, "COMPLETE"), (1, "COMPLETE")]
    return tmp_path


@pytest.mark.parametrize("worker", [False, True], ids=["top-up", "worker"])
@pytest.mark.parametrize("case", list(CHANGES))
def test_a_changed_space_is_one_line_and_runs_no_trial(
    started: Path, case: str, worker: bool
) -> None:
    space, name, words, compatible = CHANGES[case]
    argv = [_config(started, space, "changed.yaml"), "--no-plots", "--no-progress"]
    argv += [] if worker else ["--n-trials", "4"]
    stderr = io.StringIO()
    assert run_command(main, argv, stderr=stderr) == 2
    line = stderr.getvalue()
    print(f"{case}: {line}", end="")
    assert line.count("\n") == 1 and line.startswith(f"error: search_space.{name}: "), line
    assert "the study 'tune' has " in line and words in line, line
    assert ("pass --allow-space-change to go on" in line) == compatible, line
    assert _trials(started) == [(0, "COMPLETE"), (1, "COMPLETE")], "no trial is created"
    # opting in goes on with a compatible change; an incompatible one is refused still
    stderr = io.StringIO()
    status = run_command(main, [*argv, "--allow-space-change"], stderr=stderr)
    if compatible:
        assert status == 0, stderr.getvalue()
        assert len(_trials(started)) == (2 if worker else 4)
    else:
        assert status == 2 and "Optuna can't hold both in one study" in stderr.getvalue()
        assert _trials(started) == [(0, "COMPLETE"), (1, "COMPLETE")], "no trial burnt"


def test_an_unchanged_space_resumes_and_so_does_one_allowed_once(started: Path) -> None:
    """After an allowed change the study's space is the new one: the next resume needs no flag."""
    assert run_command(main, ["tune.yaml", "--n-trials", "3", "--no-plots", "--no-progress"]) == 0
    wider = _config(started, {**FIRST, "x": {**X, "high": 2.0}}, "wider.yaml")
    flags = ["--no-plots", "--no-progress"]
    assert run_command(main, [wider, "--n-trials", "4", "--allow-space-change", *flags]) == 0
    assert run_command(main, [wider, "--n-trials", "5", *flags]) == 0
    assert [state for _, state in _trials(started)] == ["COMPLETE"] * 5


def test_the_python_api_refuses_a_changed_space_before_any_trial(tmp_path: Path) -> None:
    url = f"journal:{tmp_path}/api.log"
    space = SearchSpace.from_dict(FIRST)
    study = create_study("api", 2, url, sampler="random", pruner=None, space=space)
    run_worker(study, space, lambda trial, params: params["x"])
    dropped = SearchSpace.from_dict({"x": X, "c": C})
    with pytest.raises(ConfigError, match=r"search_space\.y: .*allow_space_change=True"):
        create_study("api", 4, url, sampler="random", pruner=None, space=dropped)
    loaded = optuna.load_study(study_name="api", storage=open_storage(url))
    with pytest.raises(ConfigError, match=r"search_space\.y: "):
        run_worker(loaded, dropped, lambda trial, params: params["x"])
    assert len(loaded.trials) == 2 and loaded.user_attrs == {}
    from trainopt.hpo.storage import budget_of

    assert budget_of(loaded) == 2, "a refused top-up doesn't raise the budget"
    study = create_study(
        "api", 3, url, sampler="random", pruner=None, space=dropped, allow_space_change=True
    )
    run_worker(study, dropped, lambda trial, params: params["x"], allow_space_change=True)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
