"""Studies on Optuna: samplers, pruners, and an exact trial budget shared by any number of workers.

The budget of a study is a queue of waiting trials. :func:`create_study` adds as many as the
study lacks; :func:`~trainopt.hpo.workers.run_worker` claims them one at a time and stops when
none is left, so however many workers share the storage, the study runs exactly ``n_trials``
trials. (``MaxTrialsCallback`` alone overshoots: each worker checks the count after its trial,
so workers that finish together all start one more; see optuna/optuna#3518.) A trial whose
worker died is failed and queued again; it doesn't count (:func:`budget_trials`).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from trainopt.hpo.space import SearchSpace, _config_error
from trainopt.hpo.storage import open_storage
from trainopt.hpo.workers import Objective, run_worker

SAMPLERS = ("qmc", "tpe", "random", "grid", "gp")
PRUNERS = ("median", "successive-halving", "hyperband", "none")


def make_sampler(name: str, seed: int | None = None,
                 space: SearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """The sampler called ``name``.

    - ``"qmc"``: scrambled Sobol points: quasi-random search, to explore a new space evenly.
    - ``"tpe"``: tree-structured Parzen estimator: Bayesian optimization, to exploit. With
      ``constant_liar=True`` (Optuna 5's default, not 4's, so set here) the trials other
      workers are still running count as bad results, so that workers asking at the same time
      don't all get points near the current best.
    - ``"gp"``: Gaussian-process Bayesian optimization (needs ``torch`` and ``scipy``).
    - ``"random"``: independent uniform draws.
    - ``"grid"``: every combination of ``space`` (each parameter needs choices or a step).

    Example:
        >>> from trainopt.hpo import make_sampler
        >>> type(make_sampler("qmc", seed=0)).__name__
        'QMCSampler'
    """
    if name == "qmc":
        with warnings.catch_warnings():  # experimental since Optuna 3.0; stable enough here
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(qmc_type="sobol", scramble=True, seed=seed,
                                              warn_independent_sampling=False)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if space is None:
            raise _config_error("study.sampler", "'grid' needs the search space")
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    if name == "gp":
        missing = [m for m in ("torch", "scipy") if not _importable(m)]
        if missing:
            raise _config_error("study.sampler", f"'gp' needs {missing} installed; use 'tpe' instead")
        return optuna.samplers.GPSampler(seed=seed)
    raise _config_error("study.sampler", f"must be one of {list(SAMPLERS)}, got {name!r}")


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def make_pruner(name: str | None, n_startup_trials: int = 4, n_warmup_steps: int = 0) -> optuna.pruners.BasePruner:
    """The pruner called ``name``: ``"median"``, ``"successive-halving"``, ``"hyperband"`` or none.

    Args:
        name: Pruner name, or ``None``/``"none"`` for no pruning.
        n_startup_trials: Trials the median pruner lets finish before it prunes any.
        n_warmup_steps: No trial is pruned before this step: a slow starter (a small learning
            rate, a long warm-up) gets a fair chance. For successive halving and Hyperband it
            is the first rung's budget (``min_resource``).

    Example:
        >>> from trainopt.hpo import make_pruner
        >>> type(make_pruner("hyperband")).__name__, type(make_pruner(None)).__name__
        ('HyperbandPruner', 'NopPruner')
    """
    if isinstance(n_warmup_steps, bool) or not isinstance(n_warmup_steps, int) or n_warmup_steps < 0:
        raise _config_error("study.prune_after", f"must be a non-negative int, got {n_warmup_steps!r}")
    if name in (None, "none"):
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=n_startup_trials, n_warmup_steps=n_warmup_steps)
    if name == "successive-halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=n_warmup_steps or "auto")
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=n_warmup_steps or 1)
    raise _config_error("study.pruner", f"must be one of {list(PRUNERS)} or null, got {name!r}")


def create_study(study_name: str, n_trials: int, storage: str | Path | BaseStorage | None = None, *,
                 directions: Sequence[str] = ("minimize",), sampler: str = "tpe",
                 pruner: str | optuna.pruners.BasePruner | None = "median", seed: int | None = 0,
                 space: SearchSpace | None = None, heartbeat: int | None = 60) -> optuna.Study:
    """Create (or load) a study and top its budget up to ``n_trials`` trials in all.

    Run it once per study; then start any number of :func:`~trainopt.hpo.workers.run_worker`
    processes on the same storage. Calling it again with a larger ``n_trials`` extends a
    finished study.

    Args:
        study_name: Name of the study in the storage.
        n_trials: Total number of trials the study should hold (finished, running or waiting),
            not counting those run again after their worker died.
        storage: Storage URL (see :func:`~trainopt.hpo.storage.open_storage`) or a storage it
            opened; default ``sqlite:///<study_name>.db``.
        directions: ``"minimize"`` or ``"maximize"`` per objective.
        sampler: Sampler name (see :func:`make_sampler`).
        pruner: Pruner name (see :func:`make_pruner`) or a pruner; must be none for several
            objectives.
        seed: Seed of the sampler.
        space: The search space (needed by the grid sampler).
        heartbeat: Seconds between heartbeats of a running trial, when ``storage`` is a URL
            (see :func:`~trainopt.hpo.storage.open_storage`).

    Example:
        >>> from trainopt.hpo import create_study
        >>> study = create_study("doc", 3, ":memory:", sampler="random")
        >>> [trial.state.name for trial in study.trials]
        ['WAITING', 'WAITING', 'WAITING']
    """
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ValueError(f"n_trials must be a positive int, got {n_trials=}")
    for direction in directions:
        if direction not in ("minimize", "maximize"):
            raise _config_error("study.directions", f"entries must be 'minimize' or 'maximize', got {direction!r}")
    if not isinstance(pruner, optuna.pruners.BasePruner):
        pruner = make_pruner(pruner)
    if len(directions) > 1 and not isinstance(pruner, optuna.pruners.NopPruner):
        raise _config_error("study.pruner", f"must be null for a multi-objective study (Optuna can't "
                            f"prune one), got {type(pruner).__name__}")
    if not isinstance(storage, BaseStorage):
        storage = open_storage(storage or f"sqlite:///{study_name}.db", heartbeat)
    study = optuna.create_study(
        study_name=study_name, storage=storage, load_if_exists=True, directions=list(directions),
        sampler=make_sampler(sampler, seed, space), pruner=pruner,
    )
    missing = n_trials - len(budget_trials(study))
    study.add_trials(optuna.trial.create_trial(state=TrialState.WAITING) for _ in range(missing))
    return study


def budget_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The trials that make up the study's budget: all but those queued again after their worker died.

    A trial whose worker stopped beating is failed, and Optuna's retry callback queues a copy;
    the copy takes its place in the budget.

    Example:
        >>> from trainopt.hpo import budget_trials, create_study
        >>> len(budget_trials(create_study("doc-budget", 4, ":memory:")))
        4
    """
    trials = study.get_trials(deepcopy=False)
    with warnings.catch_warnings():  # retry_history is experimental since Optuna 3.0
        warnings.simplefilter("ignore", ExperimentalWarning)
        replaced = {number for trial in trials for number in RetryHeartbeatStaleTrialCallback.retry_history(trial)}
    return [trial for trial in trials if trial.number not in replaced]


