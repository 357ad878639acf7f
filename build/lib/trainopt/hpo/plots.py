"""Study plots as matplotlib Figures (headless), through ``optuna.visualization.matplotlib``.

History, learning curves, PED-ANOVA importances, parallel coordinates and contours for one
objective; the Pareto front for two or three; the isolation plot of a scientific hyperparameter.

Optuna marks its matplotlib plots experimental and warns on each call; the warning is
silenced here, around those calls only, so that warnings-as-errors builds and test runs stay
clean without hiding anything else.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from matplotlib.figure import Figure
from optuna.visualization import matplotlib as optuna_mpl

PLOTS = ("history", "importances", "intermediate", "pareto", "isolation", "parallel", "contour")
_DEMO_STUDIES: dict[tuple[Any, ...], optuna.Study] = {}


@contextmanager
def quiet_experimental() -> Iterator[None]:
    """Ignore Optuna's ``ExperimentalWarning`` inside the block, and nothing else.

    Example:
        >>> import optuna
        >>> import warnings
        >>> from trainopt.hpo.plots import quiet_experimental
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     with quiet_experimental():
        ...         warnings.warn("new API", optuna.exceptions.ExperimentalWarning)
        ...         warnings.warn("old API", DeprecationWarning)
        >>> [w.category.__name__ for w in caught]
        ['DeprecationWarning']
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        yield


def _figure(plot: Callable[..., Any], study: optuna.Study, **kwargs: Any) -> Figure:
    with quiet_experimental():
        axes = plot(study, **kwargs)
    first = axes.flat[0] if hasattr(axes, "flat") else axes
    fig = first.figure
    fig.set_size_inches(6.4, 3.4)
    fig.tight_layout()
    return fig


def plot_history(study: optuna.Study) -> Figure:
    """Objective value per trial and the best so far (single-objective studies).

    Example:
        >>> import optuna
        >>> from trainopt.hpo.plots import plot_history
        >>> study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        >>> study.optimize(lambda trial: trial.suggest_float("x", -1, 1) ** 2, n_trials=5)
        >>> plot_history(study).axes[0].get_title()
        'Optimization History Plot'
    """
    return _figure(optuna_mpl.plot_optimization_history, study)


def importance_evaluator() -> optuna.importance.BaseImportanceEvaluator:
    """PED-ANOVA, the evaluator behind :func:`plot_importances`, named rather than left to Optuna's
    default.

    PED-ANOVA (Watanabe et al., IJCAI 2023) scores a hyperparameter by how much the
    distribution of its values in the best trials (the top 10 %) differs from its distribution
    in all of them. It is Optuna 5's default for ``optuna.importance.get_param_importances``;
    Optuna 4's default was fANOVA, so it is passed explicitly here, on every Optuna in the range.

    Example:
        >>> from trainopt.hpo.plots import importance_evaluator
        >>> type(importance_evaluator()).__name__
        'PedAnovaImportanceEvaluator'
    """
    with quiet_experimental():  # experimental on Optuna 4
        return optuna.importance.PedAnovaImportanceEvaluator()


def plot_importances(study: optuna.Study) -> Figure:
    """Which hyperparameters matter for the best trials, by PED-ANOVA
    (:func:`importance_evaluator`).

    Example:
        >>> import optuna
        >>> from trainopt.hpo.plots import plot_importances
        >>> study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        >>> study.optimize(lambda trial: trial.suggest_float("x", -1, 1) ** 2
        ...                + 0.01 * trial.suggest_float("y", -1, 1),
        ...                n_trials=30)
        >>> ax = plot_importances(study).axes[0]
        >>> bars = {label.get_text(): bar.get_width() for label, bar in zip(ax.get_yticklabels(),
        ...                                                                 ax.patches)}
        >>> bool(bars["x"] > bars["y"])  # x moves the objective, y barely does
        True
    """
    return _figure(optuna_mpl.plot_param_importances, study, evaluator=importance_evaluator())


def plot_parallel(study: optuna.Study) -> Figure:
    """One line per completed trial across the axes of its hyperparameters, coloured by its value.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.plots import plot_parallel
        >>> study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        >>> study.optimize(lambda trial: trial.suggest_float("x", -1, 1) ** 2
        ...                + trial.suggest_float("y", -1, 1), n_trials=5)
        >>> plot_parallel(study).axes[0].get_title()
        'Parallel Coordinate Plot'
    """
    return _figure(optuna_mpl.plot_parallel_coordinate, study)


