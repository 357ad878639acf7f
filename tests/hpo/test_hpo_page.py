"""The hyperparameter-optimization page: its console blocks run (or parse), its YAML is the real
config."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
from optuna.trial import TrialState

from trainopt.hpo import load_hpo_config, open_storage
from trainopt.hpo.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "guides" / "training-optimization" / "hyperparameter-optimization.md"


def console_blocks() -> list[list[str]]:
    """The commands (``$ `` lines, prompt removed, continued lines joined) of each console block of
    the page."""
    blocks = re.findall(r"^```console\n(.*?)^```", PAGE.read_text(), flags=re.M | re.S)
    # a line ending in a backslash goes on in the next one, as in the shell
    joined = [re.sub(r"\\\n\s*", "", block) for block in blocks]
    return [[line[2:] for line in block.splitlines() if line.startswith("$ ")] for block in joined]


def console_block(containing: str) -> list[str]:
    """The one console block with a command that contains ``containing``."""
    found = [block for block in console_blocks() if any(containing in command for command in block)]
    assert len(found) == 1, (containing, found)
    return found[0]


def _run(commands: list[str], folder: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(
        ["bash", "-c", "set -e\n" + "\n".join(commands)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_page_shows_the_config_that_the_tests_load() -> None:
    text = PAGE.read_text()
    included = re.findall(r"```\{literalinclude\} (\S+)", text)
    # the cluster scripts are run and parsed by tests/hpo/test_hpo_cluster.py
    assert included == [
        "../../../src/trainopt/data/hpo_digits.yaml",
        "hpo-cluster/hpo-slurm.sh",
        "hpo-cluster/hpo-indexed-job.yaml",
    ]
    assert all((PAGE.parent / name).is_file() for name in included)
    config = load_hpo_config(PAGE.parent / included[0])
    assert config.name == "digits" and config.sampler == "tpe" and config.pruner == "median"


def test_single_machine_recipe_runs_and_ends_with_exactly_the_budget(tmp_path: Path) -> None:
    commands = console_block("--storage sqlite:///digits.db")
    assert commands[0] == "python -m trainopt.data hpo_digits.yaml > hpo_digits.yaml"
    assert commands[1].endswith("--create-only") and commands[-1] == "wait"
    assert sum(c.endswith("&") for c in commands) >= 1, "at least two workers run at once"
    result = _run(commands, tmp_path)
    assert result.returncode == 0, result.stderr
    n_trials = int(commands[1].split("--n-trials ")[1].split()[0])
    study = optuna.load_study(
        study_name="digits", storage=open_storage(f"sqlite:///{tmp_path / 'digits.db'}")
    )
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert len(states) == n_trials and all(
        s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states
    )
    assert (tmp_path / "digits-plots" / "digits-history.png").exists()
    # the create step and every worker print the study's summary (`wait` hides a worker's status)
    assert result.stdout.count(f"study digits: {n_trials} trials") == len(commands) - 2


def test_many_machines_recipe_parses_with_a_postgresql_url() -> None:
    commands = console_block("postgresql+psycopg2://")
    assert len(commands) == 2
    parser = build_parser()
    create, worker = (parser.parse_args(shlex.split(c)[3:]) for c in commands)
    assert create.create_only and create.n_trials and worker.n_trials is None
    assert create.storage == worker.storage and create.storage.startswith("postgresql+psycopg2://")
    assert create.config == worker.config == "hpo_digits.yaml"


def test_own_objective_recipe_runs_in_the_folder_of_the_module(tmp_path: Path) -> None:
    """The page writes ``my_train.py`` and ``my_tuning.yaml``; its command tunes them from their
    folder."""
    text = PAGE.read_text()
    written = r'\(project / "([\w.]+)"\)\.write_text\(\s*textwrap\.dedent\("""(.*?)"""\)\s*\)'
    files = dict(re.findall(written, text, flags=re.S))
    assert sorted(files) == ["my_train.py", "my_tuning.yaml"]
    for name, content in files.items():
        (tmp_path / name).write_text(textwrap.dedent(content))
    commands = console_block("my_tuning.yaml")
    result = _run(commands, tmp_path)
    assert result.returncode == 0, result.stderr
    n_trials = int(commands[0].split("--n-trials ")[1].split()[0])
    study = optuna.load_study(
        study_name="my_tuning", storage=open_storage(f"sqlite:///{tmp_path / 'my_tuning.db'}")
    )
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert len(states) == n_trials and all(
        s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states
    )
    assert f"study my_tuning: {n_trials} trials" in result.stdout
