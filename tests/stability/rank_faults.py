"""Rank functions for :func:`trainopt.perf.distributed.processes.launch` that break rank agreement.

They live in a module of their own, on ``sys.path`` (``conftest.py`` puts this folder there), so
that the spawned processes can import them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def skip_a_collective(bad_rank: int = 1) -> float:
    """Every rank all-reduces twice but ``bad_rank``, which skips the second: the ranks disagree.

    ``bad_rank`` goes on to ``launch``'s closing barrier while the others wait in the all-reduce.
    """
    total = torch.ones(1)
    dist.all_reduce(total)
    if dist.get_rank() != bad_rank:
        dist.all_reduce(total)
    return float(total)


def environment_variable(name: str) -> str | None:
    """What this rank reads from its environment under ``name``."""
    import os

    return os.environ.get(name)
