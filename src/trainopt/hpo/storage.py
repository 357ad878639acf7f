"""Storages that many workers can share: atomic claims, heartbeats, and a budget that can't grow.

:func:`open_storage` turns a URL into an Optuna storage that adds three things to Optuna's own:

- **No trial beyond the budget.** Inside :func:`waiting_trials_only`, the storage refuses to
  create a trial from nothing, so ``study.ask()`` (and with it ``study.optimize``) can only claim
  a waiting trial, and raises :class:`BudgetSpent` when none is left. Trials from a template
  (``study.add_trial``, ``enqueue_trial``, Optuna's retry of a dead worker's trial) are created
  as usual.
- **Heartbeats** on every storage that can share a study: Optuna's own on a relational
  database, the same protocol on a journal file. A trial whose worker stopped beating for twice
  the heartbeat is failed by the next worker that looks, and queued again (at most
  ``MAX_RETRIES`` times). The first heartbeat is recorded in the claim itself.
- **Atomic claims on SQLite**, which ignores ``SELECT ... FOR UPDATE``.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat  # private: see _JournalStorage
from optuna.trial import FrozenTrial, TrialState

from trainopt.hpo.space import _config_error

MAX_RETRIES = 2
"""How many times a trial whose worker died is queued again (its params kept); then it stays FAIL."""

HEARTBEAT_ATTR = "trainopt:heartbeat"
"""The trial system attribute that holds a journal trial's last heartbeat (seconds since the epoch)."""

_claims = threading.local()


class BudgetSpent(Exception):
    """No waiting trial is left to claim: the study's budget is taken.

    Example:
        >>> from trainopt.hpo import create_study
        >>> from trainopt.hpo.storage import BudgetSpent, waiting_trials_only
        >>> study = create_study("doc-spent", 1, ":memory:", sampler="random", pruner=None)
        >>> with waiting_trials_only():
        ...     first = study.ask()
        ...     try:
        ...         study.ask()
        ...     except BudgetSpent as error:
        ...         print(error)
        no waiting trial is left in the study
        >>> len(study.trials)
        1
    """


@contextmanager
def waiting_trials_only() -> Iterator[None]:
    """In this thread, while active, a storage from :func:`open_storage` creates no trial from nothing.

    ``study.ask()`` then claims a waiting trial or raises :class:`BudgetSpent`: a worker that
    loses the race for the last waiting trial adds no trial to the study.

    Example:
        >>> from trainopt.hpo import create_study
        >>> from trainopt.hpo.storage import waiting_trials_only
        >>> study = create_study("doc-only", 2, ":memory:", sampler="random", pruner=None)
        >>> with waiting_trials_only():
        ...     [study.ask().number, study.ask().number]
        [0, 1]
    """
    previous = getattr(_claims, "waiting_only", False)
    _claims.waiting_only = True
    try:
        yield
    finally:
        _claims.waiting_only = previous


def _refuse_a_new_trial(template_trial: FrozenTrial | None) -> None:
    # Study.ask() creates a trial from nothing only when it found no waiting trial to claim.
    if template_trial is None and getattr(_claims, "waiting_only", False):
        raise BudgetSpent("no waiting trial is left in the study")


class _ExactBudget:
    """Mixed into Optuna's storages by :func:`open_storage` (see the module docstring)."""

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        _refuse_a_new_trial(template_trial)
        return super().create_new_trial(study_id, template_trial)  # type: ignore[misc]

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Any = None) -> bool:
        claimed = super().set_trial_state_values(trial_id, state, values)  # type: ignore[misc]
        # Optuna's heartbeat thread starts only once the sampler has set the trial up; a worker
        # killed before that would leave a trial that never goes stale.
        if claimed and state == TrialState.RUNNING and heartbeat_interval(self) is not None:
            self.record_heartbeat(trial_id)  # type: ignore[attr-defined]
        return claimed


class _RDBStorage(_ExactBudget, optuna.storages.RDBStorage):
    """Why private API: Optuna wraps an RDBStorage in its ``_CachedStorage``, which creates trials
    through ``RDBStorage._create_new_trial``. tests/hpo/test_optuna_contract.py fails if that changes."""

    def _create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> FrozenTrial:
        _refuse_a_new_trial(template_trial)
        return super()._create_new_trial(study_id, template_trial)


class _InMemoryStorage(_ExactBudget, optuna.storages.InMemoryStorage):
    pass


class _JournalStorage(_ExactBudget, optuna.storages.JournalStorage, BaseHeartbeat):
    """A journal file with Optuna's heartbeat protocol (which Optuna implements for RDBStorage only).

    Why private: the protocol is ``optuna.storages._heartbeat.BaseHeartbeat``; ``study.optimize``
    and ``optuna.storages.fail_stale_trials`` drive any storage that implements it.
    tests/hpo/test_optuna_contract.py fails if Optuna stops doing so.
    """

    def __init__(self, backend: Any, heartbeat_interval: int | None = None,
                 heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None] | None = None) -> None:
        super().__init__(backend)
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_stale_trial_callback = heartbeat_stale_trial_callback

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
        except UpdateFinishedTrialError:
            pass  # another worker failed the trial as stale meanwhile; its tell will say so

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        assert self.heartbeat_interval is not None
        now, stale = time.time(), []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(HEARTBEAT_ATTR)
            if beat is None:  # as RDBStorage: a trial that never beat is not stale
                continue
            # a retried trial copies its predecessor's attributes: the claim time counts too
            last = max(beat, trial.datetime_start.timestamp()) if trial.datetime_start else beat
            if now - last > 2 * self.heartbeat_interval:
                stale.append(self.get_trial_id_from_study_id_trial_number(study_id, trial.number))
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        return self.heartbeat_stale_trial_callback