def plot_contour(study: optuna.Study, params: list[str] | None = None) -> Figure:
    """The objective over two hyperparameters (by default the two that PED-ANOVA ranks highest).

    Example:
        >>> import optuna
        >>> from trainopt.hpo.plots import plot_contour
        >>> study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        >>> study.optimize(lambda trial: trial.suggest_float("x", -1, 1) ** 2
        ...                + trial.suggest_float("y", -1, 1) + trial.suggest_float("z", -1, 1),
        ...                n_trials=12)
        >>> ax = plot_contour(study, ["x", "y"]).axes[0]
        >>> ax.get_xlabel(), ax.get_ylabel()
        ('x', 'y')
    """
    if params is None:
        with quiet_experimental():
            ranked = optuna.importance.get_param_importances(
                study, evaluator=importance_evaluator()
            )
        params = list(ranked)[:2]
    return _figure(optuna_mpl.plot_contour, study, params=params)


def plot_intermediate(study: optuna.Study) -> Figure:
    """The reported learning curve of every trial: pruned ones stop early.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.plots import plot_intermediate
        >>> study = optuna.create_study()
        >>> study.add_trial(optuna.trial.create_trial(
        ...     value=0.5, params={"x": 0.1},
        ...     distributions={"x": optuna.distributions.FloatDistribution(0, 1)},
        ...     intermediate_values={0: 2.0, 1: 1.0, 2: 0.5}))
        >>> plot_intermediate(study).axes[0].get_xlabel()
        'Step'
    """
    return _figure(optuna_mpl.plot_intermediate_values, study)


def plot_pareto(study: optuna.Study, target_names: list[str] | None = None) -> Figure:
    """The trade-off between two objectives; the Pareto-optimal trials are highlighted.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.plots import plot_pareto
        >>> study = optuna.create_study(directions=["minimize", "minimize"])
        >>> study.optimize(
        ...     lambda trial: (x := trial.suggest_float("x", 0, 1), (1 - x) ** 2), n_trials=6
        ... )
        >>> plot_pareto(study, target_names=["loss", "size"]).axes[0].get_ylabel()
        'size'
    """
    return _figure(optuna_mpl.plot_pareto_front, study, target_names=target_names)


def plot_isolation(study: optuna.Study, scientific: str) -> Figure:
    """The isolation plot: the best objective for each value of a scientific hyperparameter.

    The line joins :func:`~trainopt.hpo.study.isolation`'s values, the best over the nuisance
    hyperparameters for each value; the grey dots are the single trials behind them. Values
    are placed in order, evenly spaced, and labelled.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.plots import plot_isolation
        >>> study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        >>> for wd in (0.0, 0.1):  # both values of the scientific hyperparameter, at least once
        ...     study.enqueue_trial({"wd": wd})
        >>> study.optimize(lambda trial: trial.suggest_categorical("wd", [0.0, 0.1])
        ...                + trial.suggest_float("lr", 0, 1),
        ...                n_trials=6)
        >>> ax = plot_isolation(study, "wd").axes[0]
        >>> [label.get_text() for label in ax.get_xticklabels()]
        ['0', '0.1']
    """
    from trainopt.hpo.study import isolation

    best = isolation(study, scientific)
    position = {value: i for i, value in enumerate(best)}
    fig = Figure(figsize=(6.4, 3.4))
    ax = fig.add_subplot()
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    dots = [(position[t.params[scientific]], t.value) for t in trials if scientific in t.params]
    ax.scatter(*zip(*dots), color="0.6", s=18, label="single trials")
    ax.plot(
        list(position.values()), list(best.values()), marker="o", color="C0", label="best per value"
    )
    ax.set_xticks(
        list(position.values()), [f"{v:g}" if isinstance(v, float) else str(v) for v in best]
    )
    ax.set_xlabel(scientific)
    ax.set_ylabel("objective value")
    ax.set_title(f"Isolation plot: {scientific}")
    ax.legend()
    fig.tight_layout()
    return fig


