"""The worker loop: run a study's budget through ``study.optimize``, one claimed trial at a time.

Every trial runs inside Optuna's own ``study.optimize``, with all of its safety nets: the
heartbeat thread, failing the trials of dead workers before each claim, ``study.stop()``, and
the bookkeeping of pruned and failed trials. What a worker adds is the budget: it claims a trial
only within the study's budget (see :func:`trainopt.hpo.storage.waiting_trials_only`), and while
other workers' trials still run it waits, naming them, so that it can take over the trial of a
worker that dies. The wait is bounded: a trial silent for twice the heartbeat is failed and
queued again. A worker whose own trial was taken for dead goes on with the next one; one that
is interrupted (Ctrl-C) queues its trial again, so the budget loses no slot.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning, UpdateFinishedTrialError
from optuna.trial import TrialState

from trainopt.hpo.reporter import TrialDiverged
from trainopt.hpo.space import SearchSpace, check_space_unchanged
from trainopt.hpo.storage import (
    RETRY_ATTR,
    WORKER_ATTR,
    BudgetSpent,
    FreshRetry,
    check_claims_are_safe,
    heartbeat_interval,
    waiting_trials_only,
    worker_name,
)

Objective = Callable[[optuna.Trial, dict[str, Any]], "float | Sequence[float]"]
"""What a study tunes: ``objective(trial, params) -> value or values``."""

_log = logging.getLogger(__name__)


def run_trial(trial: optuna.Trial, space: SearchSpace, objective: Objective) -> float | list[float]:
    """Run ``objective`` on one trial of ``study.optimize``: suggest ``space``, call, check the
    result.

    A pruned trial (``optuna.TrialPruned``) and a diverged one (``TrialDiverged``, or values
    that are not finite) get a ``reason`` user attribute; a diverged one returns NaN, which
    Optuna records as FAIL, and the study goes on. Any other exception is recorded as FAIL with
    its reason, then raised: it is a bug.

    Example:
        >>> import optuna
        >>> from trainopt.hpo import SearchSpace, run_trial
        >>> study = optuna.create_study()
        >>> space = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
        >>> diverges = lambda trial, params: float("inf")
        >>> study.optimize(lambda trial: run_trial(trial, space, diverges), n_trials=1)
        >>> study.trials[0].state.name, study.trials[0].user_attrs["reason"]
        ('FAIL', 'diverged: the objective returned [inf]')
    """
    if (
        trial.user_attrs.get(WORKER_ATTR) != worker_name()
    ):  # a trial created by a claim has it already
        trial.set_user_attr(WORKER_ATTR, worker_name())
    try:
        result = objective(trial, space.suggest(trial))
    except optuna.TrialPruned as exc:
        trial.set_user_attr("reason", str(exc) or "pruned")
        raise
    except TrialDiverged as exc:
        trial.set_user_attr("reason", str(exc))
        return [math.nan] * len(trial.study.directions)
    except BaseException as exc:
        trial.set_user_attr("reason", f"{type(exc).__name__}: {exc}")
        raise
    try:
        values = [float(v) for v in (result if isinstance(result, (list, tuple)) else [result])]
    except (TypeError, ValueError):
        error = TypeError(
            f"the objective must return a number or a list of numbers, got {result!r}"
        )
        trial.set_user_attr("reason", f"TypeError: {error}")
        raise error from None
    if not all(math.isfinite(v) for v in values):
        trial.set_user_attr("reason", f"diverged: the objective returned {values}")
        return [math.nan] * len(values)  # Optuna records NaN as FAIL (it would keep an infinity)
    return values if len(values) > 1 else values[0]


def run_worker(
    study: optuna.Study,
    space: SearchSpace,
    objective: Objective,
    show_progress_bar: bool = False,
    reseed: bool = False,
    timeout: float | None = None,
    allow_space_change: bool = False,
) -> dict[str, int]:
    """Run trials of ``study`` until its budget is spent; return this worker's counts by final
    state.

    Many processes, on many machines, may run this on the same storage at once: together they
    run the study's budget exactly. The study must come from :func:`~trainopt.hpo.create_study`
    or be loaded with a storage from :func:`~trainopt.hpo.open_storage`; any other storage is
    refused (its claims could race). With heartbeats on, a worker that finds nothing to claim
    waits while other trials run, and logs which: if their worker dies, the trial is failed
    once it has been silent for twice the heartbeat (counted from its start if it never beat),
    queued again, and this worker runs it.

    A trial that another worker took for dead while it ran (this process missed its heartbeats:
    a paused or overloaded machine) is left to its retry, and the worker goes on. An interrupt
    (``KeyboardInterrupt``, ``SystemExit``) queues the trial it stopped again, then propagates.

    Args:
        study: The study.
        space: The search space.
        objective: ``objective(trial, params) -> value or values``.
        show_progress_bar: Show a tqdm bar of the trials left in the budget.
        reseed: Reseed the sampler (for a sampler of your own: one from
            :func:`~trainopt.hpo.make_sampler` is seeded per trial already).
        timeout: Claim no trial, and wait for none, after this many seconds.
        allow_space_change: Go on with a ``space`` that differs from the one the study's
            trials were drawn from; else that raises a ``ConfigError`` before any trial (see
            :func:`~trainopt.hpo.space.check_space_unchanged`).

    Example:
        >>> from trainopt.hpo import SearchSpace, create_study, run_worker
        >>> study = create_study("doc-worker", 3, ":memory:", sampler="random", pruner=None)
        >>> space = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
        >>> run_worker(study, space, lambda trial, params: params["x"])
        {'COMPLETE': 3, 'PRUNED': 0, 'FAIL': 0}
        >>> run_worker(study, space, lambda trial, params: params["x"])  # the budget is spent
        {'COMPLETE': 0, 'PRUNED': 0, 'FAIL': 0}
    """
    storage = check_claims_are_safe(study)
    check_space_unchanged(
        space, study.get_trials(deepcopy=False), study.study_name, allow_change=allow_space_change
    )
    beat = heartbeat_interval(storage)
    if reseed:
        study.sampler.reseed_rng()
    counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
    bar = None
    if show_progress_bar:
        from tqdm.auto import tqdm

        from trainopt.hpo.claims import trials_to_run

        bar = tqdm(total=trials_to_run(study), desc=study.study_name, unit="trial")

    def count(state: str) -> None:
        counts[state] += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(counts)

    deadline = math.inf if timeout is None else time.monotonic() + timeout
    waited_for: set[int] = set()
    current: dict[str, Any] = {}
    try:
        while time.monotonic() < deadline:
            current.clear()
            try:
                with waiting_trials_only():
                    study.optimize(
                        partial(_tracked, current=current, space=space, objective=objective),
                        n_trials=1,
                    )
                count(current["state"])
            except BudgetSpent:
                running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if beat is None or not running:
                    break
                _log_the_wait(running, beat, waited_for)
                time.sleep(max(0.0, min(beat, 5, deadline - time.monotonic())))
            except Exception as error:
                if not _taken_for_dead(study, current, error):
                    raise
    except (KeyboardInterrupt, SystemExit) as stop:
        _queue_again(study, current.get("number"))
        if isinstance(stop, _Interrupted):
            raise stop.interrupt from None
        raise
    finally:
        if bar is not None:
            bar.close()
    return counts


class _Interrupted(SystemExit):
    """A Ctrl-C in the objective, carried past Optuna (which catches ``KeyboardInterrupt``, records
    the trial as FAIL and logs it) to :func:`run_worker`, which queues the trial again and raises
    it."""

    def __init__(self, interrupt: KeyboardInterrupt) -> None:
        super().__init__(130)
        self.interrupt = interrupt


def _tracked(
    trial: optuna.Trial, current: dict[str, Any], space: SearchSpace, objective: Objective
) -> float | list[float]:
    """:func:`run_trial`, noting the trial's number, how it ends (without reading it back from the
    storage), and the exception the objective raised, if any."""
    current.update(number=trial.number, state="FAIL")
    try:
        result = run_trial(trial, space, objective)
    except optuna.TrialPruned:
        current["state"] = "PRUNED"
        raise
    except KeyboardInterrupt as interrupt:  # Optuna would log it as a failure, with its traceback
        raise _Interrupted(interrupt) from None
    except BaseException as error:
        current["raised"] = error
        raise
    values = result if isinstance(result, list) else [result]
    if len(values) == len(trial.study.directions) and not any(math.isnan(v) for v in values):
        current["state"] = "COMPLETE"
    return result


def _log_the_wait(running: list[optuna.trial.FrozenTrial], beat: int, waited_for: set[int]) -> None:
    """Say, once per trial, which running trials this worker waits for, and for how long at most."""
    new = [t for t in running if t.number not in waited_for]
    if new:
        waited_for.update(t.number for t in new)
        names = ", ".join(f"#{t.number} ({t.user_attrs.get('worker', 'claimed')})" for t in new)
        _log.warning(
            "nothing left to claim; waiting for trial %s to finish, or to be silent for %d s "
            "and run again here",
            names,
            2 * beat,
        )


def _taken_for_dead(study: optuna.Study, current: dict[str, Any], error: Exception) -> bool:
    """Whether ``error`` came from recording a trial that another worker had failed as stale
    meanwhile.

    That happens when this worker missed its heartbeats for the grace period (a paused machine,
    an overloaded one): the trial was taken for dead and queued again. Optuna then can't tell the
    trial (``Cannot tell a FAIL trial.``), whether the objective returned or raised. An error the
    objective raised, re-raised by Optuna after it recorded the trial as FAIL itself, is a bug.
    """
    number = current.get("number")
    if number is None or error is current.get("raised"):
        return False
    trial = study._storage.get_trial(
        study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    )
    if trial.state != TrialState.FAIL:
        return False
    _log.warning(
        "trial %d was failed as stale while it ran (missed heartbeats); it is queued again", number
    )
    return True


def _queue_again(study: optuna.Study, number: int | None) -> None:
    """Fail the trial ``number`` that an interrupt stopped, if it still runs, and queue a copy in
    its place."""
    if number is None:
        return
    storage = study._storage
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    if storage.get_trial(trial_id).state == TrialState.RUNNING:
        try:
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:
            pass
    trials = study.get_trials(deepcopy=False)
    if trials[number].state != TrialState.FAIL or any(
        t.system_attrs.get(RETRY_ATTR) is not None
        and t.system_attrs.get("retry_history", [])[-1:] == [number]
        for t in trials
    ):
        return  # it ended, or it is queued again already
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        FreshRetry()(study, trials[number])
    _log.info("trial %d was interrupted; it is queued again", number)  # the command line says so
