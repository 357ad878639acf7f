"""Hugging Face ``Trainer`` logs: the ``log_history`` of ``trainer_state.json``.

The ``Trainer`` writes ``trainer_state.json`` into each ``checkpoint-*`` folder it saves and,
on ``trainer.save_state()``, into its output folder. ``log_history`` holds one entry every
``logging_steps`` steps (``loss``, ``grad_norm``, ``learning_rate``, ``epoch``, ``step``), the
evaluations (``eval_loss``...) and a summary at the end (``train_runtime``...). Only the
training entries are records. Reading it needs no ``transformers``: it is plain JSON.

With ``logging_nan_inf_filter=True`` (the ``Trainer``'s default) a NaN or Inf loss is logged as
the mean of the finite ones, but ``grad_norm`` is logged as it is: a NaN run is still found.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainopt.diagnostics.logs.names import LogFormatError, normalize


def find_trainer_state(folder: str | Path) -> Path | None:
    """The ``trainer_state.json`` of a ``Trainer`` output folder: its own, else its latest
    checkpoint's.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs.hf import find_trainer_state
        >>> out = Path(tempfile.mkdtemp())
        >>> for step in (500, 1000):
        ...     (out / f"checkpoint-{step}").mkdir()
        ...     _ = (out / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
        >>> find_trainer_state(out).parent.name
        'checkpoint-1000'
    """
    folder = Path(folder)
    if (folder / "trainer_state.json").is_file():
        return folder / "trainer_state.json"
    checkpoints = [
        (int(m[1]), p)
        for p in folder.glob("checkpoint-*/trainer_state.json")
        if (m := re.fullmatch(r"checkpoint-(\d+)", p.parent.name))
    ]
    return max(checkpoints)[1] if checkpoints else None


def read_trainer_state(path: str | Path) -> list[dict[str, Any]]:
    """The training records of a ``trainer_state.json`` (``learning_rate`` read as ``lr``).

    Raises:
        LogFormatError: the file is not JSON, or has no ``log_history`` list.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs.hf import read_trainer_state
        >>> state = Path(tempfile.mkdtemp()) / "trainer_state.json"
        >>> _ = state.write_text(json.dumps({"global_step": 2, "log_history": [
        ...     {"loss": 2.3, "learning_rate": 1e-3, "step": 1},
        ...     {"loss": 2.1, "learning_rate": 1e-3, "step": 2},
        ...     {"train_runtime": 1.5, "train_loss": 2.2, "step": 2}]}))
        >>> [(r["step"], r["loss"]) for r in read_trainer_state(state)]
        [(1, 2.3), (2, 2.1)]
    """
    path = Path(path)
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise LogFormatError(
            "path",
            f"{path.name} is not JSON ({exc.msg} at line {exc.lineno}); give a trainer_state.json",
        ) from exc
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise LogFormatError(
            "log_history",
            f"{path.name} has no log_history list: a Hugging Face trainer_state.json has one",
        )
    # the summary entry's train_loss is the run's mean loss, not a step's
    return normalize(
        {k: v for k, v in entry.items() if k != "train_loss"}
        for entry in history
        if isinstance(entry, dict)
    )
