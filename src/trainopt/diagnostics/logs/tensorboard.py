"""TensorBoard logs: the scalars of event files, read with the ``tensorboard`` package's reader.

Each scalar tag is a column and each step a record: ``train/loss``, ``train/learning_rate`` and
``train/grad_norm`` (what the Hugging Face ``Trainer`` writes), ``Loss/train`` (PyTorch's
``SummaryWriter`` tutorial), ``train_loss``, ``grad_2.0_norm_total`` and ``lr-AdamW``
(Lightning's ``TensorBoardLogger``) become ``loss``, ``lr`` and ``grad_norm``. A folder of event
files may hold several runs: the newest is read (:func:`newest_run`). ``tensorboard`` is imported
when a file is read, not before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainopt.diagnostics.logs.hf import run_settings
from trainopt.diagnostics.logs.log import Log
from trainopt.diagnostics.logs.names import LogFormatError, canonical_name, normalize

Event = tuple[float, int, str, "float | str"]
"""``(wall_time, step, tag, value)``: a scalar (a float) or a text (a str)."""


def events(path: str | Path) -> list[Event]:
    """Every scalar and text of one event file, in the order written.

    Reads ``add_scalar`` values, and the tensors of the tensorboard plugins' ``scalars`` and
    ``text`` summaries.

    Example:
        >>> from importlib.util import find_spec
        >>> import tempfile
        >>> from pathlib import Path

        .. skip: start if(find_spec("tensorboard") is None, reason="needs tensorboard")

        >>> from torch.utils.tensorboard import SummaryWriter
        >>> from trainopt.diagnostics.logs.tensorboard import events
        >>> folder = tempfile.mkdtemp()
        >>> with SummaryWriter(folder) as writer:
        ...     writer.add_text("note", "lr 0.1")
        ...     for step, loss in enumerate([2.3, 2.0]):
        ...         writer.add_scalar("Loss/train", loss, step)
        >>> [event[1:] for event in events(next(Path(folder).glob("events.out.tfevents.*")))]
        [(0, 'note/text_summary', 'lr 0.1'), (0, 'Loss/train', 2.299999952316284),
         (1, 'Loss/train', 2.0)]

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
    found: list[Event] = []
    for event in EventFileLoader(str(path)).Load():
        for value in event.summary.value:
            plugin = value.metadata.plugin_data.plugin_name
            if value.HasField("simple_value"):
                number: float | str = float(value.simple_value)
            elif value.HasField("tensor") and plugin == "scalars":
                number = float(tensor_util.make_ndarray(value.tensor).item())
            elif value.HasField("tensor") and plugin == "text":
                text = tensor_util.make_ndarray(value.tensor).flatten()
                number = b"\n".join(t for t in text).decode("utf-8", "replace")
            else:
                continue
            found.append((float(event.wall_time), int(event.step), value.tag, number))
    return found


def started(path: str | Path) -> float:
    """When an event file was started: the time in its name (``events.out.tfevents.<time>.…``, as
    TensorBoard's writers name it), else its modification time.

    Example:
        >>> from trainopt.diagnostics.logs.tensorboard import started
        >>> started("runs/Dec02_10-24-53_vm/events.out.tfevents.1796207093.vm.5636.0")
        1796207093.0
    """
    match = re.search(r"tfevents\.(\d+)", Path(path).name)
    return float(match[1]) if match else Path(path).stat().st_mtime


