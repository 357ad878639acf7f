"""The stabilizer's part of a checkpoint: each rank's counters, generators and position in the data."""

from __future__ import annotations

from typing import Any

from trainopt.stability.distributed import rank_and_world
from trainopt.stability.rng import get_rng_state, set_rng_state

__all__ = ["Gathered", "RankEntries"]


class RankEntries:
    """The per-rank part of a checkpoint: each rank's stabilizer state, generators and data position.

    ``state_dict`` gives this rank's entry in its slot; ``load_state_dict`` takes this rank's
    entry: everything on a resume, only the stabilizer's trajectory on a rollback (the run moves
    on in the data and the random numbers, and keeps counting skipped steps).

    Example:
        >>> import torch
        >>> from trainopt.stability import TrainingStabilizer
        >>> from trainopt.stability.stabilizer_state import RankEntries
        >>> model = torch.nn.Linear(2, 1)
        >>> stabilizer = TrainingStabilizer(model, torch.optim.SGD(model.parameters(), lr=0.1))
        >>> entry = RankEntries(stabilizer, resume=True).state_dict()["ranks"]
        >>> len(entry), sorted(entry[0])  # one process: one rank
        (1, ['data', 'rng', 'stabilizer'])
    """

    def __init__(self, stabilizer: Any, resume: bool) -> None:
        self.stabilizer, self.resume = stabilizer, resume

    def local(self) -> dict[str, Any]:
        data = self.stabilizer.data
        return {"stabilizer": self.stabilizer.state_dict(), "rng": get_rng_state(),
                "data": None if data is None else data.state_dict()}

    def state_dict(self) -> dict[str, Any]:
        rank, world = rank_and_world(self.stabilizer.process_group)
        return {"ranks": [self.local() if r == rank else None for r in range(world)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rank, world = rank_and_world(self.stabilizer.process_group)
        if len(state["ranks"]) != world:
            raise ValueError(f"the checkpoint holds {len(state['ranks'])} ranks, this run has {world}")
        entry = state["ranks"][rank]
        if not self.resume:
            self.stabilizer._load_trajectory(entry["stabilizer"])
            return
        if (entry["data"] is None) != (self.stabilizer.data is None):
            raise ValueError("the checkpoint and this run disagree on whether there is a data position (data=)")
        self.stabilizer.load_state_dict(entry["stabilizer"])
        if self.stabilizer.data is not None:
            self.stabilizer.data.load_state_dict(entry["data"])
        set_rng_state(entry["rng"])


class Gathered:
    """Every rank's entries, gathered on rank 0 to be written.

    Example:
        >>> from trainopt.stability.stabilizer_state import Gathered
        >>> Gathered({"ranks": [None, None]}).state_dict()
        {'ranks': [None, None]}
    """

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state
