"""What trainopt.hpo relies on in Optuna beyond its public API: each test fails if Optuna changes
under it.

trainopt.hpo.storage depends on four things Optuna doesn't promise (each isolated there, with a
comment that says why):

- ``Study._storage`` and ``_CachedStorage._backend``: the storage object a study holds
  (:func:`trainopt.hpo.storage.storage_of`);
- ``Study.ask()`` creates a trial from nothing only when no waiting trial is left, through the
  storage's ``create_new_trial`` (``RDBStorage._create_new_trial`` behind Optuna's cache, which
  builds the row in ``_get_prepared_new_trial`` while it holds the study's row lock): the exact
  budget counts the study's trials there;
- ``RDBStorage._get_stale_trial_ids`` and its ORM models (``TrialModel``,
  ``TrialHeartbeatModel``): trainopt's version counts a trial that never beat from its start;
- ``optuna.storages._heartbeat.BaseHeartbeat``: the heartbeat protocol that ``study.optimize``
  and ``fail_stale_trials`` drive, implemented for the journal file.

The pin in pyproject.toml is the range these tests ran on.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from importlib.metadata import version
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState
from packaging.specifiers import SpecifierSet

from trainopt.hpo import SearchSpace, create_study, open_storage, run_worker
from trainopt.hpo.storage import HEARTBEAT_ATTR, BudgetSpent, storage_of, waiting_trials_only

ROOT = Path(__file__).resolve().parents[2]
X = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
optuna.logging.set_verbosity(optuna.logging.WARNING)


def _url(kind: str, tmp_path: Path) -> str:
    urls = {
        "memory": ":memory:",
        "sqlite": f"sqlite:///{tmp_path}/c.db",
        "journal": f"journal:{tmp_path}/c.log",
    }
    return urls[kind]


def test_the_installed_optuna_is_in_the_pinned_range() -> None:
    pins = re.findall(r'"optuna([<>=!~][^"]*)"', (ROOT / "pyproject.toml").read_text())
    assert pins and len(set(pins)) == 1, pins
    assert version("optuna") in SpecifierSet(pins[0]), (version("optuna"), pins[0])


@pytest.mark.parametrize("kind", ["memory", "sqlite", "journal"])
def test_storage_of_finds_the_storage_a_study_was_given(kind: str, tmp_path: Path) -> None:
    storage = open_storage(_url(kind, tmp_path))
    assert storage_of(optuna.create_study(storage=storage)) is storage


def test_storage_of_sees_the_plain_storage_of_a_sqlite_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    create_study("plain", 2, url)
    storage = storage_of(optuna.load_study(study_name="plain", storage=url))
    assert type(storage) is optuna.storages.RDBStorage and str(storage.engine.url) == url


@pytest.mark.parametrize("kind", ["memory", "sqlite", "journal"])
def test_ask_claims_only_waiting_trials_while_the_budget_is_claimed(
    kind: str, tmp_path: Path
) -> None:
    study = create_study(
        "veto", 2, _url(kind, tmp_path), sampler="random", pruner=None, heartbeat=None
    )
    with waiting_trials_only():
        claimed = [study.ask().number, study.ask().number]
        with pytest.raises(BudgetSpent):
            study.ask()
        study.enqueue_trial({"x": 1.0})  # from a template: still allowed
    assert claimed == [0, 1] and [t.state for t in study.trials][:2] == [TrialState.RUNNING] * 2
    assert len(study.trials) == 3 and study.trials[2].state == TrialState.WAITING
    assert study.ask().number == 2 and study.ask().number == 3  # outside: ask() pops, then creates


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_optimize_drives_the_heartbeat_of_a_claimed_trial(kind: str, tmp_path: Path) -> None:
    study = create_study(
        "beats", 1, _url(kind, tmp_path), sampler="random", pruner=None, heartbeat=1
    )
    storage = storage_of(study)
    seen = []

    def objective(trial: optuna.Trial) -> float:
        time.sleep(
            1.5
        )  # the claim is the first beat; the thread's next one comes a heartbeat later
        seen.append(_last_beat(storage, study, trial))
        time.sleep(2.5)
        seen.append(_last_beat(storage, study, trial))
        return 0.0

    with waiting_trials_only():
        study.optimize(objective, n_trials=1)
    assert seen[0] is not None and seen[1] is not None and seen[1] > seen[0], seen


def test_rdb_storage_builds_a_new_trial_in_get_prepared_new_trial(tmp_path: Path) -> None:
    """The exact budget counts the study's trials in the transaction that creates one."""
    storage = open_storage(_url("sqlite", tmp_path), heartbeat=None)
    sessions = []
    original = type(storage)._get_prepared_new_trial

    def spy(self, study_id, template_trial, session):
        sessions.append(session)
        return original(self, study_id, template_trial, session)

    study = create_study("prepared", 1, storage, sampler="random", pruner=None)
    type(storage)._get_prepared_new_trial = spy
    try:
        with waiting_trials_only():
            claimed = study.ask()
            with pytest.raises(BudgetSpent):
                study.ask()
    finally:
        type(storage)._get_prepared_new_trial = original
    assert len(sessions) == 2 and all(isinstance(s, sqlalchemy.orm.Session) for s in sessions)
    assert claimed.user_attrs["worker"].endswith(f":{os.getpid()}")  # named in the same transaction


def _last_beat(storage, study: optuna.Study, trial: optuna.Trial) -> object:
    if isinstance(storage, optuna.storages.RDBStorage):
        with storage.engine.connect() as connection:
            return connection.exec_driver_sql(
                "SELECT heartbeat FROM trial_heartbeats WHERE trial_id = ?", (trial._trial_id,)
            ).scalar()
    return study.get_trials(deepcopy=False)[trial.number].system_attrs.get(HEARTBEAT_ATTR)


@pytest.mark.filterwarnings(
    "ignore:Heartbeat of storage is supposed to be used with Study.optimize"
)
@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_fail_stale_trials_fails_a_silent_trial_and_queues_it_again(
    kind: str, tmp_path: Path
) -> None:
    study = create_study(
        "stale", 2, _url(kind, tmp_path), sampler="random", pruner=None, heartbeat=1
    )
    with waiting_trials_only():
        lost = study.ask()  # claimed, and its worker "dies": no heartbeat after the claim's own
    lost.suggest_float("x", 0.0, 1.0)
    time.sleep(3.5)  # twice the heartbeat, and SQLite's clock counts whole seconds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
        trials = study.trials
        assert trials[lost.number].state == TrialState.FAIL
        retries = [
            t
            for t in trials
            if optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t)
            == lost.number
        ]
    assert (
        len(retries) == 1
        and retries[0].state == TrialState.WAITING
        and retries[0].params == lost.params
    )
    assert run_worker(study, X, lambda trial, params: params["x"]) == {
        "COMPLETE": 2,
        "PRUNED": 0,
        "FAIL": 0,
    }
    assert (
        study.trials[retries[0].number].params == lost.params
    )  # the retry ran the lost trial's params
