"""Read the logs people have into the records :func:`~trainopt.diagnostics.diagnose` takes.

:func:`read_log` reads, by what the path is:

- a Hugging Face ``trainer_state.json`` (its ``log_history``), or a ``Trainer`` output folder
  (its ``trainer_state.json``, else the one of its latest ``checkpoint-*``):
  :mod:`~trainopt.diagnostics.logs.hf`;
- TensorBoard event files (``events.out.tfevents.*``), or a folder holding them:
  :mod:`~trainopt.diagnostics.logs.tensorboard`, through the ``tensorboard`` package's reader,
  imported only then;
- CSV and JSON Lines files with named columns: :mod:`~trainopt.diagnostics.logs.tables`.

Column names are matched to the record schema by
:func:`~trainopt.diagnostics.logs.names.canonical_name` (``train/loss`` is ``loss``,
``learning_rate`` is ``lr``, ``global_step`` is ``step``...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainopt.diagnostics.logs.hf import find_trainer_state, read_trainer_state
from trainopt.diagnostics.logs.names import LogFormatError, canonical_name, normalize
from trainopt.diagnostics.logs.tables import read_csv, read_jsonl

__all__ = ["FORMATS", "LogFormatError", "canonical_name", "log_format", "normalize", "read_log"]

FORMATS = ("trainer_state", "tensorboard", "csv", "jsonl")
"""The log formats :func:`read_log` reads."""

ALLOWED = (
    "a trainer_state.json, a Trainer output folder, TensorBoard event files "
    "(events.out.tfevents.*) or a folder of them, a .csv or a .jsonl file"
)


def _event_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("events.out.tfevents.*") if p.is_file())


def log_format(path: str | Path) -> str:
    """The format of the log at ``path``: one of :data:`FORMATS`.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        LogFormatError: it is none of the formats (the message says which are read).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs import log_format
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "metrics.csv").write_text("step,loss\\n0,2.3\\n")
        >>> log_format(folder / "metrics.csv")
        'csv'
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    if path.is_dir():
        if find_trainer_state(path) is not None:
            return "trainer_state"
        if _event_files(path):
            return "tensorboard"
        raise LogFormatError(
            "path",
            f"{path} is a folder with no trainer_state.json and no event files; give {ALLOWED}",
        )
    if "tfevents" in path.name:
        return "tensorboard"
    if path.suffix == ".json":
        return "trainer_state"
    if path.suffix in (".csv", ".jsonl"):
        return path.suffix[1:]
    raise LogFormatError("path", f"{path.name} is not a log this reads; give {ALLOWED}")


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The per-step records of the log at ``path``, with the schema's names.

    Args:
        path: A file or folder of one of :data:`FORMATS` (see :func:`log_format`).

    Returns:
        One record per logged step, in step order, with ``step``, ``loss``, ``lr`` and
        ``grad_norm`` (where logged) and the other columns under their own names.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs import read_log
        >>> state = Path(tempfile.mkdtemp()) / "trainer_state.json"
        >>> _ = state.write_text(json.dumps({"log_history": [
        ...     {"loss": 2.3, "grad_norm": 1.5, "learning_rate": 1e-3, "epoch": 0.1, "step": 10},
        ...     {"eval_loss": 2.2, "epoch": 0.1, "step": 10}]}))
        >>> read_log(state)
        [{'loss': 2.3, 'grad_norm': 1.5, 'lr': 0.001, 'epoch': 0.1, 'step': 10}]
    """
    kind = log_format(path)
    path = Path(path)
    if kind == "trainer_state":
        return read_trainer_state(find_trainer_state(path) if path.is_dir() else path)
    if kind == "tensorboard":
        from trainopt.diagnostics.logs.tensorboard import read_events

        return read_events(_event_files(path) if path.is_dir() else [path])
    return read_csv(path) if kind == "csv" else read_jsonl(path)
