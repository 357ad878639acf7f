"""Studies on Optuna: samplers, pruners, storages, an exact trial budget and the worker loop.

The budget of a study is a queue of waiting trials. :func:`create_study` adds as many as the
study lacks; :func:`run_worker` claims them one at a time with the storage's atomic
compare-and-set (WAITING -> RUNNING) and stops when none is left. However many workers share
the storage, the study ends with exactly ``n_trials`` trials. (``MaxTrialsCallback`` alone
overshoots: each worker checks the count after its trial, so workers that finish together
all start one more; see optuna/optuna#3518.)
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import TrialState

from trainopt.hpo.reporter import TrialDiverged
from trainopt.hpo.space import SearchSpace, _config_error

SAMPLERS = ("qmc", "tpe", "random", "grid", "gp")
PRUNERS = ("median", "successive-halving", "hyperband", "none")
Objective = Callable[[optuna.Trial, dict[str, Any]], "float | Sequence[float]"]


def make_sampler(name: str, seed: int | None = None,
                 space: SearchSpace | None = None) -> optuna.samplers.BaseSampler:
    """The sampler called ``name``.

    - ``"qmc"``: scrambled Sobol points: quasi-random search, to explore a new space evenly.
    - ``"tpe"``: tree-structured Parzen estimator: Bayesian optimization, to exploit.
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
        return optuna.samplers.TPESampler(seed=seed, multivariate=True)
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


def open_storage(url: str | Path) -> optuna.storages.BaseStorage:
    """An Optuna storage from a URL.

    - ``sqlite:///path.db``, ``postgresql+psycopg2://user:pw@host/db``, any SQLAlchemy URL:
      a relational database (:class:`optuna.storages.RDBStorage`);
    - ``journal:path.log`` or a path ending in ``.log``: an append-only journal file
      (:class:`optuna.storages.JournalStorage`), good for many workers on one file system;
    - ``:memory:``: in this process only (gone when it exits).

    Example:
        >>> from trainopt.hpo import open_storage
        >>> type(open_storage("journal:/tmp/trainopt-doctest.log")).__name__
        'JournalStorage'
    """
    url = str(url)
    if url == ":memory:":
        return optuna.storages.InMemoryStorage()
    if url.startswith("journal:") or (url.endswith(".log") and "://" not in url):
        from optuna.storages.journal import JournalFileBackend

        path = url.removeprefix("journal:")
        return optuna.storages.JournalStorage(JournalFileBackend(path))
    if url.startswith("sqlite:"):
        # isolation_level=None: the driver starts no transaction itself; the listener below does.
        storage = optuna.storages.RDBStorage(
            url, engine_kwargs={"connect_args": {"timeout": 60, "isolation_level": None}})
        _begin_immediate(storage.engine)
        return storage
    if "://" in url:
        return optuna.storages.RDBStorage(url)
    raise _config_error(
        "storage", f"must be an SQLAlchemy URL (sqlite:///study.db, postgresql+psycopg2://...) "
        f"or a journal file (journal:study.log), got {url!r}"
    )


