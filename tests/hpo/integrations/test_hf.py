"""Tuning a Hugging Face Trainer run: the page's config loads and builds, its commands keep an exact
budget over 2 workers."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
from extras import require
from optuna.trial import TrialState

require("transformers", "hf")

from trainopt.hpo import load_hpo_config, open_storage  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "guides" / "training-optimization" / "use-with-your-trainer.md"
CONFIG = "../../../src/trainopt/data/hpo_trainer.yaml"


def console_blocks() -> list[list[str]]:
    """The commands (``$ `` lines, prompt removed, continued lines joined) of each console block of
    the page."""
    blocks = re.findall(r"^```console\n(.*?)^```", PAGE.read_text(), flags=re.M | re.S)
    joined = [re.sub(r"\\\n\s*", "", block) for block in blocks]
    return [[line[2:] for line in block.splitlines() if line.startswith("$ ")] for block in joined]


def test_the_page_includes_the_shipped_config_which_loads_and_builds() -> None:
    assert f"```{{literalinclude}} {CONFIG}\n" in PAGE.read_text()
    config = load_hpo_config(PAGE.parent / CONFIG)
    assert config.objective == "trainopt.hpo.integrations.hf:trainer_objective"
    assert (
        config.name == "trainer"
        and config.pruner == "median"
        and config.directions == ("minimize",)
    )
    assert callable(config.make_objective())
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert (
        set(config.space) | set(config.fixed) <= fields
    )  # the objective passes them to TrainingArguments


def test_hpo_and_its_trainer_integration_import_transformers_only_when_called() -> None:
    code = (
        "import sys, trainopt.hpo, trainopt.hpo.integrations.hf\n"
        f"trainopt.hpo.load_hpo_config({str(PAGE.parent / CONFIG)!r})\n"
        "print('transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.split()[-1] == "False"


def test_the_pages_commands_run_exactly_the_budget_over_two_workers_and_prune(
    tmp_path: Path,
) -> None:
    [commands] = [
        block for block in console_blocks() if any("hpo_trainer.yaml" in c for c in block)
    ]
    assert commands[0] == "python -m trainopt.data hpo_trainer.yaml > hpo_trainer.yaml"
    assert commands[1].endswith("--create-only") and commands[-1] == "wait"
    workers = [c for c in commands[2:-1] if c.startswith("python -m trainopt.hpo")]
    assert len(workers) == 2 and sum(c.endswith("&") for c in workers) == 1, (
        "two workers run at once"
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    result = subprocess.run(
        ["bash", "-c", "set -e\n" + "\n".join(commands)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    n_trials = int(commands[1].split("--n-trials ")[1].split()[0])
    study = optuna.load_study(
        study_name="trainer", storage=open_storage(f"sqlite:///{tmp_path / 'trainer.db'}")
    )
    trials = study.get_trials(deepcopy=False)
    states = [t.state for t in trials]
    assert len(trials) == n_trials and set(states) == {TrialState.COMPLETE, TrialState.PRUNED}, (
        states
    )
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    # pruned at an evaluation (every eval_steps), on the eval_loss the callback reported there
    assert all(t.user_attrs["reason"].startswith("pruned at step ") for t in pruned)
    assert all(max(t.intermediate_values) % 10 == 0 for t in pruned)
    assert all(
        sorted(t.intermediate_values) == [10, 20, 30]
        for t in trials
        if t.state == TrialState.COMPLETE
    )
    assert len({t.user_attrs["worker"] for t in trials}) == 2, "both workers ran trials"
    assert (tmp_path / "trainer-plots" / "trainer-history.png").exists()
