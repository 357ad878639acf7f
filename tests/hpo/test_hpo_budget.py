"""The exact budget in one process: a dead worker's trial runs again, counts once, and never stops a
live worker."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from trainopt.hpo import (
    SearchSpace,
    budget_trials,
    create_study,
    open_storage,
    run_worker,
)
from trainopt.hpo.storage import storage_of, waiting_trials_only
from trainopt.hpo.study import best_trials_text

optuna.logging.set_verbosity(optuna.logging.ERROR)
X = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})


def _lose_a_trial(study: optuna.Study, clock) -> int:
    """Claim a trial as a worker would, and let it go silent: the worker clock moves 3 s ahead,
    past the journal's grace period (twice the heartbeat of 1 s), so the next look fails it."""
    with warnings.catch_warnings(), waiting_trials_only():
        warnings.simplefilter("ignore")  # ask() outside study.optimize on a storage with heartbeats
        lost = study.ask()
    clock.ahead = 3.0
    return lost.number


def test_a_top_up_counts_a_trial_run_again_once(tmp_path: Path, time_zone: str, clock) -> None:
    study = create_study(
        "topup", 3, f"journal:{tmp_path / 's.log'}", sampler="random", pruner=None, heartbeat=1
    )
    lost = _lose_a_trial(study, clock)
    counts = run_worker(
        study, X, lambda trial, params: params["x"], timeout=60
    )  # not waiting forever
    assert counts == {"COMPLETE": 3, "PRUNED": 0, "FAIL": 0}
    assert [t.state for t in study.trials].count(TrialState.FAIL) == 1 and len(study.trials) == 4
    study = create_study(
        "topup", 5, f"journal:{tmp_path / 's.log'}", sampler="random", pruner=None, heartbeat=1
    )
    assert run_worker(study, X, lambda trial, params: params["x"])["COMPLETE"] == 2, (
        "the lost one was replaced"
    )
    assert len(study.trials) == 6
    assert [t.number for t in budget_trials(study)] == [n for n in range(6) if n != lost]
    assert best_trials_text(study).startswith(
        "study topup: 5 trials, 5 complete, 0 pruned, 0 fail; "
        "1 more failed when their worker died, and ran again"
    )


def test_a_worker_whose_trial_was_taken_for_dead_goes_on(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = create_study("paused", 3, url, sampler="random", pruner=None)
    other = storage_of(optuna.load_study(study_name="paused", storage=open_storage(url)))

    def objective(trial: optuna.Trial, params: dict) -> float:
        if (
            trial.number == 0
        ):  # as another worker's fail_stale_trials does to a trial that missed its heartbeats
            assert other.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        return params["x"]

    counts = run_worker(study, X, objective)
    assert counts == {"COMPLETE": 2, "PRUNED": 0, "FAIL": 0}
    assert [t.state for t in study.trials] == [
        TrialState.FAIL,
        TrialState.COMPLETE,
        TrialState.COMPLETE,
    ]


def test_a_bug_after_the_trial_ended_is_still_raised(tmp_path: Path) -> None:
    study = create_study("bug", 2, f"sqlite:///{tmp_path / 's.db'}", sampler="random", pruner=None)

    def objective(trial: optuna.Trial, params: dict) -> object:
        return "not a number"

    with pytest.raises(
        TypeError, match="must return a number or a list of numbers, got 'not a number'"
    ):
        run_worker(study, X, objective)
    assert study.trials[0].state == TrialState.FAIL and study.trials[0].user_attrs[
        "reason"
    ].startswith("TypeError")
