"""Claims that can't hang, repeat or overrun, in one process: stale trials, seeds, the grid, the
cost of a claim.

Issue 22: a trial that never beat is stale 2x the heartbeat after its start (and not at 1.5x), on
SQLite, the journal file and PostgreSQL (``TRAINOPT_POSTGRES_URL``), in UTC and in Tokyo, with the
worker's clock moved forward rather than slept on (issue 31); a plain ``ask()`` on the
shared study holds no slot forever; resuming draws new points, reproducibly; a worker whose trial
was taken for dead goes on; the grid caps the budget; a claim costs the same at any budget.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
import warnings
from datetime import timedelta
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from optuna.storages._rdb import models  # the heartbeat's row, to age it
from optuna.trial import TrialState
from storages import storage_urls

from trainopt.hpo import SearchSpace, budget_trials, create_study, open_storage, run_worker, tune
from trainopt.hpo.storage import storage_of, waiting_trials_only

optuna.logging.set_verbosity(optuna.logging.ERROR)
X = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
# A heartbeat of a minute, and the worker's clock moved forward instead of a sleep: the trial is
# 90 s old (1.5x), then 150 s (2.5x), give or take the test's own run time, which would need to
# pass 30 s to cross the threshold of 120 s.
BEAT = 60


url = storage_urls("claims")


def _name() -> str:
    return f"claims-{uuid.uuid4().hex[:8]}"


def _state(url: str, name: str, number: int, heartbeat: int = BEAT) -> TrialState:
    """The trial's state after a fresh worker's look for stale trials (a new storage: no look
    skipped)."""
    study = optuna.load_study(study_name=name, storage=open_storage(url, heartbeat=heartbeat))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)
    return study.get_trials(deepcopy=False)[number].state


def test_a_trial_that_never_beat_is_stale_past_twice_the_heartbeat_not_at_one_and_a_half(
    url: str, time_zone: str, clock
) -> None:
    """The grace window on both sides: a threshold of 1x fails at 1.5x, one of 3x at 2.5x; in UTC
    and in Tokyo (a start read against a UTC clock as local time would be 9 hours off)."""
    name = _name()
    study = create_study(name, 2, url, sampler="random", pruner=None, heartbeat=BEAT)
    with waiting_trials_only(), warnings.catch_warnings():
        warnings.simplefilter(
            "ignore"
        )  # ask() outside study.optimize: a worker killed before its first beat
        claimed = study.ask()
    assert _state(url, name, claimed.number) == TrialState.RUNNING, "stale at once"
    clock.ahead = 1.5 * BEAT
    assert _state(url, name, claimed.number) == TrialState.RUNNING, "stale at 1.5x the heartbeat"
    clock.ahead = 2.5 * BEAT
    assert _state(url, name, claimed.number) == TrialState.FAIL, "not stale at 2.5x the heartbeat"
    retry = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.system_attrs.get("failed_trial") == claimed.number
    ]
    assert len(retry) == 1 and retry[0].state == TrialState.WAITING, "not queued again"


def _age_the_beat(url: str, study: optuna.Study, trial_id: int, seconds: float, clock) -> None:
    """Make the trial's last beat ``seconds`` older: a database's beat is on the database's clock
    (moved back in its row); a journal's is on the worker's clock (moved forward)."""
    if url.startswith("journal:"):
        clock.ahead += seconds
        return
    session = storage_of(study).scoped_session()
    try:
        beat = session.query(models.TrialHeartbeatModel).filter_by(trial_id=trial_id).one()
        beat.heartbeat = beat.heartbeat - timedelta(seconds=seconds)
        session.commit()
    finally:
        session.close()


def test_a_trial_silent_after_its_last_beat_is_stale_past_twice_the_heartbeat(
    url: str, time_zone: str, clock
) -> None:
    """The same window after a heartbeat (a database's clock counts whole seconds on SQLite): the
    beat, on the database's clock, is read against that clock, never against the worker's (SQLite
    keeps UTC: read as Tokyo's local time, a beat would be 9 hours old at once)."""
    name = _name()
    study = create_study(name, 1, url, sampler="random", pruner=None, heartbeat=BEAT)
    with waiting_trials_only(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        claimed = study.ask()
    clock.ahead = 2.5 * BEAT  # the start is old: only the beat keeps the trial alive
    storage = storage_of(study)
    getattr(storage, "_claimed_at", {}).clear()  # a real beat, not the claim's own (skipped)
    storage.record_heartbeat(claimed._trial_id)
    assert _state(url, name, claimed.number) == TrialState.RUNNING, "stale right after a beat"
    _age_the_beat(url, study, claimed._trial_id, 1.5 * BEAT, clock)
    assert _state(url, name, claimed.number) == TrialState.RUNNING, "stale at 1.5x the heartbeat"
    _age_the_beat(url, study, claimed._trial_id, 1.5 * BEAT, clock)
    assert _state(url, name, claimed.number) == TrialState.FAIL, "not stale at 3x the heartbeat"


def test_a_plain_ask_on_the_shared_study_holds_no_slot_forever(
    url: str, time_zone: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``optuna.load_study(...).ask()`` with a plain storage takes a trial and never tells it: a
    fresh worker waits for it (naming it), fails it once it is stale, and finishes the budget."""
    name = _name()
    create_study(name, 3, url, sampler="random", pruner=None, heartbeat=1)
    plain = (
        optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(url.removeprefix("journal:"))
        )
        if url.startswith("journal:")
        else url
    )
    rogue = optuna.load_study(study_name=name, storage=plain).ask()
    fresh = optuna.load_study(study_name=name, storage=open_storage(url, heartbeat=1))
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="trainopt.hpo.workers"):
        run_worker(fresh, X, lambda trial, params: params["x"], timeout=120)
    assert time.monotonic() - start < 60
    assert f"waiting for trial #{rogue.number}" in caplog.text
    budget = budget_trials(fresh)
    assert len(budget) == 3 and all(t.state in FINISHED for t in budget), [t.state for t in budget]
    assert fresh.get_trials(deepcopy=False)[rogue.number].state == TrialState.FAIL
    assert not fresh.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))


def test_a_second_tune_draws_new_points_and_the_same_as_one_run(tmp_path: Path) -> None:
    def params(study: optuna.Study) -> list[float]:
        return [t.params["x"] for t in sorted(study.trials, key=lambda t: t.number)]

    url = f"sqlite:///{tmp_path / 'twice.db'}"
    tune(
        lambda trial, p: p["x"],
        X,
        4,
        study_name="twice",
        storage=url,
        sampler="random",
        pruner=None,
    )
    twice = params(
        tune(
            lambda trial, p: p["x"],
            X,
            8,
            study_name="twice",
            storage=url,
            sampler="random",
            pruner=None,
        )
    )
    once = params(
        tune(
            lambda trial, p: p["x"],
            X,
            8,
            study_name="once",
            storage=f"sqlite:///{tmp_path / 'once.db'}",
            sampler="random",
            pruner=None,
        )
    )
    assert len(set(twice)) == 8, "the second run replayed the first run's points"
    assert twice == once, "not reproducible from the seed"
    tpe = [
        tune(
            lambda trial, p: p["x"],
            X,
            n,
            study_name="tpe",
            storage=f"sqlite:///{tmp_path / 'tpe.db'}",
            sampler="tpe",
            pruner=None,
        )
        for n in (3, 6)
    ][-1]
    assert len(set(params(tpe))) == 6


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_worker_whose_trial_was_failed_while_it_reported_goes_on(
    kind: str, tmp_path: Path
) -> None:
    """The objective itself fails (its report is refused) once another worker failed the trial as
    stale."""
    url = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else f"journal:{tmp_path / 's.log'}"
    study = create_study("paused", 3, url, sampler="random", pruner=None)
    other = storage_of(optuna.load_study(study_name="paused", storage=open_storage(url)))

    def objective(trial: optuna.Trial, params: dict) -> float:
        if trial.number == 0:
            other.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        trial.report(params["x"], 0)  # raises UpdateFinishedTrialError on trial 0
        return params["x"]

    assert run_worker(study, X, objective) == {"COMPLETE": 2, "PRUNED": 0, "FAIL": 0}
    assert [t.state for t in study.trials] == [
        TrialState.FAIL,
        TrialState.COMPLETE,
        TrialState.COMPLETE,
    ]


def test_the_grid_caps_the_budget_at_its_size(caplog: pytest.LogCaptureFixture) -> None:
    grid = SearchSpace.from_dict({"x": {"type": "categorical", "choices": [1, 2, 3]}})
    with caplog.at_level(logging.WARNING, logger="trainopt.hpo.study"):
        study = tune(
            lambda trial, p: p["x"], grid, 9, storage=":memory:", sampler="grid", pruner=None
        )
    assert sorted(t.params["x"] for t in study.trials) == [1, 2, 3]
    assert "the grid has 3 points: the budget is capped at 3 trials, not 9" in caplog.text


def test_a_claim_costs_the_same_whatever_the_budget(tmp_path: Path) -> None:
    """A claim reads no trial left to run: 5 trials cost the same statements at a budget of 5 or
    100,000."""

    def statements(budget: int) -> collections.Counter:
        storage = open_storage(f"sqlite:///{tmp_path / f'{budget}.db'}")
        counts: collections.Counter = collections.Counter()
        sqlalchemy.event.listen(
            storage.engine,
            "before_cursor_execute",
            lambda conn, cursor, statement, *args: counts.update([statement.split()[0]]),
        )
        study = create_study("cost", budget, storage, sampler="random", pruner=None)
        counts.clear()
        with waiting_trials_only():
            for _ in range(5):
                study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
        return counts

    small, large = statements(5), statements(100_000)
    assert small == large and small["SELECT"] > 0