def _is_finite(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def _first_step(found: list[Event]) -> float:
    steps = [
        step for _, step, tag, v in found if isinstance(v, float) and canonical_name(tag) == "loss"
    ]
    steps = steps or [step for _, step, _, v in found if isinstance(v, float)]
    return min(steps, default=math.inf)


def newest_run(read: dict[Path, list[Event]]) -> tuple[list[Path], list[Path]]:
    """The files of the newest run among event files, oldest first, and the other files.

    A folder may hold the event files of several runs (two ``Trainer`` runs into one output
    folder, two runs of one ``SummaryWriter`` log folder). The newest file is the newest run's;
    an older file is part of it too if the newer part starts at a later step (a run resumed from
    a checkpoint goes on from there), and the run ends at the first older file that starts at or
    after the step the newer part starts at (a run started afresh). Files without a scalar are
    left out.

    Example:
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs.tensorboard import newest_run
        >>> old, new, resumed = (Path(f"events.out.tfevents.{t}.h") for t in (100, 200, 300))
        >>> loss = lambda *steps: [(0.0, s, "train/loss", 2.0) for s in steps]
        >>> newest_run({old: loss(0, 1, 2), new: loss(0, 1, 2), resumed: loss(2, 3)})
        ([PosixPath('events.out.tfevents.200.h'), PosixPath('events.out.tfevents.300.h')],
         [PosixPath('events.out.tfevents.100.h')])
    """

    def begun(path: Path) -> tuple[float, float]:  # to the second by name, then by its events
        return started(path), min((event[0] for event in read[path]), default=math.inf)

    files = sorted((p for p, found in read.items() if _first_step(found) < math.inf), key=begun)
    if not files:
        return [], sorted(read, key=begun)
    run = [files[-1]]
    for older in reversed(files[:-1]):
        if _first_step(read[older]) >= _first_step(read[run[0]]):
            break
        run.insert(0, older)
    return run, [p for p in sorted(read, key=begun) if p not in run]


def read_events(paths: Iterable[str | Path]) -> Log:
    """The records of the newest run among event files (see :func:`newest_run`): one per step,
    a column per scalar tag, and the run's settings (a ``Trainer``'s ``max_grad_norm``).

    A value written again for a step (a restarted run rewrites them) keeps the newest, and a
    restart drops what the older run logged from its step on (see
    :func:`~trainopt.diagnostics.logs.normalize`).

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
        >>> log = read_events(Path(folder).glob("events.out.tfevents.*"))
        >>> len(log.records), log.records[0], log.records[-1]
        (3, {'step': 0, 'loss': 2.0, 'lr': 0.5}, {'step': 2, 'loss': 1.0, 'lr': 0.5})

        .. skip: end
    """
    read = {Path(p): events(p) for p in paths}
    run, others = newest_run(read)
    found = [event for path in run for event in read[path]]  # in the order written
    rows = [{"step": step, tag: value} for _, step, tag, value in found if isinstance(value, float)]
    texts = {tag: value for _, _, tag, value in found if isinstance(value, str)}
    return Log(normalize(rows), "tensorboard", tuple(run), tuple(others), run_settings(texts))


def settings_beside(state: str | Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The settings of the ``Trainer`` run that wrote the ``trainer_state.json`` at ``state``
    (with its ``records``), from that run's events under the output folder's ``runs/``: the
    events that logged the same loss at the state's last step. ``{}`` where there are none, or
    without the ``tensorboard`` package.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs.tensorboard import settings_beside
        >>> state = Path(tempfile.mkdtemp()) / "trainer_state.json"  # no runs/ beside it
        >>> settings_beside(state, [{"step": 10, "loss": 2.3}])
        {}
    """
    state = Path(state)
    last = next((r for r in reversed(records) if _is_finite(r.get("loss"))), None)
    output = state.parent.parent if state.parent.name.startswith("checkpoint-") else state.parent
    files = sorted((output / "runs").glob("**/events.out.tfevents.*"), key=started, reverse=True)
    for path in files if last is not None else []:
        try:
            found = events(path)
        except LogFormatError:  # no tensorboard package
            return {}
        if any(
            tag == "train/loss"
            and step == last["step"]
            and math.isclose(v, last["loss"], rel_tol=1e-6)
            for _, step, tag, v in found
            if isinstance(v, float)
        ):
            return run_settings({tag: v for _, _, tag, v in found if isinstance(v, str)})
    return {}