def tune(objective: Objective, space: SearchSpace, n_trials: int, *, study_name: str = "trainopt",
         storage: str | Path | None = None, directions: Sequence[str] = ("minimize",),
         sampler: str = "tpe", pruner: str | optuna.pruners.BasePruner | None = "median",
         seed: int | None = 0, show_progress_bar: bool = False, heartbeat: int | None = 60) -> optuna.Study:
    """Tune ``objective(trial, params)`` over ``space`` until the study holds ``n_trials`` trials.

    The study lives in ``storage`` (an SQLite file ``<study_name>.db`` by default): run
    ``tune`` again with the same name and a larger ``n_trials`` to resume, with the same or
    another sampler (explore with ``"qmc"``, then exploit with ``"tpe"``). The arguments are
    those of :func:`create_study`; this process is the study's one worker.

    Returns:
        The study; ``study.best_trial`` (one objective) or ``study.best_trials`` (the Pareto
        front of several).

    Example:
        >>> from trainopt.hpo import tune
        >>> from trainopt.hpo.space import SearchSpace
        >>> space = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
        >>> study = tune(lambda trial, params: (params["x"] - 0.3) ** 2, space, 8, storage=":memory:",
        ...              sampler="qmc", pruner=None)
        >>> len(study.trials), study.best_value < 0.01
        (8, True)
    """
    study = create_study(study_name, n_trials, storage, directions=directions, sampler=sampler,
                         pruner=pruner, seed=seed, space=space, heartbeat=heartbeat)
    run_worker(study, space, objective, show_progress_bar=show_progress_bar)
    return study


