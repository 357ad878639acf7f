"""Studies on Optuna: samplers, pruners, and an exact trial budget shared by any number of workers.

The budget of a study is a number kept with it: :func:`create_study` sets it (or raises it);
:func:`~trainopt.hpo.workers.run_worker` claims one trial at a time, and the storage creates a
trial only while the study holds fewer than its budget (see :mod:`trainopt.hpo.storage`), so
however many workers share the storage, the study runs exactly ``n_trials`` trials.
(``MaxTrialsCallback`` alone overshoots: each worker checks the count after its trial, so
workers that finish together all start one more; see optuna/optuna#3518.) A trial whose worker
died is failed and queued again; it doesn't count (:func:`budget_trials`). Each trial's sampler
is seeded from the study's seed and the trial's number (:mod:`trainopt.hpo.seeds`): a resumed
study draws new points, and the same ones in every run.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from trainopt.hpo.claims import budget_of, budget_trials, set_budget, trials_to_run  # noqa: F401
from trainopt.hpo.seeds import TrialSeededSampler
from trainopt.hpo.space import SearchSpace, _config_error, check_space_unchanged
from trainopt.hpo.storage import open_storage
from trainopt.hpo.workers import Objective, run_worker
from trainopt.validation import check_int

SAMPLERS = ("qmc", "tpe", "random", "grid", "gp")
PRUNERS = ("median", "successive-halving", "hyperband", "none")

_log = logging.getLogger(__name__)


def make_sampler(
    name: str, seed: int | None = None, space: SearchSpace | None = None
) -> optuna.samplers.BaseSampler:
    """The sampler called ``name``.

    - ``"qmc"``: scrambled Sobol points: quasi-random search, to explore a new space evenly.
      The study keeps the count of points drawn, so a resumed study goes on along the sequence.
    - ``"tpe"``: tree-structured Parzen estimator: Bayesian optimization, to exploit. With
      ``constant_liar=True`` (Optuna 5's default, not 4's, so set here) the trials other
      workers are still running count as bad results, so that workers asking at the same time
      don't all get points near the current best.
    - ``"gp"``: Gaussian-process Bayesian optimization (needs ``torch`` and ``scipy``).
    - ``"random"``: independent uniform draws.
    - ``"grid"``: every combination of ``space`` (each parameter needs choices or a step).

    With a ``seed``, ``"tpe"``, ``"gp"`` and ``"random"`` are each a
    :class:`~trainopt.hpo.seeds.TrialSeededSampler`: seeded afresh for each trial from
    ``(seed, trial number)``, so that no trial replays another's numbers, in this run or the next.
    (The QMC sequence and the grid never repeat a point: the study records the points drawn.)

    Example:
        >>> from trainopt.hpo import make_sampler
        >>> type(make_sampler("qmc", seed=0)).__name__, make_sampler("tpe", seed=0)
        ('QMCSampler', TrialSeededSampler(TPESampler, seed=0))
    """
    if isinstance(seed, bool) or not (seed is None or isinstance(seed, int) and 0 <= seed < 2**32):
        raise _config_error(
            "study.seed", f"must be an int from 0 to 2**32 - 1, or null, got {seed!r}"
        )
    if name == "qmc":
        with warnings.catch_warnings():  # experimental since Optuna 3.0; stable enough here
            warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.QMCSampler(
                qmc_type="sobol", scramble=True, seed=seed, warn_independent_sampling=False
            )
    build = _builder(name, space)
    if (
        seed is None or name == "grid"
    ):  # the grid visits each point once, in an order its seed shuffles
        return build(seed)
    return TrialSeededSampler(build, seed)


def _builder(
    name: str, space: SearchSpace | None
) -> Callable[[int | None], optuna.samplers.BaseSampler]:
    if name == "tpe":
        return lambda seed: optuna.samplers.TPESampler(
            seed=seed, multivariate=True, constant_liar=True
        )
    if name == "random":
        return lambda seed: optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        if space is None:
            raise _config_error("study.sampler", "'grid' needs the search space")
        grid = space.grid()
        return lambda seed: optuna.samplers.GridSampler(grid, seed=seed)
    if name == "gp":
        missing = [m for m in ("torch", "scipy") if not _importable(m)]
        if missing:
            raise _config_error(
                "study.sampler", f"'gp' needs {missing} installed; use 'tpe' instead"
            )
        return lambda seed: optuna.samplers.GPSampler(seed=seed)
    raise _config_error("study.sampler", f"must be one of {list(SAMPLERS)}, got {name!r}")


def grid_size(space: SearchSpace) -> int:
    """How many points the grid sampler's grid of ``space`` has.

    Example:
        >>> from trainopt.hpo.space import SearchSpace
        >>> from trainopt.hpo.study import grid_size
        >>> grid_size(SearchSpace.from_dict({"a": {"type": "categorical", "choices": [1, 2, 3]},
        ...                                  "b": {"type": "int", "low": 0, "high": 4, "step": 2}}))
        9
    """
    return math.prod(len(values) for values in space.grid().values())


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def make_pruner(
    name: str | None, n_startup_trials: int = 4, n_warmup_steps: int = 0
) -> optuna.pruners.BasePruner:
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
    if (
        isinstance(n_warmup_steps, bool)
        or not isinstance(n_warmup_steps, int)
        or n_warmup_steps < 0
    ):
        raise _config_error(
            "study.prune_after", f"must be a non-negative int, got {n_warmup_steps!r}"
        )
    if name in (None, "none"):
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=n_startup_trials, n_warmup_steps=n_warmup_steps
        )
    if name == "successive-halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=n_warmup_steps or "auto")
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=n_warmup_steps or 1)
    raise _config_error("study.pruner", f"must be one of {list(PRUNERS)} or null, got {name!r}")


def create_study(
    study_name: str,
    n_trials: int,
    storage: str | Path | BaseStorage | None = None,
    *,
    directions: Sequence[str] = ("minimize",),
    sampler: str = "tpe",
    pruner: str | optuna.pruners.BasePruner | None = "median",
    seed: int | None = 0,
    space: SearchSpace | None = None,
    heartbeat: int | None = 60,
    allow_space_change: bool = False,
) -> optuna.Study:
    """Create (or load) a study and raise its budget to ``n_trials`` trials in all.

    Run it once per study, or from every worker at once: the budget is the largest
    ``n_trials`` given, and no trial is created until a worker claims it. Then start any number
    of :func:`~trainopt.hpo.workers.run_worker` processes on the same storage. Calling it again
    with a larger ``n_trials`` extends a finished study. With the grid sampler, the budget is
    capped at the grid's size: a larger one would only repeat points.

    Args:
        study_name: Name of the study in the storage.
        n_trials: Total number of trials the study should hold (finished, running or to run),
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
        allow_space_change: Go on with a ``space`` that differs from the one the stored
            study's trials were drawn from (see
            :func:`~trainopt.hpo.space.check_space_unchanged`); else that raises a
            ``ConfigError`` before the budget changes.

    Example:
        >>> from trainopt.hpo import create_study
        >>> from trainopt.hpo.storage import budget_of
        >>> study = create_study("doc", 3, ":memory:", sampler="random")
        >>> budget_of(study), len(study.trials)  # the trials are created as workers claim them
        (3, 0)
    """
    check_int("n_trials", n_trials, 1)
    for direction in directions:
        if direction not in ("minimize", "maximize"):
            raise _config_error(
                "study.directions", f"entries must be 'minimize' or 'maximize', got {direction!r}"
            )
    if not isinstance(pruner, optuna.pruners.BasePruner):
        pruner = make_pruner(pruner)
    if len(directions) > 1 and not isinstance(pruner, optuna.pruners.NopPruner):
        raise _config_error(
            "study.pruner",
            f"must be null for a multi-objective study (Optuna can't "
            f"prune one), got {type(pruner).__name__}",
        )
    made = make_sampler(sampler, seed, space)
    if sampler == "grid" and space is not None and n_trials > grid_size(space):
        _log.warning(
            "the grid has %d points: the budget is capped at %d trials, not %d",
            grid_size(space),
            grid_size(space),
            n_trials,
        )
        n_trials = grid_size(space)
    if not isinstance(storage, BaseStorage):
        storage = open_storage(storage or f"sqlite:///{study_name}.db", heartbeat)
    study = optuna.create_study(
        study_name=study_name,
        storage=storage,
        load_if_exists=True,
        directions=list(directions),
        sampler=made,
        pruner=pruner,
    )
    if space is not None:
        check_space_unchanged(
            space, study.get_trials(deepcopy=False), study_name, allow_change=allow_space_change
        )
    set_budget(study, n_trials)
    return study


def tune(
    objective: Objective,
    space: SearchSpace,
    n_trials: int,
    *,
    study_name: str = "trainopt",
    storage: str | Path | None = None,
    directions: Sequence[str] = ("minimize",),
    sampler: str = "tpe",
    pruner: str | optuna.pruners.BasePruner | None = "median",
    seed: int | None = 0,
    show_progress_bar: bool = False,
    heartbeat: int | None = 60,
    allow_space_change: bool = False,
) -> optuna.Study:
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
        >>> study = tune(lambda trial, params: (params["x"] - 0.3) ** 2, space, 8,
        ...              storage=":memory:", sampler="qmc", pruner=None)
        >>> len(study.trials), study.best_value < 0.01
        (8, True)
    """
    study = create_study(
        study_name,
        n_trials,
        storage,
        directions=directions,
        sampler=sampler,
        pruner=pruner,
        seed=seed,
        space=space,
        heartbeat=heartbeat,
        allow_space_change=allow_space_change,
    )
    run_worker(
        study,
        space,
        objective,
        show_progress_bar=show_progress_bar,
        allow_space_change=allow_space_change,
    )
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
        raise ValueError(
            f"isolation needs a single-objective study, got {len(study.directions)} objectives"
        )
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
    """A short text summary of the budget's trials by state and of the best trial (or the Pareto
    front).

    Trials run again after their worker died are counted apart, as ``retried``.

    Example:
        >>> from trainopt.hpo.study import best_trials_text
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
    n_trials = len(trials) + max(0, (budget_of(study) or 0) - len(trials))
    counts = {
        s.name: sum(t.state == s for t in trials)
        for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    }
    retried = len(study.get_trials(deepcopy=False)) - len(trials)
    lines = [
        f"study {study.study_name}: {n_trials} trials, "
        + ", ".join(f"{n} {k.lower()}" for k, n in counts.items())
        + (f"; {retried} more failed when their worker died, and ran again" if retried else "")
    ]
    if counts["COMPLETE"] == 0:
        return lines[0] + "\nno trial completed"
    best = [study.best_trial] if len(study.directions) == 1 else study.best_trials
    label = "best trial" if len(best) == 1 else f"Pareto front ({len(best)} trials)"
    lines.append(label + ":")
    for t in sorted(best, key=lambda t: t.values):
        values = ", ".join(f"{v:.4g}" for v in t.values)
        params = ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t.params.items()
        )
        lines.append(f"  #{t.number}: value {values} | {params}")
    return "\n".join(lines)
