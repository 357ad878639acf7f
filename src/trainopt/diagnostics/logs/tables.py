"""CSV and JSON Lines logs: one row per step, with named columns (a tracker's export such as W&B's,
Lightning's ``CSVLogger``, a hand-rolled logger)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from trainopt.diagnostics.logs.log import Log
from trainopt.diagnostics.logs.names import LogFormatError, normalize


def read_csv(path: str | Path) -> Log:
    """The records of a CSV file whose first line names the columns.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs.tables import read_csv
        >>> path = Path(tempfile.mkdtemp()) / "metrics.csv"
        >>> _ = path.write_text("Step,train/loss,learning_rate,grad_norm\\n"
        ...                     "0,2.30,0.1,1.2\\n1,2.10,0.1,\\n2,,0.1,\\n")
        >>> read_csv(path).records  # an empty cell was not logged: step 2 logged no loss
        [{'step': 0, 'loss': 2.3, 'lr': 0.1, 'grad_norm': 1.2}, {'step': 1, 'loss': 2.1, 'lr': 0.1}]
    """
    path = Path(path)
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise LogFormatError(
            "path", f"{path.name} has no rows below a header line naming the columns"
        )
    return Log(normalize(rows), "csv", (path,))


def read_jsonl(path: str | Path) -> Log:
    """The records of a JSON Lines file (one object a line; ``NaN`` and ``Infinity`` allowed).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.logs.tables import read_jsonl
        >>> path = Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> _ = path.write_text('{"global_step": 0, "train/loss": 2.3}\\n\\n'
        ...                     '{"global_step": 1, "train/loss": NaN}\\n')
        >>> read_jsonl(path).records
        [{'step': 0, 'loss': 2.3}, {'step': 1, 'loss': nan}]
    """
    path = Path(path)
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise LogFormatError(
                    "path", f"{path.name}:{n} is not a JSON object ({exc.msg})"
                ) from exc
    return Log(normalize(r for r in rows if isinstance(r, dict)), "jsonl", (path,))
