"""The results files of every benchmark: one schema, one writer, one reader.

Every file that ``python -m trainopt.perf.bench`` writes, and every file a page renders, is a
JSON object:

.. code-block:: text

    {"schema": 2,
     "kind": "bench" | "stability" | "experiments" | "scaling" | "compile" | "estimate",
     "meta": {date, git_commit, git_dirty, command, note, device, device_name, ..., torch, cuda},
     ...the measurements of that kind}

``meta`` (:func:`environment`) says where, when and from which commit the numbers come, and
whether the working tree had uncommitted changes (``git_dirty``): a committed results file
comes from a clean tree. :func:`read_results` is the one reader;
:func:`trainopt.perf.bench.summary.summary` prints a file on a terminal (the pages render their
tables from the same files).
"""

from __future__ import annotations

import errno
import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from trainopt.config.provenance import git_state

SCHEMA = 2
KINDS = ("bench", "stability", "experiments", "scaling", "compile", "estimate")
Results = dict[str, Any]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(
    device: str | torch.device, command: str | None = None, note: str | None = None
) -> dict[str, Any]:
    """The ``meta`` of a results file: hardware, software, date, commit, command and a note.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.results import environment
        >>> command = "python -m trainopt.perf.bench recipe"
        >>> meta = environment("cpu", command=command, note="a laptop")
        >>> meta["device"], meta["torch"] == torch.__version__, meta["cpu_count"] > 0, meta["note"]
        ('cpu', True, True, 'a laptop')
    """
    device = torch.device(device)
    cuda = device.type == "cuda"
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **git_state(),
        "command": command,
        "note": note,
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else _cpu_name(),
        "device_memory_bytes": torch.cuda.get_device_properties(device).total_memory
        if cuda
        else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
    }


def new_results(
    kind: str,
    device: str | torch.device,
    command: str | None = None,
    note: str | None = None,
    **settings: Any,
) -> Results:
    """An empty results document of ``kind`` with its ``meta`` and the run's ``settings``.

    Example:
        >>> from trainopt.perf.bench.results import new_results
        >>> results = new_results("stability", "cpu", steps_per_window=10)
        >>> results["schema"], results["kind"], results["meta"]["settings"]
        (2, 'stability', {'steps_per_window': 10})
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    return {
        "schema": SCHEMA,
        "kind": kind,
        "meta": {**environment(device, command, note), "settings": settings},
    }


def write_results(results: Results, out: str | os.PathLike) -> None:
    """Write ``results`` as JSON atomically (a reader never sees half a file).

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from trainopt.perf.bench.results import new_results, write_results
        >>> path = Path(tempfile.mkdtemp()) / "results.json"
        >>> write_results(new_results("bench", "cpu"), path)
        >>> json.loads(path.read_text())["kind"]
        'bench'
    """
    out = Path(out)
    if out.is_dir():
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, out)


def read_results(source: str | os.PathLike | Results) -> Results | None:
    """Results from a JSON file (``None`` if there is no such file), or a results dict as is.

    Raises:
        ValueError: the file is not a results file of this schema.

    Example:
        >>> from trainopt.perf.bench.results import new_results, read_results
        >>> missing = read_results("no/such/results.json")
        >>> missing is None, read_results(new_results("bench", "cpu"))["kind"]
        (True, 'bench')
    """
    if isinstance(source, dict):
        results = source
    else:
        path = Path(source)
        if not path.exists():
            return None
        results = json.loads(path.read_text())
    if results.get("schema") != SCHEMA or results.get("kind") not in KINDS:
        raise ValueError(
            f"{source if not isinstance(source, dict) else 'results'}: "
            f"not a results file of schema {SCHEMA} (kind one of {list(KINDS)}); "
            "write it again with python -m trainopt.perf.bench"
        )
    return results


def hardware(meta: dict[str, Any]) -> str:
    """The hardware of a run in words.

    Example:
        >>> from trainopt.perf.bench.results import hardware
        >>> hardware({"device": "cpu", "device_name": "AMD EPYC", "cpu_count": 2})
        'CPU (AMD EPYC, 2 cores)'
        >>> hardware({"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "cpu_count": 16})
        'NVIDIA H100 80GB HBM3'
    """
    if meta["device"] == "cuda":
        return meta["device_name"]
    return f"CPU ({meta['device_name']}, {meta['cpu_count']} cores)"


def label(results: Results) -> str:
    """One line under a table: hardware, software, date, commit (and a dirty tree), the note.

    Example:
        >>> from trainopt.perf.bench.results import label
        >>> meta = {"device": "cpu", "device_name": "AMD EPYC", "cpu_count": 2, "torch": "2.13.0",
        ...         "cuda": None, "date": "2026-11-23T10:00:00+00:00",
        ...         "git_commit": "0123456789abcdef", "git_dirty": False,
        ...         "note": "a shared virtual machine"}
        >>> print(label({"meta": meta}))
        *CPU (AMD EPYC, 2 cores), torch 2.13.0, 2026-11-23, commit `0123456789`; a shared virtual
            machine.*
    """
    meta = results["meta"]
    software = f"torch {meta['torch']}" + (f", CUDA {meta['cuda']}" if meta.get("cuda") else "")
    commit = (meta.get("git_commit") or "unknown")[:10]
    dirty = " with uncommitted changes" if meta.get("git_dirty") else ""
    note = f"; {meta['note']}" if meta.get("note") else ""
    return f"*{hardware(meta)}, {software}, {meta['date'][:10]}, commit `{commit}`{dirty}{note}.*"
