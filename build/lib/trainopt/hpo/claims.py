"""The budget's side of a claim: how many trials a study may hold, and who may create one.

The budget of a study is a number kept with it (:func:`set_budget`). A worker claims trials
inside :func:`waiting_trials_only`: there, a storage from
:func:`~trainopt.hpo.storage.open_storage` creates a trial from nothing only while the study
holds fewer trials than its budget (counted in the transaction that creates it), and raises
:class:`BudgetSpent` otherwise.
"""

from __future__ import annotations

import copy
import os
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

HEARTBEAT_ATTR = "trainopt:heartbeat"
"""The trial system attribute that holds a journal trial's last heartbeat (seconds since the
epoch)."""

WORKER_ATTR = "worker"
"""The trial user attribute that names the worker that runs it: ``host:pid``."""

BUDGET_ATTR = "trainopt:n_trials"
"""The study system attribute that holds the budget: how many trials the study holds in all."""

RETRY_ATTR = "failed_trial"
"""The system attribute of a trial queued again in place of a failed one (Optuna's retry
callback)."""

_claims = threading.local()


class FreshRetry(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry callback, whose queued copy starts with fresh attributes.

    Optuna's copy keeps the failed trial's user attributes: a trial interrupted by Ctrl-C would
    complete with the ``reason`` of its interruption. The copy keeps what runs the same point
    again and what the budget counts: the params, their distributions and the system attributes
    (the retry history, a sampler's own), but not the failed trial's last heartbeat.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.claims import FreshRetry
        >>> study = optuna.create_study()
        >>> trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
        >>> trial.set_user_attr("reason", "KeyboardInterrupt: ")
        >>> study.tell(trial, state=optuna.trial.TrialState.FAIL)
        FrozenTrial(...)
        >>> FreshRetry()(study, study.trials[0])
        >>> queued = study.trials[1]
        >>> queued.state.name, queued.params == study.trials[0].params, queued.user_attrs
        ('WAITING', True, {})
    """

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        fresh = copy.copy(trial)
        fresh.user_attrs = {}
        fresh.system_attrs = {k: v for k, v in trial.system_attrs.items() if k != HEARTBEAT_ATTR}
        super().__call__(study, fresh)


class BudgetSpent(Exception):
    """No waiting trial is left to claim, and the study holds its whole budget.

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
        the study holds its budget of 1 trials, and none is waiting
        >>> len(study.trials)
        1
    """


@contextmanager
def waiting_trials_only() -> Iterator[None]:
    """In this thread, while active, a storage from :func:`open_storage` creates trials only within
    the budget.

    ``study.ask()`` then claims a waiting trial, or creates one if the study holds fewer trials
    than its budget, or raises :class:`BudgetSpent`: a worker that loses the race for the last
    trial adds no trial to the study.

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


def worker_name() -> str:
    """This process as a worker: ``host:pid``.

    Example:
        >>> import os
        >>> from trainopt.hpo.storage import worker_name
        >>> worker_name().endswith(f":{os.getpid()}")
        True
    """
    return f"{os.uname().nodename}:{os.getpid()}"


def _claiming(template_trial: FrozenTrial | None) -> bool:
    # Study.ask() creates a trial from nothing only when it found no waiting trial to claim.
    return template_trial is None and getattr(_claims, "waiting_only", False)


def _check_budget(budget: Any, trials: int, retries: int) -> None:
    """Raise :class:`BudgetSpent` unless the study (``trials`` in all, ``retries`` of them
    queued again in place of a failed one) holds fewer than ``budget`` trials."""
    if budget is None or trials - retries >= budget:
        raise BudgetSpent(
            f"the study holds its budget of {budget or 0} trials, and none is waiting"
        )


def _count_in_memory(storage: BaseStorage, study_id: int) -> None:
    trials = storage.get_all_trials(study_id, deepcopy=False)
    budget = storage.get_study_system_attrs(study_id).get(BUDGET_ATTR)
    _check_budget(budget, len(trials), sum(RETRY_ATTR in t.system_attrs for t in trials))


def set_budget(study: optuna.Study, n_trials: int) -> int:
    """Raise the study's budget to ``n_trials`` trials in all (never lower it); return the budget.

    Setting the same budget from many processes at once leaves it as set: a top-up is atomic,
    because no trial is created until a worker claims one (see :func:`waiting_trials_only`).

    Example:
        >>> import optuna
        >>> from trainopt.hpo.storage import set_budget
        >>> study = optuna.create_study()
        >>> set_budget(study, 8), set_budget(study, 4)
        (8, 8)
    """
    budget = max(n_trials, budget_of(study) or 0)
    study._storage.set_study_system_attr(study._study_id, BUDGET_ATTR, budget)
    return budget


def budget_of(study: optuna.Study) -> int | None:
    """The study's budget (trials in all, not counting those queued again), or ``None`` if it has
    none.

    Example:
        >>> from trainopt.hpo import create_study
        >>> from trainopt.hpo.storage import budget_of
        >>> budget_of(create_study("doc-budget-of", 6, ":memory:"))
        6
    """
    return study._storage.get_study_system_attrs(study._study_id).get(BUDGET_ATTR)


def budget_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The trials that make up the study's budget: all but those queued again after their worker
    died.

    A trial whose worker stopped beating (or was interrupted) is failed, and a copy is queued;
    the copy takes its place in the budget.

    Example:
        >>> from trainopt.hpo import SearchSpace, budget_trials, create_study, run_worker
        >>> study = create_study("doc-budget", 4, ":memory:", sampler="random", pruner=None)
        >>> space = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
        >>> _ = run_worker(study, space, lambda trial, params: params["x"])
        >>> len(budget_trials(study))
        4
    """
    trials = study.get_trials(deepcopy=False)
    with warnings.catch_warnings():  # retry_history is experimental since Optuna 3.0
        warnings.simplefilter("ignore", ExperimentalWarning)
        replaced = {
            number
            for trial in trials
            for number in RetryHeartbeatStaleTrialCallback.retry_history(trial)
        }
    return [trial for trial in trials if trial.number not in replaced]


def trials_to_run(study: optuna.Study) -> int:
    """How many trials the study's budget still holds: waiting ones, and those not yet created.

    Example:
        >>> from trainopt.hpo import create_study
        >>> from trainopt.hpo.claims import trials_to_run
        >>> study = create_study("doc-to-run", 4, ":memory:", sampler="random", pruner=None)
        >>> study.enqueue_trial({"x": 0.5})
        >>> trials_to_run(study)
        4
    """
    budget = budget_trials(study)
    waiting = sum(trial.state == TrialState.WAITING for trial in budget)
    return waiting + max(0, (budget_of(study) or 0) - len(budget))
