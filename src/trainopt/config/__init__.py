"""Configs shared by every section: YAML training configs, and how a command reports a mistake.

- :mod:`~trainopt.config.training`: load and validate a training config, build its optimizer
  and scheduler.
"""

from trainopt.config.training import (
    Config,
    ConfigError,
    OptimizerConfig,
    SchedulerConfig,
    build_optimizer,
    load_config,
    validate_config,
)

__all__ = [
    "Config", "ConfigError", "OptimizerConfig", "SchedulerConfig", "build_optimizer", "load_config",
    "validate_config",
]
