"""trainopt: training optimization for PyTorch.

Learning-rate schedules, training stability (clipping, loss scaling, monitors, checkpoints,
recovery), hyperparameter optimization on Optuna, and performance tools (precision, memory,
profiling, throughput, benchmarks, distributed). Each family lives in its own module; import
what you use, e.g. ``from trainopt.schedules import cosine_annealing_schedule``.
"""

__version__ = "0.1.0"
