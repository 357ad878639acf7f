"""Where a results file came from: the commit of the code that ran, and whether it was changed.

The benchmark harness (``python -m trainopt.perf.bench``, which a reader runs on their own work)
labels every results file with :func:`git_state`, so a table can say which code made it and a
reader can tell a clean run from a run of uncommitted changes. The site's workshop
(``trainopt_site``: the overhead runs, the corpora) labels its results files the same way.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["git_state"]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """The commit of the code that ran, and whether tracked files differed from it.

    Read once per process, when the first results are made: the code that runs is the code
    that was there then, and the results files a run writes later don't count as changes to
    it. Outside a git checkout (a copied tree), the commit comes from ``TRAINOPT_GIT_COMMIT`` if
    set.

    Example:
        >>> from trainopt.config.provenance import git_state
        >>> sorted(git_state())
        ['git_commit', 'git_dirty']
    """
    return dict(_git_state_at_start())


@functools.lru_cache(maxsize=1)
def _git_state_at_start() -> tuple[tuple[str, Any], ...]:
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return (("git_commit", os.environ.get("TRAINOPT_GIT_COMMIT") or None), ("git_dirty", None))
    return (
        ("git_commit", commit),
        ("git_dirty", bool(_git("status", "--porcelain", "--untracked-files=no"))),
    )