def open_storage(url: str | Path, heartbeat: int | None = 60) -> BaseStorage:
    """An Optuna storage from a URL, ready for many workers (see the module docstring).

    - ``sqlite:///path.db``, ``postgresql+psycopg2://user:pw@host/db``, any SQLAlchemy URL:
      a relational database (:class:`optuna.storages.RDBStorage`);
    - ``journal:path.log`` or a path ending in ``.log``: an append-only journal file
      (:class:`optuna.storages.JournalStorage`), good for many workers on one file system;
    - ``:memory:``: in this process only (gone when it exits).

    Args:
        url: Where the study lives.
        heartbeat: Seconds between a running trial's heartbeats; a trial silent for twice as
            long is failed and run again. ``None``: no heartbeats (a dead worker's trial then
            stays RUNNING). Give every worker of a study the same setting.

    Example:
        >>> import optuna
        >>> from trainopt.hpo import open_storage
        >>> storage = open_storage("journal:/tmp/trainopt-doctest.log", heartbeat=30)
        >>> isinstance(storage, optuna.storages.JournalStorage), storage.get_heartbeat_interval()
        (True, 30)
    """
    if heartbeat is not None and (isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or heartbeat < 1):
        raise _config_error("study.heartbeat", f"must be a positive int (seconds) or null, got {heartbeat!r}")
    url = str(url)
    beats: dict[str, Any] = {}
    if heartbeat is not None:
        with warnings.catch_warnings():  # experimental since Optuna 2.8, and what the budget needs
            warnings.simplefilter("ignore", ExperimentalWarning)
            beats = {"heartbeat_interval": heartbeat,
                     "heartbeat_stale_trial_callback": RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRIES)}
    if url == ":memory:":
        return _InMemoryStorage()
    if url.startswith("journal:") or (url.endswith(".log") and "://" not in url):
        from optuna.storages.journal import JournalFileBackend

        return _JournalStorage(JournalFileBackend(url.removeprefix("journal:")), **beats)
    if "://" not in url:
        raise _config_error(
            "storage", f"must be an SQLAlchemy URL (sqlite:///study.db, postgresql+psycopg2://...) "
            f"or a journal file (journal:study.log), got {url!r}")
    engine_kwargs = None
    if url.startswith("sqlite:"):
        # isolation_level=None: the driver starts no transaction itself; _begin_immediate does.
        engine_kwargs = {"connect_args": {"timeout": 60, "isolation_level": None}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        storage = _RDBStorage(url, engine_kwargs=engine_kwargs, **beats)
    if url.startswith("sqlite:"):
        _begin_immediate(storage.engine)
    return storage


def _begin_immediate(engine: sqlalchemy.engine.Engine) -> None:
    """Start every SQLite transaction with ``BEGIN IMMEDIATE``, which takes the write lock.

    SQLite ignores ``SELECT ... FOR UPDATE``: two workers could both read a waiting trial,
    both mark it running, and both run it. Holding the write lock from the first read makes
    the claim's read-check-write atomic (PostgreSQL and MySQL lock the row instead).
    """

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin(connection: sqlalchemy.engine.Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def heartbeat_interval(storage: BaseStorage) -> int | None:
    """The storage's heartbeat in seconds, or ``None`` when it records none.

    Example:
        >>> from trainopt.hpo import open_storage
        >>> from trainopt.hpo.storage import heartbeat_interval
        >>> journal, memory = open_storage("journal:/tmp/trainopt-doctest.log"), open_storage(":memory:")
        >>> heartbeat_interval(journal), heartbeat_interval(memory)
        (60, None)
    """
    method = getattr(storage, "get_heartbeat_interval", None)
    return None if method is None else method()


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage object ``study`` reads and writes through (unwrapped from Optuna's cache).

    Why private API: Optuna has no public accessor for a study's storage (``Study._storage``),
    and it wraps an ``RDBStorage`` in its ``_CachedStorage`` (``._backend``). A worker needs the
    object to refuse a storage whose claims could race. tests/hpo/test_optuna_contract.py fails
    if Optuna changes either attribute.

    Example:
        >>> import optuna
        >>> from trainopt.hpo import open_storage
        >>> from trainopt.hpo.storage import storage_of
        >>> storage = open_storage(":memory:")
        >>> storage_of(optuna.create_study(storage=storage)) is storage
        True
    """
    storage = study._storage
    return storage._backend if isinstance(storage, optuna.storages._CachedStorage) else storage


def check_claims_are_safe(study: optuna.Study) -> BaseStorage:
    """The study's storage, if it came from :func:`open_storage`; else a ``ValueError`` that says how.

    A plain URL (``optuna.load_study(storage="sqlite:///...")``) gives a storage whose claims
    can race on SQLite and whose budget can grow: two workers could run the same trial.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.storage import check_claims_are_safe
        >>> try:
        ...     check_claims_are_safe(optuna.create_study())
        ... except ValueError as error:
        ...     print(str(error)[:70])
        the study's storage is a plain InMemoryStorage: open it with trainopt.
    """
    storage = storage_of(study)
    if not isinstance(storage, _ExactBudget):
        raise ValueError(
            f"the study's storage is a plain {type(storage).__name__}: open it with "
            f"trainopt.hpo.open_storage(url), e.g. optuna.load_study(study_name=..., "
            f"storage=open_storage(url)), so that workers claim trials atomically, within the budget")
    return storage