def save_plots(study: optuna.Study, out_dir: str | Path) -> list[Path]:
    """Write the plots that fit the study as PNG files into ``out_dir``; return their paths.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.plots import save_plots
        >>> import tempfile
        >>> study = optuna.create_study(study_name="doc")
        >>> study.optimize(lambda trial: trial.suggest_float("x", -1, 1) ** 2, n_trials=3)
        >>> [path.name for path in save_plots(study, tempfile.mkdtemp())]
        ['doc-history.png', 'doc-intermediate.png', 'doc-importances.png', 'doc-parallel.png']
    """
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(study.directions) > 1:
        plots = {"pareto": plot_pareto} if complete else {}
    else:
        plots = {"history": plot_history, "intermediate": plot_intermediate}
        if len(complete) >= 2:
            plots["importances"] = plot_importances
            plots["parallel"] = plot_parallel
            if len({name for trial in complete for name in trial.params}) >= 2:
                plots["contour"] = plot_contour
    written = []
    for name, plot in plots.items():
        fig = plot(study)
        path = out_dir / f"{study.study_name}-{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def demo_study(
    objectives: tuple[str, ...] = ("val_loss",), n_trials: int = 16, steps: int = 100, seed: int = 0
) -> optuna.Study:
    """A small real study of the digits MLP, run once per set of arguments (build-time plots).

    One objective: learning rate and weight decay, a quasi-random (exploration) round with
    median pruning from 40 % of the steps on. Several: width and learning rate, validation
    loss against parameter count, TPE, no pruning.

    Example:
        >>> from trainopt.hpo.plots import demo_study
        >>> study = demo_study()
        >>> states = {trial.state.name for trial in study.trials}
        >>> len(study.trials), states <= {"COMPLETE", "PRUNED"}
        (16, True)
    """
    key = (objectives, n_trials, steps, seed)
    if key not in _DEMO_STUDIES:
        from trainopt.hpo.digits import OBJECTIVES, digits_objective
        from trainopt.hpo.space import SearchSpace
        from trainopt.hpo.study import make_pruner, tune

        specs: dict[str, Any] = {
            "lr": {"type": "float", "low": 1e-4, "high": 3e-1, "log": True},
            "weight_decay": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True},
        }
        if len(objectives) > 1:
            specs = {
                "lr": specs["lr"],
                "hidden": {"type": "int", "low": 8, "high": 256, "log": True},
            }
        objective = partial(
            digits_objective, steps=steps, report_every=max(steps // 5, 1), objectives=objectives
        )
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no per-trial log lines in the build
        try:
            _DEMO_STUDIES[key] = tune(
                objective,
                SearchSpace.from_dict(specs),
                n_trials,
                study_name="demo-" + "-".join(objectives),
                storage=":memory:",
                directions=[OBJECTIVES[o] for o in objectives],
                sampler="qmc" if len(objectives) == 1 else "tpe",
                pruner=make_pruner(
                    "median" if len(objectives) == 1 else None, n_warmup_steps=steps * 2 // 5
                ),
                seed=seed,
            )
        finally:
            optuna.logging.set_verbosity(verbosity)
    return _DEMO_STUDIES[key]


def demo_isolation_study(steps: int = 100) -> optuna.Study:
    """A grid over the digits MLP's width (scientific) and learning rate (nuisance), run once.

    Example:
        >>> from trainopt.hpo.plots import demo_isolation_study
        >>> sorted({trial.params["hidden"] for trial in demo_isolation_study(steps=20).trials})
        [16, 64, 256]
    """
    key = ("isolation", steps)
    if key not in _DEMO_STUDIES:
        from trainopt.hpo.digits import digits_objective
        from trainopt.hpo.space import SearchSpace
        from trainopt.hpo.study import tune

        space = SearchSpace.from_dict(
            {
                "hidden": {"type": "categorical", "choices": [16, 64, 256]},
                "lr": {"type": "categorical", "choices": [1e-3, 3e-3, 1e-2, 3e-2]},
            }
        )
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            _DEMO_STUDIES[key] = tune(
                partial(digits_objective, steps=steps),
                space,
                12,
                study_name="demo-isolation",
                storage=":memory:",
                sampler="grid",
                pruner=None,
            )
        finally:
            optuna.logging.set_verbosity(verbosity)
    return _DEMO_STUDIES[key]


def demo_figure(plot: str = "history") -> Figure:
    """One plot of a :func:`demo_study` (the hyperparameter-optimization page's figures).

    Example:
        >>> from trainopt.hpo.plots import demo_figure
        >>> fig = demo_figure("intermediate")
        >>> fig.axes[0].get_xlabel()
        'Step'
    """
    if plot not in PLOTS:
        raise ValueError(f"plot must be one of {list(PLOTS)}, got {plot!r}")
    if plot == "isolation":
        return plot_isolation(demo_isolation_study(), "hidden")
    if plot == "pareto":
        return plot_pareto(
            demo_study(("val_loss", "n_params")), target_names=["validation loss", "parameters"]
        )
    study = demo_study()
    return {
        "history": plot_history,
        "importances": plot_importances,
        "intermediate": plot_intermediate,
        "parallel": plot_parallel,
        "contour": plot_contour,
    }[plot](study)