def _begin_immediate(engine: sqlalchemy.engine.Engine) -> None:
    """Start every SQLite transaction with ``BEGIN IMMEDIATE``, which takes the write lock.

    SQLite ignores ``SELECT ... FOR UPDATE``: two workers could both read a waiting trial,
    both mark it running, and both run it. Holding the write lock from the first read makes
    the claim's read-check-write atomic (PostgreSQL and MySQL lock the row instead).
    """

    @sqlalchemy.event.listens_for(engine, "begin")
    def _begin(connection: sqlalchemy.engine.Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def create_study(study_name: str, n_trials: int, storage: str | Path | None = None, *,
                 directions: Sequence[str] = ("minimize",), sampler: str = "tpe",
                 pruner: str | optuna.pruners.BasePruner | None = "median", seed: int | None = 0,
                 space: SearchSpace | None = None) -> optuna.Study:
    """Create (or load) a study and top its budget up to ``n_trials`` trials in all.

    Run it once per study; then start any number of :func:`run_worker` processes on the same
    storage. Calling it again with a larger ``n_trials`` extends a finished study.

    Args:
        study_name: Name of the study in the storage.
        n_trials: Total number of trials the study should hold (finished, running or waiting).
        storage: Storage URL (see :func:`open_storage`); default ``sqlite:///<study_name>.db``.
        directions: ``"minimize"`` or ``"maximize"`` per objective.
        sampler: Sampler name (see :func:`make_sampler`).
        pruner: Pruner name (see :func:`make_pruner`) or a pruner; must be none for several
            objectives.
        seed: Seed of the sampler.
        space: The search space (needed by the grid sampler).

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
    storage_obj = open_storage(storage or f"sqlite:///{study_name}.db")
    study = optuna.create_study(
        study_name=study_name, storage=storage_obj, load_if_exists=True, directions=list(directions),
        sampler=make_sampler(sampler, seed, space), pruner=pruner,
    )
    missing = n_trials - len(study.get_trials(deepcopy=False))
    for _ in range(max(missing, 0)):
        study.add_trial(optuna.trial.create_trial(state=TrialState.WAITING))
    return study


def _claim(study: optuna.Study) -> optuna.Trial | None:
    """Claim a waiting trial with the storage's compare-and-set; ``None`` when none is left."""
    storage = study._storage  # the study's own storage object: claims must go through it
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        try:
            if storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING):
                return optuna.Trial(study, frozen._trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def run_trial(study: optuna.Study, trial: optuna.Trial, space: SearchSpace, objective: Objective) -> TrialState:
    """Run ``objective`` on one claimed trial and record its outcome; return the final state.

    A pruned trial is recorded as PRUNED and a diverged one (``TrialDiverged``, or a returned
    value that is not finite) as FAIL, each with its ``reason`` user attribute; the study goes
    on. Any other exception is recorded as FAIL with its reason, then raised: it is a bug.

    Example:
        >>> import optuna
        >>> from trainopt.hpo import run_trial
        >>> from trainopt.hpo.space import SearchSpace
        >>> study = optuna.create_study()
        >>> space = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
        >>> run_trial(study, study.ask(), space, lambda trial, params: float("nan")).name
        'FAIL'
        >>> study.trials[0].user_attrs["reason"]
        'diverged: the objective returned [nan]'
    """
    trial.set_user_attr("worker", f"{os.uname().nodename}:{os.getpid()}")
    try:
        result = objective(trial, space.suggest(trial))
    except optuna.TrialPruned as exc:
        trial.set_user_attr("reason", str(exc) or "pruned")
        study.tell(trial, state=TrialState.PRUNED)
        return TrialState.PRUNED
    except TrialDiverged as exc:
        trial.set_user_attr("reason", str(exc))
        study.tell(trial, state=TrialState.FAIL)
        return TrialState.FAIL
    except BaseException as exc:
        trial.set_user_attr("reason", f"{type(exc).__name__}: {exc}")
        study.tell(trial, state=TrialState.FAIL)
        raise
    values = [float(v) for v in (result if isinstance(result, (list, tuple)) else [result])]
    if not all(math.isfinite(v) for v in values):
        trial.set_user_attr("reason", f"diverged: the objective returned {values}")
        study.tell(trial, state=TrialState.FAIL)
        return TrialState.FAIL
    study.tell(trial, values if len(values) > 1 else values[0])
    return TrialState.COMPLETE


def run_worker(study: optuna.Study, space: SearchSpace, objective: Objective,
               show_progress_bar: bool = False, reseed: bool = False) -> dict[str, int]:
    """Run waiting trials of ``study`` until none is left; return counts by final state.

    Many processes (on many machines) may run this on the same storage at once. Pass
    ``reseed=True`` in each of them so that workers built with the same seed don't draw the
    same random numbers (Optuna does the same for ``n_jobs``); QMC points still come from one
    shared sequence.

    Example:
        >>> from trainopt.hpo import create_study
        >>> from trainopt.hpo import run_worker
        >>> from trainopt.hpo.space import SearchSpace
        >>> study = create_study("doc-worker", 3, ":memory:", sampler="random", pruner=None)
        >>> space = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
        >>> run_worker(study, space, lambda trial, params: params["x"])
        {'COMPLETE': 3, 'PRUNED': 0, 'FAIL': 0}
        >>> run_worker(study, space, lambda trial, params: params["x"])  # the budget is spent
        {'COMPLETE': 0, 'PRUNED': 0, 'FAIL': 0}
    """
    if reseed:
        study.sampler.reseed_rng()
    counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
    bar = None
    if show_progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,))),
                   desc=study.study_name, unit="trial")
    try:
        with _optimize_loop(study):
            while not study._stop_flag and (trial := _claim(study)) is not None:
                state = run_trial(study, trial, space, objective)
                counts[state.name] += 1
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(counts)
    finally:
        if bar is not None:
            bar.close()
    return counts


@contextmanager
def _optimize_loop(study: optuna.Study) -> Iterator[None]:
    """Stand in for ``Study.optimize``'s loop: samplers may call ``study.stop()`` from ``after_trial``.

    (``GridSampler`` does once the grid is done; Optuna allows it only inside its own loop.)
    """
    previous = getattr(study._thread_local, "in_optimize_loop", False)
    study._thread_local.in_optimize_loop = True
    study._stop_flag = False
    try:
        yield
    finally:
        study._thread_local.in_optimize_loop = previous


def tune(objective: Objective, space: SearchSpace, n_trials: int, *, study_name: str = "trainopt",
         storage: str | Path | None = None, directions: Sequence[str] = ("minimize",),
         sampler: str = "tpe", pruner: str | optuna.pruners.BasePruner | None = "median",
         seed: int | None = 0, show_progress_bar: bool = False) -> optuna.Study:
    """Tune ``objective(trial, params)`` over ``space`` until the study holds ``n_trials`` trials.

    The study lives in ``storage`` (an SQLite file ``<study_name>.db`` by default): run
    ``tune`` again with the same name and a larger ``n_trials`` to resume, with the same or
    another sampler (explore with ``"qmc"``, then exploit with ``"tpe"``).

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
                         pruner=pruner, seed=seed, space=space)
    run_worker(study, space, objective, show_progress_bar=show_progress_bar)
    return study


def best_trials_text(study: optuna.Study) -> str:
    """A short text summary of the best trial (or the Pareto front) and the trial counts.

    Example:
        >>> from trainopt.hpo import best_trials_text
        >>> from trainopt.hpo import tune
        >>> from trainopt.hpo.space import SearchSpace
        >>> space = SearchSpace.from_dict({"x": {"type": "categorical", "choices": [1, 2]}})
        >>> study = tune(lambda trial, params: params["x"], space, 2, study_name="doc-text", storage=":memory:",
        ...              sampler="grid", pruner=None)
        >>> print(best_trials_text(study))
        study doc-text: 2 trials, 2 complete, 0 pruned, 0 fail
        best trial:
          #...: value 1 | x=1
    """
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)}
    lines = [f"study {study.study_name}: {len(trials)} trials, "
             + ", ".join(f"{n} {k.lower()}" for k, n in counts.items())]
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
