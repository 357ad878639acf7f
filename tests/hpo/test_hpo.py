"""trainopt.hpo: search spaces, samplers and pruners, the exact budget, the reporter, plots, the
CLI."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from functools import partial
from pathlib import Path

import matplotlib.pyplot as plt
import optuna
import pytest
import tiny_runs
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState

from trainopt.config.training import ConfigError
from trainopt.data import path
from trainopt.hpo import (
    SearchSpace,
    TrialDiverged,
    TrialReporter,
    create_study,
    load_hpo_config,
    lr_bounds_from_finder,
    make_pruner,
    make_sampler,
    open_storage,
    params_at_edge,
    run_worker,
    tune,
    with_lr_range_from_finder,
)
from trainopt.hpo.digits import digits_objective, train_digits
from trainopt.hpo.plots import (
    plot_history,
    plot_importances,
    plot_intermediate,
    plot_pareto,
    save_plots,
)
from trainopt.hpo.space import load_search_space
from trainopt.models import digits_data

ROOT = Path(__file__).resolve().parents[2]
DATA = path(".")
optuna.logging.set_verbosity(optuna.logging.WARNING)

LR = {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}


def quadratic(trial: optuna.Trial, params: dict) -> float:
    """A cheap objective with its minimum at x = 0.3, y = 2."""
    return (params["x"] - 0.3) ** 2 + (params.get("y", 2) - 2) ** 2


XY = SearchSpace.from_dict(
    {"x": {"type": "float", "low": 0.0, "high": 1.0}, "y": {"type": "int", "low": 0, "high": 4}}
)


# --- search spaces ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, field, allowed",
    [
        (
            {"type": "double", "low": 0, "high": 1},
            "search_space.p.type",
            "['float', 'int', 'categorical']",
        ),
        ({"type": "float", "low": 1.0}, "search_space.p.high", "required"),
        ({"type": "float", "low": 1.0, "high": 0.5}, "search_space.p", "low < high"),
        (
            {"type": "float", "low": 0.0, "high": 1.0, "log": True},
            "search_space.p.low",
            "> 0 when log",
        ),
        (
            {"type": "float", "low": 0.1, "high": 1.0, "log": "yes"},
            "search_space.p.log",
            "true or false",
        ),
        (
            {"type": "float", "low": 0.1, "high": 1.0, "log": True, "step": 0.1},
            "search_space.p",
            "can't be combined",
        ),
        ({"type": "int", "low": 1.5, "high": 4}, "search_space.p.low", "must be an int"),
        ({"type": "int", "low": 1, "high": 4, "step": 0}, "search_space.p.step", "positive"),
        ({"type": "float", "low": "small", "high": 1.0}, "search_space.p.low", "must be a number"),
        ({"type": "categorical", "choices": []}, "search_space.p.choices", "non-empty list"),
        (
            {"type": "categorical", "choices": [[1, 2]]},
            "search_space.p.choices",
            "None, bool, int, float or str",
        ),
        (
            {"type": "float", "low": 0, "high": 1, "lo": 0},
            "search_space.p",
            "['high', 'log', 'low', 'step', 'type']",
        ),
    ],
)
def test_bad_spec_raises_config_error_naming_field_and_allowed(spec, field, allowed) -> None:
    with pytest.raises(ConfigError) as info:
        SearchSpace.from_dict({"p": spec})
    assert info.value.field == field and allowed in str(info.value)


def test_yaml_1e_minus_4_string_is_read_as_the_number() -> None:
    spec = yaml.safe_load("p: {type: float, low: 1e-4, high: 1.0e-1, log: true}")
    assert spec["p"]["low"] == "1e-4"  # what PyYAML does
    assert SearchSpace.from_dict(spec)["p"].low == pytest.approx(1e-4)


def test_space_suggests_through_the_matching_suggest_calls() -> None:
    space = SearchSpace.from_dict(
        {
            "lr": LR,
            "hidden": {"type": "int", "low": 32, "high": 128, "step": 32},
            "opt": {"type": "categorical", "choices": ["adamw", "sgd"]},
            "p": {"type": "float", "low": 0.0, "high": 0.5, "step": 0.1},
        }
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    params = space.suggest(trial)
    assert trial.distributions == {name: spec.distribution() for name, spec in space.items()}
    assert params["hidden"] in (32, 64, 96, 128) and params["opt"] in ("adamw", "sgd")
    assert round(params["p"] * 10) == pytest.approx(params["p"] * 10)


@settings(max_examples=40, deadline=None)
@given(low=st.floats(1e-6, 1.0), ratio=st.floats(1.01, 1e4), seed=st.integers(0, 2**31 - 1))
def test_suggested_floats_stay_in_bounds(low: float, ratio: float, seed: int) -> None:
    space = SearchSpace.from_dict(
        {"p": {"type": "float", "low": low, "high": low * ratio, "log": True}}
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    value = space.suggest(study.ask())["p"]
    assert low <= value <= low * ratio


def test_docs_search_space_loads_and_drives_a_study() -> None:
    config = load_hpo_config(DATA / "hpo_digits.yaml")
    assert load_search_space(DATA / "hpo_digits.yaml") == config.space
    assert config.space["lr"].log and config.fixed == {"hidden": 128, "batch_size": 64}
    study = tune(
        lambda trial, params: math.log(params["lr"]) ** 2,
        config.space,
        4,
        storage=":memory:",
        sampler="random",
    )
    assert set(study.best_params) == {"lr", "weight_decay"}


def test_config_rejects_a_parameter_both_fixed_and_tuned(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"fixed": {"lr": 0.01}, "search_space": {"lr": LR}}))
    with pytest.raises(ConfigError) as info:
        load_hpo_config(path)
    assert info.value.field == "fixed.lr"


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("study", "sampler", "bayes"),
        ("study", "pruner", "mean"),
        ("study", "objectives", ["loss"]),
        ("training", "steps", 0),
        ("study", "directions", ["minimize"]),
    ],
)
def test_config_errors_name_the_dotted_field(tmp_path: Path, section: str, key: str, value) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({section: {key: value}, "search_space": {"lr": LR}}))
    with pytest.raises(ConfigError) as info:
        load_hpo_config(path)
    assert info.value.field == f"{section}.{key}"


def test_grid_needs_a_step_or_choices() -> None:
    assert XY.with_bounds("x", 0.0, 1.0)["y"].grid() == [0, 1, 2, 3, 4]
    with pytest.raises(ConfigError, match="a grid search needs"):
        XY.grid()


def test_params_at_edge_flags_low_and_high_in_log_space() -> None:
    space = SearchSpace.from_dict({"lr": LR, "n": {"type": "int", "low": 0, "high": 100}})
    assert params_at_edge({"lr": 1.3e-4, "n": 99}, space) == {"lr": "low", "n": "high"}
    # 3e-3 is near the middle in log space, though near the bottom on a linear scale
    assert params_at_edge({"lr": 3.2e-3, "n": 50}, space) == {}


@pytest.fixture
def one_thread():
    """A tiny model on a busy machine: intra-op threads only contend (60x slower seen on 2
    cores)."""
    with tiny_runs.one_thread():
        yield


def test_lr_finder_suggestion_sets_the_lr_bounds(one_thread) -> None:
    from trainopt.models import digits_loaders, digits_mlp
    from trainopt.schedules.finder import LearningRateFinder

    model = digits_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train, _ = digits_loaders()
    finder = LearningRateFinder(model, optimizer, train, torch.nn.functional.cross_entropy)
    finder.find_lr(start_lr=1e-5, end_lr=1.0, num_steps=60)
    suggestion = finder.suggest_lr()
    narrowed = with_lr_range_from_finder(SearchSpace.from_dict({"lr": LR}), finder)
    assert (narrowed["lr"].low, narrowed["lr"].high) == pytest.approx(
        (suggestion / 10, suggestion * 3)
    )
    assert narrowed["lr"].log


@pytest.mark.parametrize("below, above", [(10.0, 3.0), (3.0, 3.0), (10.0, 10.0), (2.0, 8.0)])
def test_lr_bounds_have_their_log_centre_at_the_suggestion_times_sqrt_above_over_below(
    below, above
) -> None:
    low, high = lr_bounds_from_finder(3e-3, below, above)
    assert math.sqrt(low * high) == pytest.approx(3e-3 * math.sqrt(above / below))


def test_default_lr_bounds_lean_below_the_suggestion_and_equal_margins_centre_them() -> None:
    low, high = lr_bounds_from_finder(1e-2)
    assert (
        math.sqrt(low * high) == pytest.approx(1e-2 * math.sqrt(0.3))
        and math.sqrt(low * high) < 1e-2
    )
    low, high = lr_bounds_from_finder(1e-2, below=5.0, above=5.0)
    assert math.sqrt(low * high) == pytest.approx(1e-2)


def test_pareto_front_uses_non_strict_dominance() -> None:
    """A trial tied on one objective and worse on the other is dominated, as the page defines it."""
    study = optuna.create_study(directions=["minimize", "minimize"])
    for values in [(1.0, 2.0), (1.0, 3.0), (2.0, 1.0), (3.0, 3.0), (2.0, 1.0)]:
        study.add_trial(optuna.trial.create_trial(values=list(values)))
    front = sorted(tuple(trial.values) for trial in study.best_trials)
    assert front == [(1.0, 2.0), (2.0, 1.0), (2.0, 1.0)]  # equal trials don't dominate each other


@pytest.mark.parametrize("bad", [0.0, -1e-3, math.nan, math.inf, "3e-3"])
def test_lr_bounds_reject_a_suggestion_that_is_not_a_positive_number(bad) -> None:
    with pytest.raises(ValueError, match="positive finite"):
        lr_bounds_from_finder(bad)


# --- samplers, pruners, storages --------------------------------------------------------------


@pytest.mark.parametrize(
    "name, cls",
    [
        ("qmc", "QMCSampler"),
        ("tpe", "TPESampler"),
        ("random", "RandomSampler"),
        ("gp", "GPSampler"),
    ],
)
def test_make_sampler_by_name(name: str, cls: str) -> None:
    sampler = make_sampler(name, seed=0)  # seeded per trial (trainopt.hpo.seeds), but for QMC
    assert type(getattr(sampler, "base", sampler)).__name__ == cls
    assert type(make_sampler(name)).__name__ == cls  # unseeded: the sampler itself


def test_qmc_sampler_is_scrambled_sobol_and_made_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sampler = make_sampler("qmc", seed=0)
    assert sampler._qmc_type == "sobol" and sampler._scramble


def test_gp_sampler_runs_a_study_past_its_random_startup() -> None:
    study = tune(quadratic, XY, 12, storage=":memory:", sampler="gp", pruner=None, seed=0)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 12
    assert any(key.startswith("gp:") for key in study.trials[-1].system_attrs)  # proposed by the GP


def test_gp_sampler_without_its_dependencies_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy", None)
    with pytest.raises(ConfigError, match=r"'gp' needs \['scipy'\]"):
        make_sampler("gp")


@pytest.mark.parametrize("bad", ["bayes", "TPE"])
def test_unknown_sampler_lists_the_allowed(bad: str) -> None:
    with pytest.raises(ConfigError, match="qmc.*tpe.*random.*grid.*gp"):
        make_sampler(bad)


@pytest.mark.parametrize(
    "name, cls",
    [
        ("median", "MedianPruner"),
        ("successive-halving", "SuccessiveHalvingPruner"),
        ("hyperband", "HyperbandPruner"),
        (None, "NopPruner"),
        ("none", "NopPruner"),
    ],
)
def test_make_pruner_by_name(name, cls: str) -> None:
    assert type(make_pruner(name)).__name__ == cls


def test_same_seed_gives_the_same_study() -> None:
    def best(sampler: str) -> list[dict]:
        study = tune(quadratic, XY, 8, storage=":memory:", sampler=sampler, pruner=None, seed=3)
        return [t.params for t in study.trials]

    for sampler in ("qmc", "tpe", "random"):
        assert best(sampler) == best(sampler)


def test_grid_sampler_visits_every_point_once() -> None:
    space = SearchSpace.from_dict(
        {
            "x": {"type": "float", "low": 0.0, "high": 1.0, "step": 0.5},
            "y": {"type": "categorical", "choices": [1, 2]},
        }
    )
    study = tune(quadratic, space, 6, storage=":memory:", sampler="grid", pruner=None)
    points = sorted((t.params["x"], t.params["y"]) for t in study.trials)
    assert points == [(0.0, 1), (0.0, 2), (0.5, 1), (0.5, 2), (1.0, 1), (1.0, 2)]


def test_unknown_storage_url_lists_the_forms() -> None:
    with pytest.raises(ConfigError, match="sqlite:///.*journal:"):
        open_storage("study.db")


def test_sqlite_study_survives_the_process_and_resumes_to_the_total(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    tune(quadratic, XY, 5, study_name="s", storage=url, sampler="qmc", pruner=None)
    study = tune(quadratic, XY, 9, study_name="s", storage=url, sampler="tpe", pruner=None)
    assert len(study.trials) == 9 and all(t.state == TrialState.COMPLETE for t in study.trials)
    again = tune(quadratic, XY, 9, study_name="s", storage=url)  # already complete: runs nothing
    assert len(again.trials) == 9


def test_journal_storage_holds_the_study(tmp_path: Path) -> None:
    url = f"journal:{tmp_path / 's.log'}"
    tune(quadratic, XY, 4, study_name="s", storage=url, sampler="random", pruner=None)
    loaded = optuna.load_study(study_name="s", storage=open_storage(url))
    assert len(loaded.trials) == 4 and (tmp_path / "s.log").stat().st_size > 0


def test_the_default_storage_is_an_sqlite_file_named_for_the_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    tune(quadratic, XY, 2, study_name="mine", sampler="random", pruner=None)
    assert (tmp_path / "mine.db").exists()


# --- the reporter and how trials end ----------------------------------------------------------


def test_reporter_reports_every_n_steps_and_prunes_through_the_pruner() -> None:
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1.0))
    trial = study.ask()
    reporter = TrialReporter(trial, report_every=5)
    assert [s for s in range(20) if reporter.due(s)] == [4, 9, 14, 19]
    reporter.report(0.5, step=4)
    with pytest.raises(optuna.TrialPruned, match="step 9"):
        reporter.report(1.5, step=9)
    assert study.trials[0].intermediate_values == {4: 0.5, 9: 1.5}


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_reporter_raises_diverged_on_a_non_finite_metric(value: float) -> None:
    reporter = TrialReporter(optuna.create_study().ask(), report_every=1)
    with pytest.raises(TrialDiverged, match="diverged at step 3"):
        reporter.report(value, step=3)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_reporter_rejects_a_bad_report_every(bad) -> None:
    with pytest.raises(ValueError, match="report_every"):
        TrialReporter(optuna.create_study().ask(), report_every=bad)


def test_pruned_and_diverged_trials_are_recorded_with_a_reason_and_the_study_goes_on() -> None:
    def objective(trial: optuna.Trial, params: dict) -> float:
        if trial.number == 1:
            raise optuna.TrialPruned("pruned at step 7")
        if trial.number == 2:
            return math.nan
        if trial.number == 3:
            TrialReporter(trial, 1).report(math.inf, step=0)
        return params["x"]

    study = tune(objective, XY, 5, storage=":memory:", sampler="random", pruner=None)
    states = [t.state for t in study.trials]
    assert states == [
        TrialState.COMPLETE,
        TrialState.PRUNED,
        TrialState.FAIL,
        TrialState.FAIL,
        TrialState.COMPLETE,
    ]
    reasons = [t.user_attrs.get("reason") for t in study.trials]
    assert (
        reasons[1] == "pruned at step 7"
        and "diverged" in reasons[2]
        and "diverged at step 0" in reasons[3]
    )


def test_a_bug_in_the_objective_is_recorded_then_raised() -> None:
    def objective(trial: optuna.Trial, params: dict) -> float:
        raise KeyError("lr")

    study = create_study("bug", 3, ":memory:", sampler="random", pruner=None)
    with pytest.raises(KeyError):
        run_worker(study, XY, objective)
    assert (
        study.trials[0].state == TrialState.FAIL
        and study.trials[0].user_attrs["reason"] == "KeyError: 'lr'"
    )


def test_median_pruner_stops_a_bad_digits_trial_early() -> None:
    study = optuna.create_study(
        storage=open_storage(":memory:"), pruner=make_pruner("median", n_startup_trials=2)
    )
    for lr in (1e-2, 3e-3, 1e-4):  # 1e-4 is far too small for 60 steps: worse than the median
        study.enqueue_trial({"lr": lr})
    run_worker(
        study,
        SearchSpace.from_dict({"lr": LR}),
        partial(digits_objective, steps=60, report_every=10),
    )
    states = [t.state for t in study.trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    assert max(study.trials[2].intermediate_values) < 59


def test_multi_objective_study_has_a_pareto_front() -> None:
    space = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
    study = tune(
        lambda trial, p: (p["x"], (1 - p["x"]) ** 2),
        space,
        12,
        storage=":memory:",
        directions=["minimize", "minimize"],
        sampler="random",
        pruner=None,
    )
    front = study.best_trials
    assert front and all(not _dominated(t, study.trials) for t in front)


def _dominated(trial: optuna.trial.FrozenTrial, others: list) -> bool:
    return any(
        all(o <= t for o, t in zip(other.values, trial.values)) and other.values != trial.values
        for other in others
        if other.values
    )


def test_multi_objective_study_refuses_a_pruner() -> None:
    with pytest.raises(ConfigError, match="multi-objective") as info:
        create_study("mo", 2, ":memory:", directions=["minimize", "minimize"], pruner="median")
    assert info.value.field == "study.pruner"


def test_tuning_beats_adamw_defaults_on_digits() -> None:
    space = SearchSpace.from_dict({"lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True}})
    study = tune(
        partial(digits_objective, steps=80, report_every=20),
        space,
        6,
        storage=":memory:",
        sampler="qmc",
        pruner=None,
        seed=0,
    )
    default_loss, _ = train_digits(steps=80)
    assert study.best_value < default_loss


def test_digits_split_has_no_unscaled_pixel() -> None:
    """Regression: a pixel constant in the training split was divided by 1e-6 (a 1e6 input)."""
    _, _, x_val, _ = digits_data()
    assert float(x_val.abs().max()) < 100


def test_train_digits_restores_the_thread_count() -> None:
    before = torch.get_num_threads()
    train_digits(steps=2, num_threads=1)
    assert torch.get_num_threads() == before


# --- plots ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_study() -> optuna.Study:
    space = SearchSpace.from_dict(
        {"lr": LR, "weight_decay": {"type": "float", "low": 1e-5, "high": 1e-1, "log": True}}
    )
    return tune(
        partial(digits_objective, steps=40, report_every=10),
        space,
        6,
        storage=":memory:",
        sampler="random",
        pruner="median",
        seed=0,
    )


@pytest.mark.parametrize("plot", [plot_history, plot_importances, plot_intermediate])
def test_plots_return_a_figure_without_warnings(small_study: optuna.Study, plot) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot(small_study)
    assert fig.axes and fig.axes[0].has_data()
    plt.close(fig)


def test_experimental_warning_is_silenced_only_inside_the_plot(small_study: optuna.Study) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plt.close(plot_history(small_study))
        optuna.visualization.matplotlib.plot_optimization_history(small_study)
    plt.close("all")
    experimental = [
        w for w in caught if issubclass(w.category, optuna.exceptions.ExperimentalWarning)
    ]
    assert len(experimental) == 1  # the direct call still warns: nothing is filtered globally


def test_pareto_plot_and_saved_pngs(tmp_path: Path) -> None:
    space = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})
    study = tune(
        lambda trial, p: (p["x"], (1 - p["x"]) ** 2),
        space,
        6,
        study_name="mo",
        storage=":memory:",
        directions=["minimize", "minimize"],
        sampler="random",
        pruner=None,
    )
    plt.close(plot_pareto(study))
    paths = save_plots(study, tmp_path)
    assert [p.name for p in paths] == ["mo-pareto.png"] and paths[0].read_bytes()[:4] == b"\x89PNG"


# --- the command line -------------------------------------------------------------------------


def test_cli_tunes_prints_the_best_trial_and_writes_plots(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    data = yaml.safe_load((DATA / "hpo_digits.yaml").read_text())
    data["training"] = {"steps": 40, "report_every": 10}
    config.write_text(yaml.safe_dump(data))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainopt.hpo",
            str(config),
            "--n-trials",
            "5",
            "--study-name",
            "cli",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "study cli: 5 trials" in result.stdout and "best trial:" in result.stdout
    assert "5/5" in result.stderr  # the progress bar
    assert (tmp_path / "cli.db").exists()
    assert sorted(p.name for p in (tmp_path / "cli-plots").iterdir()) == [
        "cli-contour.png",
        "cli-history.png",
        "cli-importances.png",
        "cli-intermediate.png",
        "cli-parallel.png",
    ]
