"""The position in the data, as state: a batch sampler that a checkpoint can resume mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["ResumableSampler"]


class ResumableSampler(torch.utils.data.Sampler[list[int]]):
    """Shuffled batches of indices, one epoch per iteration, that resume where they stopped.

    Epoch ``e`` is a permutation of ``range(num_samples)`` drawn from a generator seeded with
    ``(seed, e)`` alone, cut into batches of ``batch_size`` (the last, shorter one is dropped).
    :meth:`state_dict` holds the epoch and how many of its batches were handed out, so a run
    restored from a checkpoint draws exactly the batches the interrupted run would have drawn
    next. Use it as a ``DataLoader``'s ``batch_sampler`` with ``num_workers=0`` (workers fetch
    ahead of the training step, and their batches would count as taken).

    Args:
        num_samples: Size of the data set.
        batch_size: Indices per batch (at most ``num_samples``).
        seed: Seed of every epoch's permutation.

    Example:
        >>> from trainopt.stability import ResumableSampler
        >>> sampler = ResumableSampler(10, batch_size=3, seed=0)
        >>> epoch = iter(sampler)
        >>> first = next(epoch)
        >>> state = sampler.state_dict()                   # one batch taken
        >>> rest = list(epoch)
        >>> resumed = ResumableSampler(10, batch_size=3, seed=0)
        >>> resumed.load_state_dict(state)
        >>> list(resumed) == rest, len(sampler)
        (True, 3)
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int = 0) -> None:
        for name, value in (("num_samples", num_samples), ("batch_size", batch_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
        if batch_size > num_samples:
            raise ValueError(f"batch_size must not exceed num_samples, got {batch_size=}, {num_samples=}")
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, int(seed)
        self.epoch = 0
        self.position = 0  # batches of this epoch handed out

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def _permutation(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % 2**63)
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[list[int]]:
        """The rest of the current epoch; the next iteration starts the next epoch."""
        order = self._permutation()
        while self.position < len(self):
            start = self.position * self.batch_size
            self.position += 1
            yield order[start:start + self.batch_size].tolist()
        self.epoch += 1
        self.position = 0

    def next_batch(self) -> list[int]:
        """The next batch, in a loop that counts steps rather than epochs (a new epoch as needed).

        Example:
            >>> from trainopt.stability import ResumableSampler
            >>> sampler = ResumableSampler(4, batch_size=2, seed=0)
            >>> [sorted(sampler.next_batch() + sampler.next_batch()) for _ in range(2)], sampler.epoch
            ([[0, 1, 2, 3], [0, 1, 2, 3]], 1)
        """
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        self.position += 1
        return self._permutation()[start:start + self.batch_size].tolist()

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the batches taken in it, and the settings they depend on."""
        return {"num_samples": self.num_samples, "batch_size": self.batch_size, "seed": self.seed,
                "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position (the settings must match)."""
        for key in ("num_samples", "batch_size", "seed"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"ResumableSampler state has {key}={state.get(key)!r}, this sampler "
                                 f"{getattr(self, key)!r}: a position in other data")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
