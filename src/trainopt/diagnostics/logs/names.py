"""The names a log gives its columns, matched to the record schema of
:func:`~trainopt.diagnostics.diagnose`, and the rows of a log made into one record per step."""

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
    "_timestamp": "wall_time",
    "wall_time": "wall_time",
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

SUMMARY = frozenset(
    {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos"}
)
"""What the Hugging Face ``Trainer`` logs once, at the end of a run (with ``train_loss``, the
run's mean loss): a row or a tag with one of these names is a summary, not a step."""

_TRAIN_PREFIX = re.compile(r"^(?:train|training|trainer)[/._-](?=.)")
_TRAIN_SUFFIX = re.compile(r"(?<=.)/(?:train|training)$")  # Loss/train, as PyTorch's tutorial
_LIGHTNING = {
    # grad_norm(module, norm_type) names the global norm grad_{norm_type}_norm_total
    re.compile(r"^grad_(?:\d+(?:\.\d+)?|inf)_norm_total$"): "grad_norm",
    # LearningRateMonitor: lr-{optimizer}, lr-{optimizer}/pg1 for the first parameter group
    re.compile(r"^lr-[^/]+(?:/pg1)?$"): "lr",
}


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

    Case, a ``train/``, ``train_`` or ``trainer/`` prefix, a ``/train`` suffix, and ``-``, ``.``
    or spaces for ``_`` don't matter: ``train/loss``, ``Loss/train``, ``Loss`` and
    ``training_loss`` are ``loss``. Lightning's names are read too: ``grad_2.0_norm_total``
    (its ``grad_norm`` utility) is ``grad_norm`` and ``lr-AdamW`` (its ``LearningRateMonitor``)
    is ``lr``. Evaluation columns (``eval/loss``, ``val_loss``, ``Loss/test``) and the
    ``Trainer``'s end-of-run summary (``train/train_loss``) keep their names: they are not the
    training loss of a step. W&B's ``_timestamp`` is ``wall_time``.

    Example:
        >>> from trainopt.diagnostics.logs import canonical_name
        >>> names = ("train/loss", "Loss/train", "GradNorm/train", "grad_2.0_norm_total",
        ...          "lr-AdamW", "global_step", "eval/loss", "Loss/test", "train/train_loss")
        >>> [canonical_name(c) for c in names]
        ['loss', 'loss', 'grad_norm', 'grad_norm', 'lr', 'step', 'eval/loss', 'loss/test',
         'train/train_loss']
    """
    name = column.strip().lower()
    for pattern, canonical in _LIGHTNING.items():
        if pattern.match(name):
            return canonical
    bare = _TRAIN_PREFIX.sub("", name)
    if bare != name and (bare in SUMMARY or bare == "train_loss"):
        return name  # train/train_loss: the Trainer's summary of the run
    simple = re.sub(r"[-. ]", "_", _TRAIN_SUFFIX.sub("", bare))
    if simple in ALIASES:
        return ALIASES[simple]
    simple = re.sub(r"[-. ]", "_", name)
    return ALIASES.get(simple, name)


def _is_summary(column: str) -> bool:
    name = column.strip().lower()
    return name in SUMMARY or _TRAIN_PREFIX.sub("", name) in SUMMARY


def _number(value: Any) -> Any:
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            return value
    return value


def _record(row: dict[str, Any], seen: set[str]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    # W&B counts its own calls in _step: a logger's step column, where there is one, wins
    for column, value in sorted(row.items(), key=lambda item: item[0] == "_step"):
        seen.add(column)
        if isinstance(value, str) and not value.strip():  # an empty cell: not logged
            continue
        record.setdefault(canonical_name(column), _number(value))
    return record


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def normalize(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per step, with the schema's names and numbers parsed, in step order.

    The rows are taken in the order written (by ``wall_time`` where the log has one). Rows of
    the same step are one record; where two give a column, the newer wins. A loss logged at a
    step below one already logged is a restart from a checkpoint: it rewrites the run from that
    step on, so the older records from there are dropped. A summary row (:data:`SUMMARY`) is not
    a step. Where the log has a training loss, a step without one (an evaluation, an empty CSV
    cell) is dropped; a loss logged as ``null`` or ``nan`` stays, and reads as NaN, and so does a
    loss of exactly 0.0 logged with a non-finite gradient norm: the Hugging Face ``Trainer``
    logs a window of non-finite losses so (:mod:`~trainopt.diagnostics.logs.hf`). A log of
    resources alone (memory, step time) keeps every row. Where two columns of a row map to one
    name, the first one wins. Steps are ints; without a step column, the row's position is its
    step.

    Raises:
        LogFormatError: no column is one :func:`~trainopt.diagnostics.diagnose` reads.

    Example:
        >>> from trainopt.diagnostics.logs import normalize
        >>> normalize([{"global_step": "1", "train/loss": "2.3", "learning_rate": "1e-3"},
        ...            {"global_step": "2", "train/loss": "2.2"},
        ...            {"global_step": "2", "learning_rate": "1e-3", "eval/loss": "2.1"},
        ...            {"global_step": "3", "train/loss": "nan"}])
        [{'step': 1, 'loss': 2.3, 'lr': 0.001},
         {'step': 2, 'loss': 2.2, 'lr': 0.001, 'eval/loss': 2.1}, {'step': 3, 'loss': nan}]
        >>> dead = [{"step": 1, "loss": 2.3}, {"step": 2, "loss": 9e9}, {"step": 3, "loss": 1e20}]
        >>> normalize(dead + [{"step": 2, "loss": 2.2}])  # restarted from its step-2 checkpoint
        [{'step': 1, 'loss': 2.3}, {'step': 2, 'loss': 2.2}]
    """
    seen: set[str] = set()
    rows = [
        (position, _record(row, seen))
        for position, row in enumerate(rows)
        if not any(_is_summary(column) for column in row)
    ]
    if any(_is_finite(record.get("wall_time")) for _, record in rows):
        rows.sort(key=lambda item: item[1].get("wall_time", -math.inf))
    by_step: dict[int, dict[str, Any]] = {}
    last_loss_step = -math.inf
    for position, record in rows:
        step = record.get("step")
        step = int(step) if _is_finite(step) else position
        record["step"] = step
        if "loss" in record:
            if step < last_loss_step:  # a restart rewrites the run from here
                by_step = {s: r for s, r in by_step.items() if s < step}
            last_loss_step = step
        by_step.setdefault(step, {}).update(record)
    records = [by_step[step] for step in sorted(by_step)]
    if any("loss" in r for r in records):
        records = [r for r in records if "loss" in r]
    elif not any(SCHEMA & r.keys() for r in records):
        raise LogFormatError(
            "loss",
            f"no column is a training loss; name it loss, train/loss or train_loss "
            f"(the columns are {sorted(seen)[:8]})",
        )
    for r in records:
        if r.get("loss") == 0.0 and "grad_norm" in r and not _is_finite(r["grad_norm"]):
            r["loss"] = math.nan
    return records
