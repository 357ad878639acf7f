"""Isolation plots, the constant liar of parallel TPE, and the rungs of successive halving and
Hyperband."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import matplotlib.pyplot as plt
import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution

from trainopt.hpo import SearchSpace, make_pruner, make_sampler, tune
from trainopt.hpo.plots import plot_isolation
from trainopt.hpo.study import isolation

optuna.logging.set_verbosity(optuna.logging.WARNING)
DISTRIBUTIONS = {
    "wd": CategoricalDistribution([0.0, 1e-3, 1e-2]),
    "lr": FloatDistribution(1e-4, 1.0, log=True),
}


def _study(direction: str, rows: list[tuple[float, float, float | None, str]]) -> optuna.Study:
    study = optuna.create_study(direction=direction)
    for wd, lr, value, state in rows:
        study.add_trial(
            optuna.trial.create_trial(
                params={"wd": wd, "lr": lr},
                distributions=DISTRIBUTIONS,
                value=value,
                state=getattr(optuna.trial.TrialState, state),
            )
        )
    return study


ROWS = [
    (0.0, 1e-3, 0.50, "COMPLETE"),
    (0.0, 1e-2, 0.30, "COMPLETE"),
    (0.0, 1e-1, 0.90, "COMPLETE"),
    (1e-3, 1e-3, 0.40, "COMPLETE"),
    (1e-3, 1e-2, 0.35, "COMPLETE"),
    (1e-2, 1e-3, 0.20, "COMPLETE"),
    (1e-2, 1e-2, 0.60, "COMPLETE"),
    (1e-3, 3e-2, None, "PRUNED"),
    (1e-2, 3e-2, None, "FAIL"),
]


def test_isolation_is_the_best_completed_value_per_scientific_value_hand_computed() -> None:
    assert isolation(_study("minimize", ROWS), "wd") == {0.0: 0.30, 1e-3: 0.35, 1e-2: 0.20}
    assert isolation(_study("maximize", ROWS), "wd") == {0.0: 0.90, 1e-3: 0.40, 1e-2: 0.60}


def test_isolation_refuses_a_multi_objective_study_and_an_unknown_hyperparameter() -> None:
    with pytest.raises(ValueError, match="single-objective"):
        isolation(optuna.create_study(directions=["minimize", "minimize"]), "wd")
    with pytest.raises(ValueError, match="'depth'"):
        isolation(_study("minimize", ROWS), "depth")


def test_isolation_plot_draws_the_best_value_line_over_every_trial() -> None:
    fig = plot_isolation(_study("minimize", ROWS), "wd")
    ax = fig.axes[0]
    assert [label.get_text() for label in ax.get_xticklabels()] == ["0", "0.001", "0.01"]
    assert list(ax.lines[0].get_ydata()) == [0.30, 0.35, 0.20]
    assert len(ax.collections[0].get_offsets()) == 7  # the completed trials
    plt.close(fig)


def _pending_spread(sampler: optuna.samplers.BaseSampler, seed: int) -> float:
    """Mean distance between 8 points asked at once (8 workers, none finished) after 12 results."""
    study = optuna.create_study(sampler=sampler)
    rng = random.Random(seed)
    box = {"x": FloatDistribution(0, 1), "y": FloatDistribution(0, 1)}
    for _ in range(12):
        x, y = rng.random(), rng.random()
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": x, "y": y}, distributions=box, value=(x - 0.3) ** 2 + (y - 0.6) ** 2
            )
        )
    points = [tuple(study.ask(box).params.values()) for _ in range(8)]
    return statistics.mean(math.dist(a, b) for a, b in itertools.combinations(points, 2))


@pytest.mark.parametrize("seed", range(3))
def test_tpe_sampler_spreads_the_points_of_workers_that_ask_at_once(seed: int) -> None:
    without = _pending_spread(
        optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=False), seed
    )
    assert _pending_spread(make_sampler("tpe", seed=seed), seed) > 2 * without


def _curves(trial: optuna.Trial, params: dict) -> float:
    for step in range(32):
        loss = 1.0 / (1.0 + params["rate"] * step)
        trial.report(loss, step)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return loss


@pytest.mark.parametrize(
    "name, rungs", [("successive-halving", {1, 4, 16}), ("hyperband", {1, 3, 9, 27})]
)
def test_pruned_trials_stop_only_at_the_rungs_min_resource_times_eta_to_the_k(
    name: str, rungs: set
) -> None:
    space = SearchSpace.from_dict(
        {"rate": {"type": "float", "low": 0.01, "high": 1.0, "log": True}}
    )
    study = tune(
        _curves,
        space,
        27,
        study_name=name,
        storage=":memory:",
        sampler="random",
        pruner=make_pruner(name, n_warmup_steps=1),
        seed=0,
    )
    stops = {max(t.intermediate_values) for t in study.trials if t.state.name == "PRUNED"}
    assert stops and stops <= rungs
