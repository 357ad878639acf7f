"""What reading a log gives: the records, the files they come from, and the run's settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Log:
    """A run's log as :func:`~trainopt.diagnostics.logs.read_log` read it.

    Attributes:
        records: One record per logged step, in step order, with the schema's names (see
            :func:`~trainopt.diagnostics.logs.normalize`).
        format: One of :data:`~trainopt.diagnostics.logs.FORMATS`.
        files: The files the records were read from.
        others: Logs of other, older runs found beside them, and not read.
        settings: The run's settings the log carries, that the advice takes into account:
            ``max_grad_norm`` (the norm the run clips gradients to; 0 for none) from the
            arguments a Hugging Face ``Trainer`` writes to TensorBoard.

    Example:
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs import Log
        >>> log = Log([{"step": 0, "loss": 2.3}], "csv", (Path("metrics.csv"),))
        >>> log.files[0].name, log.others, log.settings
        ('metrics.csv', (), {})
    """

    records: list[dict[str, Any]]
    format: str
    files: tuple[Path, ...]
    others: tuple[Path, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)
