"""Storages that many workers can share: atomic claims, heartbeats, and a budget that can't grow.

:func:`open_storage` turns a URL into an Optuna storage that adds three things to Optuna's own:

- **No trial beyond the budget.** The budget is a number kept with the study
  (:func:`set_budget`). Inside :func:`waiting_trials_only`, ``study.ask()`` (and with it
  ``study.optimize``) claims a waiting trial (a dead worker's trial queued again, or one you
  enqueued) or creates one while the study holds fewer than its budget, in the same transaction
  that counts them; else it raises :class:`BudgetSpent`. A claim reads only the trials still
  unfinished, never the whole budget. Trials from a template (``study.add_trial``,
  ``enqueue_trial``, Optuna's retry of a dead worker's trial) are created as usual.
- **Heartbeats** on every storage that can share a study: Optuna's own on a relational
  database, the same protocol on a journal file. A running trial silent for twice the
  heartbeat is failed by the next worker that looks, and queued again (at most ``MAX_RETRIES``
  times). A trial that never beat counts from its start: a worker killed between its claim and
  its first heartbeat, or a plain ``study.ask()`` that never tells, holds no trial forever.
- **Atomic claims on SQLite**, which ignores ``SELECT ... FOR UPDATE``.
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat  # private: see _JournalStorage
from optuna.storages._rdb import models  # private: see _RDBStorage
from optuna.trial import FrozenTrial, TrialState

from trainopt.hpo.claims import (  # noqa: F401  (BudgetSpent and waiting_trials_only: imported from here too)
    BUDGET_ATTR,
    HEARTBEAT_ATTR,
    RETRY_ATTR,
    WORKER_ATTR,
    BudgetSpent,
    FreshRetry,
    _check_budget,
    _claiming,
    _claims,
    _count_in_memory,
    budget_of,
    set_budget,
    waiting_trials_only,
    worker_name,
)
from trainopt.hpo.space import _config_error

CLAIM_LOCK_GRACE = 30
"""Seconds a journal's budget lock may stay unchanged before a waiting worker takes it as left
by a dead worker and removes it (Optuna's ``JournalFileOpenLock`` grace period; a claim takes
far less)."""

_log = logging.getLogger(__name__)

MAX_RETRIES = 2
"""How many times a trial whose worker died is queued again (its params kept); then it stays
FAIL."""


def _now() -> datetime:
    """This worker's clock, aware and in UTC: what a trial's start and a journal's beats are read
    against (a test moves it forward instead of sleeping)."""
    return datetime.now(timezone.utc)


def _utc(moment: datetime) -> datetime:
    """``moment`` aware, in UTC. Optuna gives a trial's ``datetime_start`` naive, in this
    process's local time (whatever the storage keeps), so a naive datetime is read as local."""
    return moment.astimezone(timezone.utc)


class _ExactBudget:
    """Mixed into Optuna's storages by :func:`open_storage` (see the module docstring)."""


