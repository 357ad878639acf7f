"""The results file of every benchmark: environment, git state, and an atomic write."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from trainopt.perf.bench.mfu import MFU_GOAL, MFU_GOAL_SIZE, peak_flops_for


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """The commit of the code that ran, and whether tracked files differed from it.

    Outside a git checkout (a copied tree), the commit comes from ``TRAINOPT_GIT_COMMIT`` if set.

    Example:
        >>> from trainopt.perf.bench.results import git_state
        >>> sorted(git_state())
        ['git_commit', 'git_dirty']
    """
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": os.environ.get("TRAINOPT_GIT_COMMIT") or None, "git_dirty": None}
    return {"git_commit": commit, "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}


def environment(device: str | torch.device, peak_tflops: float | None = None) -> dict[str, Any]:
    """Hardware, software and MFU reference of a run, for the results file.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.results import environment
        >>> meta = environment("cpu")
        >>> meta["device"], meta["torch"] == torch.__version__, meta["peak_flops"]
        ('cpu', True, None)
    """
    device = torch.device(device)
    peak, source = peak_flops_for(device, peak_tflops)
    cuda = device.type == "cuda"
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **git_state(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "peak_flops": peak,
        "peak_source": source,
        "mfu_goal": MFU_GOAL,
        "mfu_goal_size": MFU_GOAL_SIZE,
    }


def write_results(results: dict[str, Any], out: str | os.PathLike) -> None:
    """Write ``results`` as JSON atomically (a reader never sees half a file).

    Example:
        >>> import json
        >>> from pathlib import Path
        >>> from trainopt.perf.bench.results import write_results
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "results.json"
        >>> write_results({"meta": {}, "results": []}, path)
        >>> json.loads(path.read_text())
        {'meta': {}, 'results': []}
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, out)
