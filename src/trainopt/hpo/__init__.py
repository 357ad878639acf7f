"""Hyperparameter optimization on Optuna, for PyTorch training loops.

- :mod:`~trainopt.hpo.space`: search spaces declared in YAML and validated early
  (:class:`~trainopt.hpo.space.SearchSpace`), the edge check
  (:func:`~trainopt.hpo.space.params_at_edge`), learning-rate bounds from an LR range test
  (:func:`~trainopt.hpo.space.seed_lr_range`).
- :mod:`~trainopt.hpo.study`: samplers, pruners, storages, an exact trial budget shared by
  any number of workers (:func:`~trainopt.hpo.study.create_study`,
  :func:`~trainopt.hpo.study.run_worker`, :func:`~trainopt.hpo.study.tune`).
- :mod:`~trainopt.hpo.reporter`: :class:`~trainopt.hpo.reporter.TrialReporter`, the training loop's side.
- :mod:`~trainopt.hpo.digits`: the examples' task (AdamW on the digits MLP).
- :mod:`~trainopt.hpo.plots`: history, importances, learning curves, Pareto front.
- ``python -m trainopt.hpo CONFIG --n-trials N``: the command line (:mod:`~trainopt.hpo.cli`).
"""

from trainopt.hpo.reporter import TrialDiverged, TrialReporter
from trainopt.hpo.space import (
    ParamSpec,
    SearchSpace,
    load_search_space,
    lr_bounds_from_finder,
    params_at_edge,
    seed_lr_range,
)
from trainopt.hpo.study import (
    PRUNERS,
    SAMPLERS,
    best_trials_text,
    create_study,
    make_pruner,
    make_sampler,
    open_storage,
    run_trial,
    run_worker,
    tune,
)

__all__ = [
    "PRUNERS", "SAMPLERS", "ParamSpec", "SearchSpace", "TrialDiverged", "TrialReporter",
    "best_trials_text", "create_study", "load_search_space", "lr_bounds_from_finder", "make_pruner",
    "make_sampler", "open_storage", "params_at_edge", "run_trial", "run_worker", "seed_lr_range", "tune",
]