class _RDBStorage(_ExactBudget, optuna.storages.RDBStorage):
    """Why private API: Optuna creates a trial in ``RDBStorage._get_prepared_new_trial``, inside the
    transaction that holds the study's row lock (SQLite: the write lock): counting the study's
    trials there, through Optuna's ORM models, makes the claim atomic. Optuna's heartbeat check
    (``_get_stale_trial_ids``) skips trials that never beat; this one counts them from their
    start. tests/hpo/test_optuna_contract.py fails if either changes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._claimed_at: dict[int, float] = {}
        self._looked_at: dict[int, float] = {}

    def _create_new_trial(
        self, study_id: int, template_trial: FrozenTrial | None = None
    ) -> FrozenTrial:
        if not _claiming(template_trial):
            return super()._create_new_trial(study_id, template_trial)
        # One transaction counts the budget, creates the trial RUNNING and names its worker.
        claim = FrozenTrial(
            number=-1,
            state=TrialState.RUNNING,
            value=None,
            datetime_start=datetime.now(),
            datetime_complete=None,
            params={},
            distributions={},
            user_attrs={WORKER_ATTR: worker_name()},
            system_attrs={},
            intermediate_values={},
            trial_id=-1,
        )
        _claims.creating = True
        try:
            trial = super()._create_new_trial(study_id, claim)
        finally:
            _claims.creating = False
        self._claimed_at[trial._trial_id] = time.monotonic()
        return trial

    def record_heartbeat(self, trial_id: int) -> None:
        # The claim's start time is the trial's first heartbeat (see _get_stale_trial_ids): a
        # beat right after it would only cost one more transaction per trial.
        claimed = self._claimed_at.pop(trial_id, None)
        if claimed is None or time.monotonic() - claimed > self.heartbeat_interval / 2:
            super().record_heartbeat(trial_id)

    def _get_prepared_new_trial(
        self, study_id: int, template_trial: FrozenTrial | None, session: sqlalchemy.orm.Session
    ) -> Any:
        if getattr(_claims, "creating", False):
            trial, attr, study = (
                models.TrialModel,
                models.TrialSystemAttributeModel,
                models.StudySystemAttributeModel,
            )
            select, count = sqlalchemy.select, sqlalchemy.func.count
            trials, retries, budget = session.execute(
                select(  # one round trip
                    select(count())
                    .select_from(trial)
                    .where(trial.study_id == study_id)
                    .scalar_subquery(),
                    select(count())
                    .select_from(attr)
                    .join(trial, trial.trial_id == attr.trial_id)
                    .where(trial.study_id == study_id, attr.key == RETRY_ATTR)
                    .scalar_subquery(),
                    select(study.value_json)
                    .where(study.study_id == study_id, study.key == BUDGET_ATTR)
                    .scalar_subquery(),
                )
            ).one()
            _check_budget(None if budget is None else json.loads(budget), trials, retries)
        return super()._get_prepared_new_trial(study_id, template_trial, session)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        assert self.heartbeat_interval is not None
        # Optuna looks before every trial; once per half heartbeat is enough, and costs less
        now = time.monotonic()
        if now - self._looked_at.get(study_id, -math.inf) < self.heartbeat_interval / 2:
            return []
        self._looked_at[study_id] = now
        grace = timedelta(seconds=self.grace_period or 2 * self.heartbeat_interval)
        trial, beat = models.TrialModel, models.TrialHeartbeatModel
        session = self.scoped_session()
        try:
            now = (
                session.execute(sqlalchemy.func.now()).scalar().replace(tzinfo=None)
            )  # the beats' clock
            running = (
                session.query(trial, beat.heartbeat)
                .outerjoin(beat, beat.trial_id == trial.trial_id)
                .filter(trial.study_id == study_id, trial.state == TrialState.RUNNING)
                .all()
            )
            # A beat is the database's clock, read against that clock; a start is a worker's,
            # read against this worker's (never the one against the other: the database's is
            # UTC on SQLite and its session's time zone on PostgreSQL), both in UTC.
            local = _now()
            stale = [
                t.trial_id
                for t, last in running
                if (now - last if last is not None else local - _utc(t.datetime_start)) > grace
            ]
            session.commit()
        finally:
            session.close()
        return stale


class _InMemoryStorage(_ExactBudget, optuna.storages.InMemoryStorage):
    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        with self._lock:
            if _claiming(template_trial):
                _count_in_memory(self, study_id)
            return super().create_new_trial(study_id, template_trial)


class _JournalStorage(_ExactBudget, optuna.storages.JournalStorage, BaseHeartbeat):
    """A journal file with Optuna's heartbeat protocol (which Optuna implements for RDBStorage
    only).

    Why private: the protocol is ``optuna.storages._heartbeat.BaseHeartbeat``; ``study.optimize``
    and ``optuna.storages.fail_stale_trials`` drive any storage that implements it.
    tests/hpo/test_optuna_contract.py fails if Optuna stops doing so. A claim that creates a
    trial counts the study's trials under a lock, ``<journal>.budget.lock``: Optuna's
    ``JournalFileOpenLock``, a file created with ``open(O_CREAT | O_EXCL)``, which holds on NFS
    (v3 or later) and Lustre, where ``fcntl.flock`` may not. A lock left by a killed worker is
    removed once unchanged for :data:`CLAIM_LOCK_GRACE` seconds, as Optuna does for the journal.
    """

    def __init__(
        self,
        backend: Any,
        lock_path: str,
        heartbeat_interval: int | None = None,
        heartbeat_stale_trial_callback: Callable[[optuna.Study, FrozenTrial], None] | None = None,
    ) -> None:
        from optuna.storages.journal import JournalFileOpenLock

        super().__init__(backend)
        self.lock_path = lock_path
        self._claim_lock = JournalFileOpenLock(
            lock_path.removesuffix(".lock"), grace_period=CLAIM_LOCK_GRACE
        )
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_stale_trial_callback = heartbeat_stale_trial_callback

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        if not _claiming(template_trial):
            return super().create_new_trial(study_id, template_trial)
        self._claim_lock.acquire()  # waits; removes a lock unchanged for CLAIM_LOCK_GRACE s
        try:
            _count_in_memory(self, study_id)
            return super().create_new_trial(study_id, template_trial)
        finally:
            try:
                self._claim_lock.release()
            except RuntimeError:  # taken for a dead worker's lock after the grace period
                _log.warning(
                    "the budget lock %s was removed while this worker held it", self.lock_path
                )

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, _now().timestamp())
        except UpdateFinishedTrialError:
            pass  # another worker failed the trial as stale meanwhile; its tell will say so

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        assert self.heartbeat_interval is not None
        now, stale = _now().timestamp(), []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            # a trial that never beat counts from its claim (a retried one starts without its
            # predecessor's beats; see FreshRetry), in seconds since the epoch: UTC
            start = _utc(trial.datetime_start).timestamp()
            last = max(trial.system_attrs.get(HEARTBEAT_ATTR, 0.0), start)
            if now - last > 2 * self.heartbeat_interval:
                stale.append(trial._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int | None:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(
        self,
    ) -> Callable[[optuna.Study, FrozenTrial], None] | None:
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
    if heartbeat is not None and (
        isinstance(heartbeat, bool) or not isinstance(heartbeat, int) or heartbeat < 1
    ):
        raise _config_error(
            "study.heartbeat", f"must be a positive int (seconds) or null, got {heartbeat!r}"
        )
    url = str(url)
    beats: dict[str, Any] = {}
    if heartbeat is not None:
        with warnings.catch_warnings():  # experimental since Optuna 2.8, and what the budget needs
            warnings.simplefilter("ignore", ExperimentalWarning)
            beats = {
                "heartbeat_interval": heartbeat,
                "heartbeat_stale_trial_callback": FreshRetry(max_retry=MAX_RETRIES),
            }
    if url == ":memory:":
        return _InMemoryStorage()
    if url.startswith("journal:") or (url.endswith(".log") and "://" not in url):
        from optuna.storages.journal import JournalFileBackend

        path = url.removeprefix("journal:")
        return _JournalStorage(JournalFileBackend(path), f"{path}.budget.lock", **beats)
    if "://" not in url:
        raise _config_error(
            "storage",
            f"must be an SQLAlchemy URL (sqlite:///study.db, postgresql+psycopg2://...) "
            f"or a journal file (journal:study.log), got {url!r}",
        )
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
        >>> journal = open_storage("journal:/tmp/trainopt-doctest.log")
        >>> memory = open_storage(":memory:")
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
    """The study's storage, if it came from :func:`open_storage`; else a ``ValueError`` that says
    how.

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
            "trainopt.hpo.open_storage(url), e.g. optuna.load_study(study_name=..., "
            "storage=open_storage(url)), so that workers claim trials atomically, within the "
            "budget"
        )
    return storage
