"""Plain ``study.optimize`` on a trainopt study, in several processes (issue 22, requirement 9).

What the page says: ``optimize(n_trials=N)`` runs N trials in each process whatever the budget;
``MaxTrialsCallback``, counting finished trials (COMPLETE, PRUNED and FAIL), still overshoots,
since it counts only after a trial; inside ``waiting_trials_only()`` the storage refuses any trial
beyond the budget and ``optimize`` stops with ``BudgetSpent``: exact.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
from optuna.study import MaxTrialsCallback
from optuna.trial import TrialState

from trainopt.hpo import budget_trials, create_study, open_storage

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
WORKER = textwrap.dedent("""
    import sys
    import time

    import optuna

    from trainopt.hpo import open_storage
    from trainopt.hpo.storage import BudgetSpent, waiting_trials_only

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url, n_trials, exact = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "exact"
    study = optuna.load_study(study_name="plain", storage=open_storage(url, heartbeat=None))

    def objective(trial):
        time.sleep(0.05)
        return trial.suggest_float("x", 0.0, 1.0)

    if exact:
        with waiting_trials_only():
            try:
                study.optimize(objective, n_trials=n_trials)
            except BudgetSpent:
                pass
    else:
        study.optimize(objective, n_trials=n_trials)
""")


def _run_workers(
    tmp_path: Path, budget: int, n_trials: int, mode: str, workers: int = 2
) -> list[TrialState]:
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    create_study("plain", budget, url, sampler="random", pruner=None, heartbeat=None)
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    processes = [
        subprocess.Popen(
            [sys.executable, "worker.py", url, str(n_trials), mode],
            cwd=tmp_path,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(workers)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=180)
        assert process.returncode == 0, stderr
    study = optuna.load_study(study_name="plain", storage=open_storage(url, heartbeat=None))
    assert len(budget_trials(study)) <= len(study.trials)
    return [t.state for t in study.trials]


def test_plain_optimize_in_each_process_runs_its_own_n_trials_past_the_budget(
    tmp_path: Path,
) -> None:
    states = _run_workers(tmp_path, budget=3, n_trials=3, mode="plain")
    assert states == [TrialState.COMPLETE] * 6  # 2 processes x 3 trials, on a budget of 3


def test_plain_optimize_inside_waiting_trials_only_keeps_the_budget_exactly(tmp_path: Path) -> None:
    states = _run_workers(tmp_path, budget=6, n_trials=50, mode="exact")
    assert states == [TrialState.COMPLETE] * 6


def test_max_trials_callback_counts_after_a_trial_so_a_worker_overshoots() -> None:
    """Two workers, in slow motion: one holds a trial while the other's callback counts."""
    study = create_study("callback", 2, ":memory:", sampler="random", pruner=None)
    held = study.ask()  # the other worker's trial, still running
    study.optimize(
        lambda trial: trial.suggest_float("x", 0.0, 1.0),
        n_trials=10,
        callbacks=[MaxTrialsCallback(2, states=FINISHED)],
    )
    study.tell(held, 0.5)
    assert len(study.get_trials(states=FINISHED)) == 3  # a budget of 2
    # by default it counts COMPLETE trials only: pruned and failed ones would not count at all
    assert inspect.signature(MaxTrialsCallback).parameters["states"].default == (
        TrialState.COMPLETE,
    )
