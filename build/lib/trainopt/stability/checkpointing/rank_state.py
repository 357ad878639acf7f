"""The stabilizer's part of a checkpoint: each rank's counters, generators and position in
the data."""

from __future__ import annotations

from typing import Any

from trainopt.stability.checkpointing.rng import get_rng_state, set_rng_state
from trainopt.stability.distributed import rank_and_world

__all__ = ["Gathered", "RankEntries"]


class RankEntries:
    """The per-rank part of a checkpoint: each rank's stabilizer state, generators and data
    position.

    ``state_dict`` gives this rank's entry in its slot; ``load_state_dict`` takes this rank's
    entry: everything on a resume, only the stabilizer's trajectory on a rollback (the run moves
    on in the data and the random numbers, and keeps counting skipped steps).

    The checkpoint written before the first step is written by that step, once the training
    loop has drawn the step's batch (and whatever random numbers its loader drew): its data
    position and generators are those *after* the batch. So the entry of a stabilizer that has
    not stepped yet holds the generators and data position of :meth:`initial` instead, the
    snapshot taken when the stabilizer was built (``stabilizer._initial_entry``), and the data
    position before the step's batch
    (:meth:`~trainopt.stability.checkpointing.loader.ResumableDataLoader.state_before_last_batch`,
    so that a peek with another iterator, before or after the stabilizer was built, counts for
    nothing): a run resumed from that checkpoint draws the first batch and the first random numbers
    again, as the run it replaces did. The snapshot is dropped once a checkpoint is loaded (the run
    is elsewhere then).

    Example:
        >>> import torch
        >>> from trainopt.stability import TrainingStabilizer
        >>> from trainopt.stability.checkpointing.rank_state import RankEntries
        >>> model = torch.nn.Linear(2, 1)
        >>> stabilizer = TrainingStabilizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> entry = RankEntries(stabilizer, resume=True).state_dict()["ranks"]
        >>> len(entry), sorted(entry[0])  # one process: one rank
        (1, ['data', 'rng', 'stabilizer'])
    """

    def __init__(self, stabilizer: Any, resume: bool) -> None:
        self.stabilizer, self.resume = stabilizer, resume

    def local(self) -> dict[str, Any]:
        """This rank's entry: the stabilizer's state, the generators and the data position now
        (those of :meth:`initial` while the stabilizer has not stepped)."""
        initial = getattr(self.stabilizer, "_initial_entry", None)
        if initial is None or self.stabilizer.steps != 0:
            initial = self.initial(self.stabilizer)
        else:  # before the first step, which has drawn its batch: the position before that batch
            before = getattr(self.stabilizer.data, "state_before_last_batch", lambda: None)()
            initial = initial if before is None else {**initial, "data": before}
        return {"stabilizer": self.stabilizer.state_dict(), **initial}

    @staticmethod
    def initial(stabilizer: Any) -> dict[str, Any]:
        """The generators and data position now.

        Called at the end of ``TrainingStabilizer.__init__``, before the loop draws anything: what
        a resume from the checkpoint written before the first step restores.
        """
        data = stabilizer.data
        return {"rng": get_rng_state(), "data": None if data is None else data.state_dict()}

    def state_dict(self) -> dict[str, Any]:
        rank, world = rank_and_world(self.stabilizer.process_group)
        return {"ranks": [self.local() if r == rank else None for r in range(world)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rank, world = rank_and_world(self.stabilizer.process_group)
        if len(state["ranks"]) != world:
            raise ValueError(
                f"the checkpoint holds {len(state['ranks'])} ranks, this run has {world}"
            )
        entry = state["ranks"][rank]
        self.stabilizer._initial_entry = None  # the run continues from the file, not the start
        if not self.resume:
            self.stabilizer._load_trajectory(entry["stabilizer"])
            return
        if (entry["data"] is None) != (self.stabilizer.data is None):
            raise ValueError(
                "the checkpoint and this run disagree on whether there is a data position (data=)"
            )
        self.stabilizer.load_state_dict(entry["stabilizer"])
        if self.stabilizer.data is not None:
            self.stabilizer.data.load_state_dict(entry["data"])
        set_rng_state(entry["rng"])


class Gathered:
    """Every rank's entries, gathered on rank 0 to be written.

    Example:
        >>> from trainopt.stability.checkpointing.rank_state import Gathered
        >>> Gathered({"ranks": [None, None]}).state_dict()
        {'ranks': [None, None]}
    """

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state
