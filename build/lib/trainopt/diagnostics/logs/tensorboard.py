"""TensorBoard logs: the scalars of event files, read with the ``tensorboard`` package's reader.

Each scalar tag is a column and each step a record: ``train/loss``, ``train/learning_rate`` and
``train/grad_norm`` (what the Hugging Face ``Trainer`` writes) become ``loss``, ``lr`` and
``grad_norm``. ``tensorboard`` is imported when a file is read, not before.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainopt.diagnostics.logs.names import LogFormatError, normalize


def scalars(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of one event file: ``tag -> [(step, value), ...]`` in the order written.

    Reads ``add_scalar`` values, and the tensors of the tensorboard plugin's ``scalar`` summary.

    Example:
        >>> from importlib.util import find_spec
        >>> import tempfile
        >>> from pathlib import Path

        .. skip: start if(find_spec("tensorboard") is None, reason="needs tensorboard")

        >>> from torch.utils.tensorboard import SummaryWriter
        >>> from trainopt.diagnostics.logs.tensorboard import scalars
        >>> folder = tempfile.mkdtemp()
        >>> with SummaryWriter(folder) as writer:
        ...     for step, loss in enumerate([2.3, 2.0]):
        ...         writer.add_scalar("train/loss", loss, step)
        >>> scalars(next(Path(folder).glob("events.out.tfevents.*")))
        {'train/loss': [(0, 2.299999952316284), (1, 2.0)]}

        .. skip: end
    """
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
        from tensorboard.util import tensor_util
    except ImportError as exc:
        raise LogFormatError(
            "path",
            "reading TensorBoard event files needs the tensorboard package "
            "(pip install tensorboard)",
        ) from exc
    found: dict[str, list[tuple[int, float]]] = {}
    for event in EventFileLoader(str(path)).Load():
        for value in event.summary.value:
            if value.HasField("simple_value"):
                number = float(value.simple_value)
            elif value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "scalars":
                number = float(tensor_util.make_ndarray(value.tensor).item())
            else:
                continue
            found.setdefault(value.tag, []).append((int(event.step), number))
    return found


def read_events(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The records of one run's event files: one per step, a column per scalar tag.

    A value written twice for the same step keeps the last one (a restarted run rewrites it).

    Example:
        >>> from importlib.util import find_spec
        >>> import tempfile
        >>> from pathlib import Path

        .. skip: start if(find_spec("tensorboard") is None, reason="needs tensorboard")

        >>> from torch.utils.tensorboard import SummaryWriter
        >>> from trainopt.diagnostics.logs.tensorboard import read_events
        >>> folder = tempfile.mkdtemp()
        >>> with SummaryWriter(folder) as writer:
        ...     for step in range(3):
        ...         writer.add_scalar("train/loss", 2.0 - step / 2, step)
        ...         writer.add_scalar("train/learning_rate", 0.5, step)
        >>> records = read_events(Path(folder).glob("events.out.tfevents.*"))
        >>> len(records), records[0], records[-1]
        (3, {'step': 0, 'loss': 2.0, 'lr': 0.5}, {'step': 2, 'loss': 1.0, 'lr': 0.5})

        .. skip: end
    """
    by_step: dict[int, dict[str, Any]] = {}
    for path in paths:
        for tag, values in scalars(path).items():
            for step, value in values:
                by_step.setdefault(step, {"step": step})[tag] = value
    return normalize(by_step[step] for step in sorted(by_step))
