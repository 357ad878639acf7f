"""Hyperparameter optimization on Optuna, for PyTorch training loops.

- :mod:`~trainopt.hpo.space`: search spaces declared in YAML and validated early
  (:class:`~trainopt.hpo.space.SearchSpace`), the edge check
  (:func:`~trainopt.hpo.space.params_at_edge`), learning-rate bounds from an LR range test
  (:func:`~trainopt.hpo.space.with_lr_range_from_finder`).
- :mod:`~trainopt.hpo.config`: the tuning config, which names your objective
  (:func:`~trainopt.hpo.config.load_hpo_config`).
- :mod:`~trainopt.hpo.study`: samplers, pruners, an exact trial budget
  (:func:`~trainopt.hpo.study.create_study`, :func:`~trainopt.hpo.study.tune`), and the
  isolation plot's values (:func:`~trainopt.hpo.study.isolation`).
- :mod:`~trainopt.hpo.workers`: the worker loop that any number of processes share
  (:func:`~trainopt.hpo.workers.run_worker`).
- :mod:`~trainopt.hpo.storage`: storages with atomic claims and heartbeats, so that a dead
  worker's trial runs again (:func:`~trainopt.hpo.storage.open_storage`).
- :mod:`~trainopt.hpo.reporter`: :class:`~trainopt.hpo.reporter.TrialReporter`, the training
  loop's side.
- :mod:`~trainopt.hpo.digits`: the examples' task (AdamW on the digits MLP).
- :mod:`~trainopt.hpo.plots`: history, importances, learning curves, Pareto front, isolation.
- ``python -m trainopt.hpo CONFIG --n-trials N``: the command line (:mod:`~trainopt.hpo.cli`).
"""

from trainopt.hpo.config import HPOConfig, load_hpo_config
from trainopt.hpo.reporter import TrialDiverged, TrialReporter
from trainopt.hpo.space import (
    ParamSpec,
    SearchSpace,
    lr_bounds_from_finder,
    params_at_edge,
    with_lr_range_from_finder,
)
from trainopt.hpo.storage import open_storage
from trainopt.hpo.study import (
    budget_trials,
    create_study,
    isolation,
    make_pruner,
    make_sampler,
    tune,
)
from trainopt.hpo.workers import run_trial, run_worker

__all__ = [
    "HPOConfig",
    "ParamSpec",
    "SearchSpace",
    "TrialDiverged",
    "TrialReporter",
    "budget_trials",
    "create_study",
    "isolation",
    "load_hpo_config",
    "lr_bounds_from_finder",
    "make_pruner",
    "make_sampler",
    "open_storage",
    "params_at_edge",
    "run_trial",
    "run_worker",
    "tune",
    "with_lr_range_from_finder",
]
