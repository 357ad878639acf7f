"""Configs shared by every section: YAML training configs, and how a command reports a mistake.

- :mod:`~trainopt.config.training`: load and validate a training config, build its optimizer
  and scheduler.
- :mod:`~trainopt.config.errors`: :class:`~trainopt.config.errors.ConfigError`, the one error a
  bad config raises, naming the dotted field.
- :mod:`~trainopt.config.cli`: how every command line reports a mistake (one line, status 2).
- :mod:`~trainopt.config.optimizers`: the one vocabulary of optimizers (``sgd``,
  ``sgd_momentum``, ``adam``, ``adamw``): class, settings, bytes of state.
- :mod:`~trainopt.config.precisions`: the one vocabulary of precisions (``fp32``, ``tf32``,
  ``bf16``, ``fp16``) and autocast's dtype for each.
"""

from trainopt.config.errors import ConfigError
from trainopt.config.training import (
    Config,
    OptimizerConfig,
    SchedulerConfig,
    build_optimizer,
    load_config,
    validate_config,
)

__all__ = [
    "Config",
    "ConfigError",
    "OptimizerConfig",
    "SchedulerConfig",
    "build_optimizer",
    "load_config",
    "validate_config",
]
