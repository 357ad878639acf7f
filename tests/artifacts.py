"""The run's records under ``test-artifacts/``, safe to write from both pytest-xdist workers.

``record(name, key, value)`` merges ``{key: value}`` into ``test-artifacts/<name>`` (JSON) while
it holds an exclusive lock on ``test-artifacts/<name>.lock``: the read, the merge and the write
are one step, so two workers recording at once both keep their keys. The file is replaced
atomically, so a reader never sees half of it.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def record(name: str, key: str, value: object, folder: Path = ARTIFACTS) -> Path:
    """Merge ``{key: value}`` into ``folder/name`` under a file lock; return the file's path."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = value
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(partial, path)
    return path


def append_line(name: str, line: str, folder: Path = ARTIFACTS) -> Path:
    """Append one line to ``folder/name`` under the same lock; return the file's path."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with path.open("a") as out:
            out.write(line.rstrip("\n") + "\n")
    return path
