"""The worker loop: run a study's waiting trials through ``study.optimize`` until none is left.

Every trial runs inside Optuna's own ``study.optimize``, with all of its safety nets: the
heartbeat thread, failing the trials of dead workers before each claim, ``study.stop()``, and
the bookkeeping of pruned and failed trials. What a worker adds is the budget: it claims only
the study's waiting trials (see :func:`trainopt.hpo.storage.waiting_trials_only`), and while
other workers' trials still run it waits, so that it can take over the trial of a worker that
dies.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import optuna
from optuna.trial import TrialState

from trainopt.hpo.reporter import TrialDiverged
from trainopt.hpo.space import SearchSpace
from trainopt.hpo.storage import BudgetSpent, check_claims_are_safe, heartbeat_interval, waiting_trials_only

Objective = Callable[[optuna.Trial, dict[str, Any]], "float | Sequence[float]"]
"""What a study tunes: ``objective(trial, params) -> value or values``."""

_log = logging.getLogger(__name__)


def run_trial(trial: optuna.Trial, space: SearchSpace, objective: Objective) -> float | list[float]:
    """Run ``objective`` on one trial of ``study.optimize``: suggest ``space``, call, check the result.

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
    trial.set_user_attr("worker", f"{os.uname().nodename}:{os.getpid()}")
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
        error = TypeError(f"the objective must return a number or a list of numbers, got {result!r}")
        trial.set_user_attr("reason", f"TypeError: {error}")
        raise error from None
    if not all(math.isfinite(v) for v in values):
        trial.set_user_attr("reason", f"diverged: the objective returned {values}")
        return [math.nan] * len(values)  # Optuna records NaN as FAIL (it would keep an infinity)
    return values if len(values) > 1 else values[0]


def run_worker(study: optuna.Study, space: SearchSpace, objective: Objective,
               show_progress_bar: bool = False, reseed: bool = False,
               stop: Callable[[], bool] | None = None) -> dict[str, int]:
    """Run waiting trials of ``study`` until none is left; return this worker's counts by final state.

    Many processes, on many machines, may run this on the same storage at once: together they
    run the study's budget exactly. The study must come from :func:`~trainopt.hpo.create_study`
    or be loaded with a storage from :func:`~trainopt.hpo.open_storage`; any other storage is
    refused (its claims could race). With heartbeats on, a worker that finds nothing to claim
    waits while other trials run: if their worker dies, the trial is failed after the grace
    period and queued again, and this worker runs it.

    Pass ``reseed=True`` in each worker so that workers built with the same seed don't draw
    the same random numbers (Optuna does the same for ``n_jobs``); QMC points still come from
    one shared sequence.

    ``stop`` is asked before each claim and while waiting: once it returns ``True`` the worker
    claims no more trials and returns (the command line's ``--timeout`` and SIGTERM).

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
    beat = heartbeat_interval(storage)
    if reseed:
        study.sampler.reseed_rng()
    counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
    bar = None
    if show_progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))),
                   desc=study.study_name, unit="trial")

    def count(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        counts[trial.state.name] += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(counts)

    current: dict[str, Any] = {}
    try:
        while stop is None or not stop():
            current.clear()
            try:
                with waiting_trials_only():
                    study.optimize(partial(_tracked, current=current, space=space, objective=objective),
                                   n_trials=1, callbacks=[count])
            except BudgetSpent:
                if beat is None or not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                    break
                time.sleep(min(beat, 5))
            except Exception:
                if not _failed_as_stale(study, current):
                    raise
    finally:
        if bar is not None:
            bar.close()
    return counts


def _tracked(trial: optuna.Trial, current: dict[str, Any], space: SearchSpace,
             objective: Objective) -> float | list[float]:
    """:func:`run_trial`, noting the trial and whether the objective ended by itself."""
    current["number"] = trial.number
    try:
        result = run_trial(trial, space, objective)
    except optuna.TrialPruned:
        current["ended"] = True
        raise
    current["ended"] = True
    return result


def _failed_as_stale(study: optuna.Study, current: dict[str, Any]) -> bool:
    """Whether Optuna could not record a trial that ended by itself because another worker failed it.

    That happens when this worker missed its heartbeats for the grace period (a paused machine,
    an overloaded one): the trial was taken for dead and queued again. The worker goes on.
    """
    if not current.get("ended"):
        return False
    trial = study.get_trials(deepcopy=False)[current["number"]]
    if trial.state != TrialState.FAIL:
        return False
    _log.warning("trial %d was failed as stale while it ran (missed heartbeats); it is queued again",
                 trial.number)
    return True
