"""trainopt: training optimization for PyTorch.

One package per section of the documentation site:

- :mod:`trainopt.schedules`: learning-rate scheduling;
- :mod:`trainopt.stability`: clipping, loss scaling, monitors, checkpoints, recovery;
- :mod:`trainopt.hpo`: hyperparameter optimization on Optuna;
- :mod:`trainopt.perf`: precision, memory, profiling, monitoring, benchmarks, distributed training;
- :mod:`trainopt.concepts`: reference update rules;
- :mod:`trainopt.diagnostics`: name the problem of a run from its logs;
- shared: :mod:`trainopt.config`, :mod:`trainopt.models`, :mod:`trainopt.data`.

Import from the section package, e.g. ``from trainopt.schedules import cosine_annealing_schedule``.
"""

__version__ = "0.5.0"
