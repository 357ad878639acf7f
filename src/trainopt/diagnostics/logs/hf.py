"""Hugging Face ``Trainer`` logs: the ``log_history`` of ``trainer_state.json``, and the settings
of the run.

The ``Trainer`` writes ``trainer_state.json`` into each ``checkpoint-*`` folder it saves and,
on ``trainer.save_state()``, into its output folder. ``log_history`` holds one entry every
``logging_steps`` steps (``loss``, ``grad_norm``, ``learning_rate``, ``epoch``, ``step``), the
evaluations (``eval_loss``...) and a summary at the end (``train_runtime``, ``train_loss``...).
Only the training entries are records. Reading it needs no ``transformers``: it is plain JSON.

With ``logging_nan_inf_filter=True`` (the ``Trainer``'s default) a non-finite loss is not
added to the logged mean: it adds the mean of the window's steps so far instead, so a window
whose steps are all non-finite logs a loss of 0.0 (transformers 5.24), while ``grad_norm`` is
logged as it is (NaN). :func:`~trainopt.diagnostics.logs.normalize` reads such a 0.0 as NaN. A
NaN in a window whose last step is finite leaves no trace in the log.

The ``Trainer`` keeps its arguments in ``training_args.bin``, a pickle that is not read here
(loading it could run code); with ``report_to="tensorboard"`` it also writes them, as JSON, to
its TensorBoard events (the ``args`` text): :func:`run_settings` reads ``max_grad_norm`` there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainopt.diagnostics.logs.log import Log
from trainopt.diagnostics.logs.names import LogFormatError, normalize


def trainer_states(folder: str | Path) -> list[Path]:
    """Every ``trainer_state.json`` of a ``Trainer`` output folder, by step: its checkpoints',
    then its own (``trainer.save_state()`` writes it at the end).

    Two runs can share an output folder, so the highest checkpoint may be an older run's:
    :func:`~trainopt.diagnostics.logs.logs_in` takes the one written last.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs.hf import trainer_states
        >>> out = Path(tempfile.mkdtemp())
        >>> for step in (1000, 500):
        ...     (out / f"checkpoint-{step}").mkdir()
        ...     _ = (out / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
        >>> [p.parent.name for p in trainer_states(out)]
        ['checkpoint-500', 'checkpoint-1000']
    """
    folder = Path(folder)
    found = [
        (int(m[1]), p)
        for p in folder.glob("checkpoint-*/trainer_state.json")
        if (m := re.fullmatch(r"checkpoint-(\d+)", p.parent.name))
    ]
    own = [folder / "trainer_state.json"] if (folder / "trainer_state.json").is_file() else []
    return [p for _, p in sorted(found)] + own


def args_settings(args: dict[str, Any]) -> dict[str, Any]:
    """The settings the advice uses, from a ``Trainer``'s arguments (``TrainingArguments`` as a
    dict): ``max_grad_norm``, the norm it clips gradients to (0 or None: no clipping).

    Example:
        >>> from trainopt.diagnostics.logs.hf import args_settings
        >>> args_settings({"max_grad_norm": 1.0, "learning_rate": 5e-5}), args_settings({})
        ({'max_grad_norm': 1.0}, {})
    """
    value = args.get("max_grad_norm", "unset")
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return {"max_grad_norm": float(value or 0.0)}
    return {}


def run_settings(texts: dict[str, str]) -> dict[str, Any]:
    """The settings of a ``Trainer`` run from the texts of its TensorBoard events (the ``args``
    text the ``Trainer`` writes as JSON); ``{}`` for events that are not a ``Trainer``'s.

    Example:
        >>> from trainopt.diagnostics.logs.hf import run_settings
        >>> run_settings({"args/text_summary": '{"max_grad_norm": 0.5}'}), run_settings({})
        ({'max_grad_norm': 0.5}, {})
    """
    text = texts.get("args/text_summary", texts.get("args"))
    try:
        args = json.loads(text) if text else None
    except json.JSONDecodeError:
        return {}
    return args_settings(args) if isinstance(args, dict) else {}


def _history(path: Path) -> list[dict[str, Any]]:
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
    return [entry for entry in history if isinstance(entry, dict)]


def read_trainer_state(path: str | Path) -> Log:
    """The training records of a ``trainer_state.json`` (``learning_rate`` read as ``lr``).

    The run's settings are not in it: :func:`~trainopt.diagnostics.logs.read_log` reads them
    from the run's TensorBoard events beside it, where there are some
    (:func:`~trainopt.diagnostics.logs.tensorboard.settings_beside`).

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
        >>> log = read_trainer_state(state)
        >>> [(r["step"], r["loss"]) for r in log.records], log.files[0].name
        ([(1, 2.3), (2, 2.1)], 'trainer_state.json')
    """
    path = Path(path)
    return Log(normalize(_history(path)), "trainer_state", (path,))
