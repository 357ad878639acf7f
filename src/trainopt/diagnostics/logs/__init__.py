"""Read the logs people have into the records :func:`~trainopt.diagnostics.diagnose` takes.

:func:`read_log` reads, by what the path is:

- a Hugging Face ``trainer_state.json`` (its ``log_history``):
  :mod:`~trainopt.diagnostics.logs.hf`;
- TensorBoard event files (``events.out.tfevents.*``):
  :mod:`~trainopt.diagnostics.logs.tensorboard`, through the ``tensorboard`` package's reader,
  imported only then;
- CSV and JSON Lines files with named columns (W&B's CSV export, Lightning's ``metrics.csv``):
  :mod:`~trainopt.diagnostics.logs.tables`;
- a folder (a ``Trainer`` output folder, a TensorBoard or Lightning log folder): the newest log
  in it (:func:`logs_in`).

It returns a :class:`~trainopt.diagnostics.logs.log.Log`: the records, the files read, the
other logs found beside them, and the run's settings. Column names are matched to the record
schema by :func:`~trainopt.diagnostics.logs.names.canonical_name` (``train/loss`` is ``loss``,
``learning_rate`` is ``lr``, ``global_step`` is ``step``...).
"""

from __future__ import annotations

from pathlib import Path

from trainopt.diagnostics.logs.hf import read_trainer_state, trainer_states
from trainopt.diagnostics.logs.log import Log
from trainopt.diagnostics.logs.names import LogFormatError, canonical_name, normalize
from trainopt.diagnostics.logs.tables import read_csv, read_jsonl
from trainopt.diagnostics.logs.tensorboard import read_events, settings_beside, started

__all__ = [
    "FORMATS",
    "Log",
    "LogFormatError",
    "canonical_name",
    "log_format",
    "logs_in",
    "normalize",
    "read_log",
]

FORMATS = ("trainer_state", "tensorboard", "csv", "jsonl")
"""The log formats :func:`read_log` reads."""

ALLOWED = (
    "a trainer_state.json, a Trainer output folder, TensorBoard event files "
    "(events.out.tfevents.*) or a folder of them, a .csv or a .jsonl file"
)


def logs_in(folder: str | Path) -> list[tuple[str, list[Path]]]:
    """The logs in a folder, oldest first: ``(format, files)`` for each ``trainer_state.json``
    (the ``Trainer``'s own and its checkpoints'), each Lightning ``metrics.csv``, and the
    TensorBoard event files (all of them: :func:`read_log` reads their newest run).

    A file is as new as when it was last written (two runs into one output folder: the newer
    run's checkpoints are newer, whatever their numbers); event files, as when their newest was
    started (a ``Trainer``'s checkpoints, written during the run, are newer than its events).

    Example:
        >>> import os, tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs import logs_in
        >>> out = Path(tempfile.mkdtemp())
        >>> (out / "checkpoint-50").mkdir()
        >>> _ = (out / "checkpoint-50" / "trainer_state.json").write_text("{}")
        >>> (out / "runs" / "Dec02_10-24-53_vm").mkdir(parents=True)
        >>> events = out / "runs" / "Dec02_10-24-53_vm" / "events.out.tfevents.4102444800.vm.1.0"
        >>> _ = events.write_bytes(b"")  # started in 2100: newer than the checkpoint
        >>> [(fmt, [f.name for f in files]) for fmt, files in logs_in(out)]
        [('trainer_state', ['trainer_state.json']),
         ('tensorboard', ['events.out.tfevents.4102444800.vm.1.0'])]
    """
    folder = Path(folder)
    found = [(p.stat().st_mtime, "trainer_state", [p]) for p in trainer_states(folder)]
    found += [(p.stat().st_mtime, "csv", [p]) for p in folder.rglob("metrics.csv") if p.is_file()]
    events = sorted(p for p in folder.rglob("events.out.tfevents.*") if p.is_file())
    if events:
        found.append((max(started(p) for p in events), "tensorboard", events))
    return [(fmt, files) for _, fmt, files in sorted(found, key=lambda item: item[0])]


def log_format(path: str | Path) -> str:
    """The format of the log at ``path`` (for a folder, of the newest log in it): one of
    :data:`FORMATS`.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        LogFormatError: it is none of the formats (the message says which are read).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs import log_format
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "metrics.csv").write_text("step,loss\\n0,2.3\\n")
        >>> log_format(folder / "metrics.csv"), log_format(folder)
        ('csv', 'csv')
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    if path.is_dir():
        found = logs_in(path)
        if not found:
            raise LogFormatError(
                "path",
                f"{path} is a folder with no trainer_state.json, metrics.csv or event files; "
                f"give {ALLOWED}",
            )
        return found[-1][0]
    if "tfevents" in path.name:
        return "tensorboard"
    if path.suffix == ".json":
        return "trainer_state"
    if path.suffix in (".csv", ".jsonl"):
        return path.suffix[1:]
    raise LogFormatError("path", f"{path.name} is not a log this reads; give {ALLOWED}")


def _read(kind: str, files: list[Path]) -> Log:
    if kind == "tensorboard":
        return read_events(files)
    if kind == "trainer_state":  # its settings are in the run's events, where it has some
        log = read_trainer_state(files[0])
        return Log(log.records, kind, log.files, settings=settings_beside(files[0], log.records))
    return (read_csv if kind == "csv" else read_jsonl)(files[0])


def read_log(path: str | Path) -> Log:
    """The log at ``path``: its per-step records, with the schema's names, and the file read.

    Args:
        path: A file of one of :data:`FORMATS`, or a folder: then its newest log is read (see
            :func:`logs_in`), and the others are named in the returned log's ``others``.

    Returns:
        A :class:`~trainopt.diagnostics.logs.log.Log`: one record per logged step, in step
        order, with ``step``, ``loss``, ``lr`` and ``grad_norm`` (where logged) and the other
        columns under their own names; the files read; the run's settings.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs import read_log
        >>> output = Path(tempfile.mkdtemp())
        >>> _ = (output / "trainer_state.json").write_text(json.dumps({"log_history": [
        ...     {"loss": 2.3, "grad_norm": 1.5, "learning_rate": 1e-3, "epoch": 0.1, "step": 10},
        ...     {"eval_loss": 2.2, "epoch": 0.1, "step": 10}]}))
        >>> log = read_log(output)
        >>> log.files[0].name, log.records  # the evaluation of step 10 is under its own name
        ('trainer_state.json',
         [{'loss': 2.3, 'grad_norm': 1.5, 'lr': 0.001, 'epoch': 0.1, 'step': 10, 'eval_loss': 2.2}])
    """
    kind = log_format(path)
    path = Path(path)
    if not path.is_dir():
        return _read(kind, [path])
    *older, (_, files) = logs_in(path)
    log = _read(kind, files)
    others = tuple(f for _, fs in older for f in fs) + log.others
    return Log(log.records, log.format, log.files, others, log.settings)
