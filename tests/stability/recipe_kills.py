"""``python -m trainopt.stability.recipe`` that SIGKILLs itself at one chosen moment.

``python recipe_kills.py POINT N -- RECIPE-ARGS`` runs the recipe's ``main`` in this process and
sends itself ``SIGKILL`` (no handler, no ``finally``, no flush: a real kill) at the moment
``POINT`` happens for the ``N``-th time in this process:

- ``loss``: a training loss is about to be computed (``F.cross_entropy`` is called): between
  boundaries, with the step-0 checkpoint already on disk from the first ``loss`` on;
- ``mid-write``: half of a checkpoint's bytes are in its temporary file, the rest not written;
- ``unrenamed``: the temporary file is complete and verified, not yet renamed over the target;
- ``renamed``: the step file is in place, the best copy and the pruning of old files not done;
- ``saved``: ``CheckpointManager.save_checkpoint`` has returned (just after a save).

Moments are counted in the process, so a restarted run counts from its resume. The test that
uses it (``test_recipe_restarts.py``) draws ``N`` from a seeded generator: the moments are
random, and the same on every run of the test.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from typing import Any

import torch.nn.functional as F

from trainopt.stability.checkpointing import checkpoint
from trainopt.stability.checkpointing import files as checkpoint_files

POINTS = ("loss", "mid-write", "unrenamed", "renamed", "saved")


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(point: str, n: int) -> None:
    """Arrange for this process to SIGKILL itself at the ``n``-th ``point``."""
    if point not in POINTS or n < 1:
        raise SystemExit(f"usage: recipe_kills.py {{{','.join(POINTS)}}} N>=1 -- RECIPE-ARGS")
    seen = [0]

    def due() -> bool:
        seen[0] += 1
        return seen[0] == n

    if point == "loss":
        cross_entropy = F.cross_entropy

        def killing_cross_entropy(*args: Any, **kwargs: Any) -> Any:
            if due():
                _die()
            return cross_entropy(*args, **kwargs)

        F.cross_entropy = killing_cross_entropy
    elif point == "saved":
        save = checkpoint.CheckpointManager.save_checkpoint

        def killing_save(self: Any, *args: Any, **kwargs: Any) -> Any:
            path = save(self, *args, **kwargs)
            if due():
                _die()
            return path

        checkpoint.CheckpointManager.save_checkpoint = killing_save
    else:
        atomic_write = checkpoint_files._atomic_write

        def killing_atomic_write(path: Any, write: Any, verify: Any = None) -> None:
            if not due():
                return atomic_write(path, write, verify)
            if point == "mid-write":

                def half(f: Any) -> None:
                    whole = io.BytesIO()
                    write(whole)
                    data = whole.getvalue()
                    f.write(data[: len(data) // 2])
                    f.flush()
                    _die()

                return atomic_write(path, half, verify)
            if point == "unrenamed":

                def verified_then_die(tmp: Any) -> None:
                    if verify is not None:
                        verify(tmp)
                    _die()

                return atomic_write(path, write, verified_then_die)
            atomic_write(path, write, verify)
            _die()
            return None

        checkpoint_files._atomic_write = killing_atomic_write  # save_weights_only looks it up here


if __name__ == "__main__":
    separator = sys.argv.index("--")
    install(sys.argv[1], int(sys.argv[2]))
    from trainopt.config.cli import run_command
    from trainopt.stability.recipe import main

    sys.exit(run_command(main, sys.argv[separator + 1 :]))
