"""``python -m trainopt.hpo CONFIG --n-trials N [--storage URL] [--study-name S]``: tune the digits MLP.

With ``--n-trials`` the command creates the study (or tops it up to ``N`` trials in all) and
works on it; ``--create-only`` stops after that. Without ``--n-trials`` it is one more worker
on an existing study: start as many as you like, on any machine that reaches the storage.
It shows a progress bar, prints the best trial (or the Pareto front) and writes the plots.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import optuna
import torch
import yaml

from trainopt.hpo.digits import OBJECTIVES, digits_objective
from trainopt.hpo.space import SearchSpace, _config_error
from trainopt.hpo.study import (
    PRUNERS,
    SAMPLERS,
    best_trials_text,
    create_study,
    make_pruner,
    make_sampler,
    open_storage,
    run_worker,
)

SECTIONS = {"study", "training", "fixed", "search_space"}
STUDY_KEYS = {"name", "objectives", "sampler", "pruner", "prune_after", "seed"}
TRAINING_KEYS = {"steps", "report_every"}
FIXED_KEYS = {"lr", "weight_decay", "hidden", "depth", "batch_size"}


@dataclass(frozen=True)
class HPOConfig:
    """A validated tuning config (see ``docs/_data/hpo_digits.yaml``).

    Attributes:
        name: Study name.
        objectives: What to optimize, from ``val_loss``, ``val_accuracy``, ``n_params``.
        sampler: One of ``trainopt.hpo.SAMPLERS``.
        pruner: One of ``trainopt.hpo.PRUNERS``, or ``None``.
        prune_after: No trial is pruned before this step.
        seed: Seed of the sampler.
        steps: Training steps per trial.
        report_every: Steps between reports of the validation loss.
        fixed: Hyperparameters held fixed for the whole study.
        space: The search space.

    Example:
        >>> from trainopt.hpo.cli import HPOConfig
        >>> from trainopt.hpo.space import SearchSpace
        >>> config = HPOConfig("demo", SearchSpace.from_dict({"hidden": {"type": "int", "low": 16, "high": 64}}),
        ...                    objectives=("val_loss", "n_params"), pruner=None)
        >>> config.directions, type(config.make_pruner()).__name__
        (['minimize', 'minimize'], 'NopPruner')
    """

    name: str
    space: SearchSpace
    objectives: tuple[str, ...] = ("val_loss",)
    sampler: str = "tpe"
    pruner: str | None = "median"
    prune_after: int = 0
    seed: int | None = 0
    steps: int = 150
    report_every: int = 25
    fixed: dict[str, Any] = field(default_factory=dict)

    @property
    def directions(self) -> list[str]:
        return [OBJECTIVES[o] for o in self.objectives]

    def make_pruner(self) -> optuna.pruners.BasePruner:
        """The pruner this config describes."""
        return make_pruner(self.pruner, n_warmup_steps=self.prune_after)

    def objective(self, device: str | torch.device = "cpu") -> Any:
        """The objective ``(trial, params) -> value(s)`` this config describes."""
        return partial(_fixed_then_tuned, fixed=self.fixed, steps=self.steps, report_every=self.report_every,
                       objectives=self.objectives, device=device)


def _fixed_then_tuned(trial: optuna.Trial, params: dict[str, Any], fixed: dict[str, Any],
                      **kwargs: Any) -> float | list[float]:
    return digits_objective(trial, {**fixed, **params}, **kwargs)


def _section(data: Mapping[str, Any], name: str, allowed: set[str]) -> dict[str, Any]:
    section = data.get(name) or {}
    if not isinstance(section, Mapping):
        raise _config_error(name, f"must be a mapping, got {section!r}")
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise _config_error(f"{name}.{unknown[0]}", f"unknown key; {name} takes {sorted(allowed)}")
    return dict(section)


def _positive_int(value: Any, field_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _config_error(field_name, f"must be a positive int, got {value!r}")
    return value


def load_hpo_config(path: str | Path) -> HPOConfig:
    """Load and validate a tuning config; errors name the dotted field and what is allowed.

    Example:
        >>> from pathlib import Path
        >>> from trainopt.hpo.cli import load_hpo_config
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "tune.yaml"
        >>> _ = path.write_text("search_space:\\n  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}\\n")
        >>> config = load_hpo_config(path)
        >>> config.name, sorted(config.space), config.directions
        ('tune', ['lr'], ['minimize'])
    """
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, Mapping):
        raise _config_error("<root>", f"must be a mapping with sections {sorted(SECTIONS)}")
    unknown = sorted(set(data) - SECTIONS)
    if unknown:
        raise _config_error(unknown[0], f"unknown section; allowed: {sorted(SECTIONS)}")
    study = _section(data, "study", STUDY_KEYS)
    training = _section(data, "training", TRAINING_KEYS)
    fixed = _section(data, "fixed", FIXED_KEYS)
    space = SearchSpace.from_dict(data.get("search_space"), where="search_space")
    name = study.get("name", Path(path).stem)
    if not isinstance(name, str) or not name:
        raise _config_error("study.name", f"must be a non-empty string, got {name!r}")
    objectives = study.get("objectives", ["val_loss"])
    if not isinstance(objectives, list) or not objectives or any(o not in OBJECTIVES for o in objectives):
        raise _config_error("study.objectives", f"must be a non-empty list from {sorted(OBJECTIVES)}, "
                                                f"got {objectives!r}")
    sampler = study.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise _config_error("study.sampler", f"must be one of {list(SAMPLERS)}, got {sampler!r}")
    pruner = study.get("pruner", "median")
    if pruner not in (*PRUNERS, None):
        raise _config_error("study.pruner", f"must be one of {list(PRUNERS)} or null, got {pruner!r}")
    prune_after = study.get("prune_after", 0)
    if isinstance(prune_after, bool) or not isinstance(prune_after, int) or prune_after < 0:
        raise _config_error("study.prune_after", f"must be a non-negative int, got {prune_after!r}")
    seed = study.get("seed", 0)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _config_error("study.seed", f"must be an int or null, got {seed!r}")
    overlap = sorted(set(fixed) & set(space))
    if overlap:
        raise _config_error(f"fixed.{overlap[0]}", "is also in search_space: a hyperparameter is either fixed or tuned")
    return HPOConfig(
        name=name, space=space, objectives=tuple(objectives), sampler=sampler, pruner=pruner,
        prune_after=prune_after, seed=seed,
        steps=_positive_int(training.get("steps", 150), "training.steps"),
        report_every=_positive_int(training.get("report_every", 25), "training.report_every"),
        fixed=fixed,
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line's argument parser.

    Example:
        >>> from trainopt.hpo.cli import build_parser
        >>> args = build_parser().parse_args(["tune.yaml", "--n-trials", "8", "--storage", "journal:tune.log"])
        >>> args.n_trials, args.storage, args.create_only
        (8, 'journal:tune.log', False)
    """
    parser = argparse.ArgumentParser(prog="python -m trainopt.hpo", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="tuning config (YAML), e.g. docs/_data/hpo_digits.yaml")
    parser.add_argument("--n-trials", type=int, help="create the study, or top it up, to N trials in all; "
                                                     "leave out to join an existing study as a worker")
    parser.add_argument("--storage", help="sqlite:///study.db (default: <study-name>.db), "
                                          "postgresql+psycopg2://..., or journal:study.log")
    parser.add_argument("--study-name", help="study name (default: study.name of the config)")
    parser.add_argument("--create-only", action="store_true", help="create the study, run no trial")
    parser.add_argument("--plots", type=Path, help="directory for the PNG plots (default: <study-name>-plots)")
    parser.add_argument("--no-plots", action="store_true", help="write no plots (e.g. in all workers but one)")
    parser.add_argument("--device", help="where trials train (default: cuda if available, else cpu)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m trainopt.hpo``; returns the exit status.

    Example:
        >>> from pathlib import Path
        >>> from trainopt.hpo.cli import main
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "tune.yaml").write_text("search_space:\\n  lr: {type: float, low: 1.0e-4, high: 1.0e-1}\\n")
        >>> main([str(folder / "tune.yaml"), "--n-trials", "4", "--storage", f"sqlite:///{folder}/tune.db",
        ...       "--create-only"])
        study tune: 4 trials, 0 complete, 0 pruned, 0 fail
        no trial completed
        0
    """
    args = build_parser().parse_args(argv)

    config = load_hpo_config(args.config)
    name = args.study_name or config.name
    storage = args.storage or f"sqlite:///{name}.db"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.n_trials is not None:
        study = create_study(name, args.n_trials, storage, directions=config.directions,
                             sampler=config.sampler, pruner=config.make_pruner(), seed=config.seed,
                             space=config.space)
    else:
        try:
            study = optuna.load_study(study_name=name, storage=open_storage(storage),
                                      sampler=make_sampler(config.sampler, config.seed, config.space),
                                      pruner=config.make_pruner())
        except KeyError:
            print(f"no study {name!r} in {storage}: create it with --n-trials N", file=sys.stderr)
            return 2
    if not args.create_only:
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        run_worker(study, config.space, config.objective(device), show_progress_bar=not args.no_progress,
                   reseed=args.n_trials is None)
    print(best_trials_text(study))
    if not args.create_only and not args.no_plots:
        from trainopt.hpo.plots import save_plots

        for path in save_plots(study, args.plots or Path(f"{name}-plots")):
            print(f"wrote {path}")
    return 0

