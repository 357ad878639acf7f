"""The stabilizer's settings in two groups, one name per knob everywhere.

Both front doors (:class:`~trainopt.stability.stabilizer.TrainingStabilizer` and
:class:`~trainopt.stability.integrations.guard.GuardedOptimizer`) take the same two objects:

- :class:`Detection`: what counts as a bad step (the monitors' settings);
- :class:`Rollback`: when stable states are saved and what a rollback does.

Each is checked when it is built, with an error that names the field and what is allowed. The
knobs that every loop sets (``checkpoint_dir``, ``check_every``, ``max_grad_norm``, ``dtype``,
...) stay keyword arguments of the front doors.

Deprecated, for one release (each warns with :class:`DeprecationWarning` and keeps working):

- the front doors' flat keywords for these knobs (``TrainingStabilizer(..., spike_factor=3.0)``):
  give ``detection=Detection(spike_factor=3.0)`` instead;
- the second names of three knobs: ``max_recovery_attempts`` (say ``max_rollbacks``, in
  :class:`~trainopt.stability.recovery.rollback.TrainingRecovery`), ``save_frequency`` (say
  ``save_every``, in :class:`~trainopt.stability.checkpointing.checkpoint.CheckpointManager`) and
  ``threshold`` (say ``spike_factor``, in the loss monitors);
- :class:`~trainopt.stability.recovery.rollback.TrainingRecovery`'s scoring knobs (``spike_factor``,
  ``spike_threshold``, ``explosion_factor``, ``min_history``): the monitors score spikes now, so
  these warn and are ignored (say ``Detection(...)``);
- ``TrainingStabilizer.total_skipped`` (say ``skipped_steps``, as the guard does) and the front
  doors' ``check()`` (say ``end_window()``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from trainopt.validation import check_int, check_number

__all__ = ["Detection", "Rollback", "deprecated_name", "grouped_settings"]

# old name -> the one name it now has
RENAMED = {
    "max_recovery_attempts": "max_rollbacks",
    "save_frequency": "save_every",
    "spike_threshold": "spike_factor",
    "threshold": "spike_factor",
}


@dataclasses.dataclass(frozen=True)
class Detection:
    """What counts as a bad step: the loss and gradient-norm monitors' settings.

    Args:
        spike_factor: How far above the window's range a loss must lie to be flagged, in units
            of the range (:func:`~trainopt.stability.monitoring.statistics.tail_score`).
        explosion_factor: The same for the global gradient norm.
        window_size: Accepted steps the range is measured over.
        min_history: Accepted steps before the range tests apply (a non-finite loss or gradient
            is flagged from the first step).
        skip_unstable: Also skip the steps these tests flag (non-finite ones are always skipped).

    Example:
        >>> from trainopt.stability import Detection
        >>> Detection(spike_factor=3.0).window_size
        100
        >>> try:
        ...     Detection(window_size=1)
        ... except ValueError as error:
        ...     print(error)
        Detection.window_size must be an int >= 2, got window_size=1
    """

    spike_factor: float = 4.0
    explosion_factor: float = 6.0
    window_size: int = 100
    min_history: int = 20
    skip_unstable: bool = True

    def __post_init__(self) -> None:
        check_number("spike_factor", self.spike_factor, owner="Detection")
        check_number("explosion_factor", self.explosion_factor, owner="Detection")
        check_int("window_size", self.window_size, 2, owner="Detection")
        check_int("min_history", self.min_history, 2, owner="Detection")
        if self.min_history > self.window_size:
            raise ValueError(
                f"Detection.min_history must be <= window_size ({self.window_size}), "
                f"got min_history={self.min_history}"
            )
        if not isinstance(self.skip_unstable, bool):
            raise ValueError(
                f"Detection.skip_unstable must be True or False, "
                f"got skip_unstable={self.skip_unstable!r}"
            )


@dataclasses.dataclass(frozen=True)
class Rollback:
    """When stable states are saved and what a rollback does (with a ``checkpoint_dir``).

    Args:
        save_every: Steps between checkpoints (``None``: ``check_every``); one is written at the
            first safe boundary at least this many steps after the last.
        keep_last: Step checkpoints kept on disk (``None``: all).
        lr_factor: Learning-rate multiplier of each rollback, in (0, 1] (cumulative: the
            schedule keeps it).
        max_rollbacks: Rollbacks before
            :class:`~trainopt.stability.recovery.rollback.TrainingInstabilityError`.
        patience: Consecutive flagged steps that call for a rollback.
        skip_batches: Batches to skip after a rollback.

    Example:
        >>> from trainopt.stability import Rollback
        >>> Rollback(lr_factor=0.25).max_rollbacks
        3
        >>> try:
        ...     Rollback(lr_factor=2.0)
        ... except ValueError as error:
        ...     print(error)
        Rollback.lr_factor must be a number in (0, 1], got lr_factor=2.0
    """

    save_every: int | None = None
    keep_last: int | None = 3
    lr_factor: float = 0.5
    max_rollbacks: int = 3
    patience: int = 10
    skip_batches: int = 0

    def __post_init__(self) -> None:
        check_int("save_every", self.save_every, 1, none_ok=True, owner="Rollback")
        check_int("keep_last", self.keep_last, 1, none_ok=True, owner="Rollback")
        check_number("lr_factor", self.lr_factor, high=1.0, high_open=False, owner="Rollback")
        check_int("max_rollbacks", self.max_rollbacks, 1, owner="Rollback")
        check_int("patience", self.patience, 1, owner="Rollback")
        check_int("skip_batches", self.skip_batches, 0, owner="Rollback")


def deprecated_name(owner: str, old: str, value: Any, new_value: Any, default: Any) -> Any:
    """The value of a renamed keyword: the old name's (with a warning) or the new one's.

    Example:
        >>> import warnings
        >>> from trainopt.stability.config import deprecated_name
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     deprecated_name("CheckpointManager", "save_frequency", 10, 1000, 1000)
        10
        >>> print(caught[0].message)
        CheckpointManager(save_frequency=...) is deprecated: say save_every=...
    """
    if value is None:
        return new_value
    new = RENAMED[old]
    if new_value != default:
        raise TypeError(f"{owner}() got both {old}= and {new}= (the same knob): give {new}= only")
    warnings.warn(
        f"{owner}({old}=...) is deprecated: say {new}=...", DeprecationWarning, stacklevel=3
    )
    return value


def grouped_settings(
    owner: str, detection: Detection | None, rollback: Rollback | None, flat: dict[str, Any]
) -> tuple[Detection, Rollback]:
    """Fold a front door's deprecated flat keywords into its :class:`Detection` and
    :class:`Rollback`.

    Example:
        >>> import warnings
        >>> from trainopt.stability.config import grouped_settings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     detection, rollback = grouped_settings("TrainingStabilizer", None, None,
        ...                                            {"spike_factor": 3.0, "lr_factor": 0.25})
        >>> detection.spike_factor, rollback.lr_factor
        (3.0, 0.25)
        >>> print(str(caught[0].message).replace(": ", ":\\n"))
        TrainingStabilizer(spike_factor=...) is deprecated:
        say detection=Detection(spike_factor=...)
    """
    groups = {"detection": (Detection, detection), "rollback": (Rollback, rollback)}
    fields = {f.name: group for group, (cls, _) in groups.items() for f in dataclasses.fields(cls)}
    values: dict[str, dict[str, Any]] = {"detection": {}, "rollback": {}}
    for name, value in flat.items():
        if name not in fields:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        group = fields[name]
        cls_name = groups[group][0].__name__
        if groups[group][1] is not None:
            raise TypeError(
                f"{owner}() got both {group}= and {name}=: give {group}={cls_name}({name}=...) only"
            )
        warnings.warn(
            f"{owner}({name}=...) is deprecated: say {group}={cls_name}({name}=...)",
            DeprecationWarning,
            stacklevel=3,
        )
        values[group][name] = value
    built = []
    for group, (cls, given) in groups.items():
        if given is None:
            given = cls(**values[group])
        elif not isinstance(given, cls):
            raise TypeError(
                f"{owner}({group}=...) must be a {cls.__name__}, got a {type(given).__name__}"
            )
        built.append(given)
    return built[0], built[1]
