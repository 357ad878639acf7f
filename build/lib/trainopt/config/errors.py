"""The one error a bad config raises, shared by every config of the package.

:class:`ConfigError` names the dotted field that is wrong and what it allows. A command line
reports it as one line, ``error: <field>: <what is allowed>`` (see :mod:`trainopt.config.cli`).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A config field is missing, unknown or invalid; the message names the dotted field.

    Example:
        >>> from trainopt.config import ConfigError
        >>> from trainopt.config import validate_config
        >>> try:
        ...     optimizer = {"type": "lion", "lr": 0.1}
        ...     scheduler = {"type": "step_decay", "decay_steps": 10}
        ...     validate_config({"training": {"optimizer": optimizer, "scheduler": scheduler}})
        ... except ConfigError as error:
        ...     print(error.field, "|", error)
        training.optimizer.type | training.optimizer.type: must be one of ['sgd', 'adam',
            'adamw'], got 'lion'
    """

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}")
        self.field = field_path