def isolation(study: optuna.Study, scientific: str) -> dict[Any, float]:
    """The best objective value for each value of the ``scientific`` hyperparameter.

    Every other tuned hyperparameter is a nuisance one, optimized away: for each value of
    ``scientific``, the best of the completed trials that used it (lowest or highest, by the
    study's direction). Plotted, this is the Tuning Playbook's isolation plot. Give the
    scientific hyperparameter a few discrete values (``categorical`` or ``step``), so that
    several trials share each one.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.study import isolation
        >>> study = optuna.create_study()
        >>> dist = {"wd": optuna.distributions.CategoricalDistribution([0.0, 0.1]),
        ...         "lr": optuna.distributions.FloatDistribution(1e-3, 1e-1)}
        >>> for wd, lr, loss in [(0.0, 1e-2, 0.5), (0.0, 1e-3, 0.4), (0.1, 1e-2, 0.3)]:
        ...     study.add_trial(optuna.trial.create_trial(
        ...         params={"wd": wd, "lr": lr}, distributions=dist, value=loss))
        >>> isolation(study, "wd")
        {0.0: 0.4, 0.1: 0.3}
    """
    if len(study.directions) > 1:
        raise ValueError(f"isolation needs a single-objective study, got {len(study.directions)} objectives")
    pick = min if study.direction == optuna.study.StudyDirection.MINIMIZE else max
    best: dict[Any, float] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if scientific in trial.params:
            value = trial.params[scientific]
            best[value] = pick(best.get(value, trial.value), trial.value)
    if not best:
        raise ValueError(f"no completed trial has the hyperparameter {scientific!r}")
    try:
        return dict(sorted(best.items()))
    except TypeError:  # choices of mixed types: keep the order the trials first used them in
        return best


def best_trials_text(study: optuna.Study) -> str:
    """A short text summary of the budget's trials by state and of the best trial (or the Pareto front).

    Trials run again after their worker died are counted apart, as ``retried``.

    Example:
        >>> from trainopt.hpo import best_trials_text
        >>> from trainopt.hpo import tune
        >>> from trainopt.hpo.space import SearchSpace
        >>> space = SearchSpace.from_dict({"x": {"type": "categorical", "choices": [1, 2]}})
        >>> study = tune(lambda trial, params: params["x"], space, 2, study_name="doc-text",
        ...              storage=":memory:",
        ...              sampler="grid", pruner=None)
        >>> print(best_trials_text(study))
        study doc-text: 2 trials, 2 complete, 0 pruned, 0 fail
        best trial:
          #...: value 1 | x=1
    """
    trials = budget_trials(study)
    counts = {s.name: sum(t.state == s for t in trials)
              for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    retried = len(study.get_trials(deepcopy=False)) - len(trials)
    lines = [f"study {study.study_name}: {len(trials)} trials, "
             + ", ".join(f"{n} {k.lower()}" for k, n in counts.items())
             + (f"; {retried} more failed when their worker died, and ran again" if retried else "")]
    if counts["COMPLETE"] == 0:
        return lines[0] + "\nno trial completed"
    best = [study.best_trial] if len(study.directions) == 1 else study.best_trials
    label = "best trial" if len(best) == 1 else f"Pareto front ({len(best)} trials)"
    lines.append(label + ":")
    for t in sorted(best, key=lambda t: t.values):
        values = ", ".join(f"{v:.4g}" for v in t.values)
        params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items())
        lines.append(f"  #{t.number}: value {values} | {params}")
    return "\n".join(lines)
