"""The names a log gives its columns, matched to the record schema of
:func:`~trainopt.diagnostics.diagnose`."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from trainopt.config.cli import UsageError
from trainopt.diagnostics.records import ALIASES as MONITOR_NAMES

ALIASES: dict[str, str] = {
    "loss": "loss",
    "train_loss": "loss",
    "training_loss": "loss",
    "loss_step": "loss",
    "lr": "lr",
    "learning_rate": "lr",
    "learningrate": "lr",
    "grad_norm": "grad_norm",
    "gradient_norm": "grad_norm",
    "grad_norm_total": "grad_norm",
    "global_grad_norm": "grad_norm",
    "gradnorm": "grad_norm",
    "step": "step",
    "global_step": "step",
    "iteration": "step",
    "iter": "step",
    "_step": "step",
    "trainer_global_step": "step",
}
"""A column's simplified name (:func:`canonical_name`) -> its name in the record schema."""

SCHEMA = frozenset(
    {
        "loss",
        "grad_norm",
        "lr",
        "step_time",
        "tokens_per_s",
        "comm_time",
        "memory_allocated",
        "memory_reserved",
        "max_memory",
    }
    | {name for name, _ in MONITOR_NAMES.values()}
)
"""The columns :func:`~trainopt.diagnostics.diagnose` reads (besides ``step``)."""

_TRAIN_PREFIX = re.compile(r"^(?:train|training|trainer)[/._-](?=.)")


class LogFormatError(UsageError):
    """A log that can't be read: the field (``path``, or a column) and what is allowed.

    A :class:`~trainopt.config.cli.UsageError`, so ``python -m trainopt.diagnostics`` prints it
    as one line and exits 2.

    Example:
        >>> from trainopt.diagnostics.logs import LogFormatError
        >>> str(LogFormatError("loss", "no column named loss"))
        'loss: no column named loss'
    """


def canonical_name(column: str) -> str:
    """The schema's name for a log's ``column`` (its own name, lower-cased, if none matches).

    Case, a ``train/``, ``train_`` or ``trainer/`` prefix, and ``-``, ``.`` or spaces for ``_``
    don't matter: ``train/loss``, ``Loss`` and ``training_loss`` are ``loss``. Evaluation
    columns (``eval/loss``, ``val_loss``) keep their names: they are not the training loss.

    Example:
        >>> from trainopt.diagnostics.logs import canonical_name
        >>> names = ("train/loss", "learning_rate", "train/grad_norm", "global_step", "eval/loss",
        ...          "lr-AdamW")
        >>> [canonical_name(c) for c in names]
        ['loss', 'lr', 'grad_norm', 'step', 'eval/loss', 'lr-adamw']
    """
    name = column.strip().lower()
    simple = re.sub(r"[-. ]", "_", _TRAIN_PREFIX.sub("", name))
    if simple in ALIASES:
        return ALIASES[simple]
    simple = re.sub(r"[-. ]", "_", name)
    return ALIASES.get(simple, name)


def _number(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            return value
    return value


def normalize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with the schema's names, numbers parsed, sorted by step.

    Where the log has a training loss, a row without one (an evaluation or a summary line, or
    an empty CSV cell) is dropped; a loss logged as ``null`` or ``nan`` stays, and reads as NaN.
    A log of resources alone (memory, step time) keeps every row. Where two columns
    map to one name, the first one wins. Steps are ints; without a step column, the row's
    position is its step.

    Raises:
        LogFormatError: no column is one :func:`~trainopt.diagnostics.diagnose` reads.

    Example:
        >>> from trainopt.diagnostics.logs import normalize
        >>> normalize([{"global_step": "2", "train/loss": "nan", "learning_rate": "1e-3"},
        ...            {"global_step": "1", "train/loss": "2.3", "learning_rate": "1e-3"},
        ...            {"global_step": "2", "eval/loss": "2.1"}])
        [{'step': 1, 'loss': 2.3, 'lr': 0.001}, {'step': 2, 'loss': nan, 'lr': 0.001}]
    """
    records = []
    seen: set[str] = set()
    for position, row in enumerate(rows):
        record: dict[str, Any] = {}
        for column, value in row.items():
            seen.add(column)
            name = canonical_name(column)
            if name not in record and not (
                isinstance(value, str) and not value.strip()
            ):  # an empty cell: not logged
                record[name] = _number(value)
        step = record.get("step")
        record["step"] = (
            int(step) if isinstance(step, (int, float)) and math.isfinite(step) else position
        )
        records.append(record)
    if any("loss" in r for r in records):
        records = [r for r in records if "loss" in r]
    elif not any(SCHEMA & r.keys() for r in records):
        raise LogFormatError(
            "loss",
            f"no column is a training loss; name it loss, train/loss or train_loss "
            f"(the columns are {sorted(seen)[:8]})",
        )
    return sorted(records, key=lambda r: r["step"])
