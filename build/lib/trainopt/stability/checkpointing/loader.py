"""The position in the data, as state: a batch sampler and a loader that a checkpoint resumes
mid-epoch."""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch

from trainopt.validation import check_int

__all__ = ["ResumableDataLoader", "ResumableSampler"]

_NOT_TAKEN = ("shuffle", "sampler", "batch_sampler", "drop_last", "generator")


def _epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch) % 2**63


def _batch_seed(seed: int, epoch: int, position: int) -> int:
    """The seed a worker draws batch ``position`` of epoch ``epoch`` from (below 2**63)."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class ResumableSampler(torch.utils.data.Sampler[list[int]]):
    """Shuffled batches of indices, one epoch per iteration, that resume where they stopped.

    Epoch ``e`` is a permutation of ``range(num_samples)`` drawn from a generator seeded with
    ``(seed, e)`` alone, cut into batches of ``batch_size`` (the last, shorter one is dropped).
    :meth:`state_dict` holds the epoch and how many of its batches were handed out, so a run
    restored from a checkpoint draws exactly the batches the interrupted run would have drawn
    next. As a ``DataLoader``'s ``batch_sampler`` it counts the batches the loader *fetched*
    (workers fetch ahead of the training step), and each ``iter(DataLoader)`` draws a seed from
    the global torch generator, which a resumed run does once more than the run it replaces:
    :class:`ResumableDataLoader` counts the batches the training loop took and draws nothing.

    Args:
        num_samples: Size of the data set.
        batch_size: Indices per batch (at most ``num_samples``).
        seed: Seed of every epoch's permutation.

    Example:
        >>> from trainopt.stability.checkpointing.loader import ResumableSampler
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
            check_int(name, value, 1)
        if batch_size > num_samples:
            raise ValueError(
                f"batch_size must not exceed num_samples, got {batch_size=}, {num_samples=}"
            )
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, int(seed)
        self.epoch = 0
        self.position = 0  # batches of this epoch handed out

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def _permutation(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch))
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[list[int]]:
        """The rest of the current epoch; the next iteration starts the next epoch."""
        order = self._permutation()
        while self.position < len(self):
            start = self.position * self.batch_size
            self.position += 1
            yield order[start : start + self.batch_size].tolist()
        self.epoch += 1
        self.position = 0

    def next_batch(self) -> list[int]:
        """The next batch, in a loop that counts steps rather than epochs (a new epoch as needed).

        Example:
            >>> from trainopt.stability.checkpointing.loader import ResumableSampler
            >>> sampler = ResumableSampler(4, batch_size=2, seed=0)
            >>> batches = [sorted(sampler.next_batch() + sampler.next_batch()) for _ in range(2)]
            >>> batches, sampler.epoch
            ([[0, 1, 2, 3], [0, 1, 2, 3]], 1)
        """
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        self.position += 1
        return self._permutation()[start : start + self.batch_size].tolist()

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the batches taken in it, and the settings they depend on."""
        return {
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position (the settings must match)."""
        for key in ("num_samples", "batch_size", "seed"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"ResumableSampler state has {key}={state.get(key)!r}, this sampler "
                    f"{getattr(self, key)!r}: a position in other data"
                )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class _Batch(list):
    """A batch of indices that carries the seed of its random draws to the worker that loads it."""

    seed: int


class _LoaderSampler(ResumableSampler):
    """The loader's batch sampler: the batches from its position on, each with its seed."""

    def __iter__(self) -> Iterator[list[int]]:
        epoch, start, order = self.epoch, self.position, self._permutation()
        for position in range(start, len(self)):
            self.position = position + 1  # batches fetched (workers fetch ahead)
            first = position * self.batch_size
            batch = _Batch(order[first : first + self.batch_size].tolist())
            batch.seed = _batch_seed(self.seed, epoch, position)
            yield batch
        self.epoch, self.position = epoch + 1, 0


def _seed_generators(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")  # torch imports it in every worker where it is installed
    if numpy is not None:
        numpy.random.seed(seed % 2**32)


class _SeedEachBatch:
    """``worker_init_fn``: before each batch, the worker seeds its generators with the batch's seed.

    The worker's copy of the data set gets a ``__getitems__`` (the hook torch's fetcher calls
    with a batch of indices) that seeds torch, ``random`` and NumPy with the batch's seed and
    then loads the batch as before. Draws then depend on the batch alone: not on which worker
    loads it, how many batches that worker loaded before, or whether the workers persist.
    """

    def __init__(self, then: Any = None) -> None:
        self.then = then  # the user's worker_init_fn, called first

    def __call__(self, worker_id: int) -> None:
        if self.then is not None:
            self.then(worker_id)
        dataset = torch.utils.data.get_worker_info().dataset
        load = getattr(dataset, "__getitems__", None)

        def getitems(indices: list[int]) -> list[Any]:
            seed = getattr(indices, "seed", None)
            if seed is not None:
                _seed_generators(seed)
            return load(indices) if load else [dataset[i] for i in indices]

        try:
            dataset.__getitems__ = getitems
        except (AttributeError, TypeError) as exc:
            raise TypeError(
                f"ResumableDataLoader seeds each batch in its workers through the data "
                f"set's __getitems__, which {type(dataset).__name__} does not let it "
                f"set: use num_workers=0, or a data set without __slots__"
            ) from exc


class ResumableDataLoader(torch.utils.data.DataLoader):
    """A ``DataLoader`` whose position is the batches the training loop took: it resumes
    bit for bit.

    Batches come from a :class:`ResumableSampler` (epoch ``e`` shuffled with ``(seed, e)``, the
    last short batch dropped). :meth:`state_dict` holds the epoch and the batches of it that the
    loop has taken from the iterator, counted as they are handed out, so batches that workers
    fetched ahead are not counted. The loader has a private ``torch.Generator``, seeded with
    ``(seed, epoch)`` whenever an iterator opens, for the workers' base seed: it never draws from
    the global torch generator, so a resumed run, which opens one iterator more than the run it
    replaces, keeps dropout and every other draw in step. :meth:`load_state_dict` starts the next
    iterator at the position without loading the batches before it.

    Each ``iter(loader)`` starts the current epoch at the loader's start: its first batch, or
    the position :meth:`load_state_dict` set (as with torch's ``DataLoader``, a fresh iterator
    starts the epoch again, rather than going on where another one stopped). The position is
    that of the newest iterator (an older one left open changes nothing), kept when it stops
    early, so a run that breaks out of its loop and saves resumes after its last batch. So a
    peek before training, ``next(iter(loader))``, takes no batch from the training loop, whose
    ``for`` opens a fresh iterator. An iterator that runs to the end of the epoch moves the
    loader on to the next epoch.

    Randomness inside the data set's ``__getitem__`` draws, with ``num_workers=0``, from the
    global generators (restore them with
    :func:`~trainopt.stability.checkpointing.rng.set_rng_state`); in a worker, from torch's,
    ``random``'s and NumPy's generators seeded, before each batch, with a seed of
    ``(seed, epoch, batch)``: a resumed run draws what the run it replaces drew, whatever the number
    of workers, and each epoch draws anew. (A ``worker_init_fn`` is called first.)

    Args:
        dataset: A map-style data set (``len`` and ``__getitem__``).
        batch_size: Samples per batch.
        seed: Seed of the epochs' order and of the workers' seeds.
        **kwargs: Any other ``DataLoader`` argument (``num_workers``, ``collate_fn``,
            ``pin_memory``, ...), except ``shuffle``, ``sampler``, ``batch_sampler``,
            ``drop_last`` and ``generator``, which this loader sets.

    Example:
        >>> import torch
        >>> from torch.utils.data import TensorDataset
        >>> from trainopt.stability import ResumableDataLoader
        >>> data = TensorDataset(torch.arange(10.0))
        >>> loader = ResumableDataLoader(data, batch_size=2, seed=0)
        >>> epoch = iter(loader)
        >>> first = next(epoch)
        >>> state = loader.state_dict()                     # one batch taken
        >>> rest = [b[0].tolist() for b in epoch]
        >>> resumed = ResumableDataLoader(data, batch_size=2, seed=0)
        >>> resumed.load_state_dict(state)
        >>> [b[0].tolist() for b in resumed] == rest, len(rest), resumed.state_dict()["epoch"]
        (True, 4, 1)
    """

    def __init__(self, dataset: Any, batch_size: int = 1, seed: int = 0, **kwargs: Any) -> None:
        taken = sorted(set(kwargs) & set(_NOT_TAKEN))
        if taken:
            raise ValueError(
                f"ResumableDataLoader sets {', '.join(taken)} itself: leave "
                f"{'it' if len(taken) == 1 else 'them'} out (batch_size=, seed= choose the batches)"
            )
        sampler = _LoaderSampler(len(dataset), batch_size, seed)
        if kwargs.get("num_workers", 0) > 0:
            kwargs["worker_init_fn"] = _SeedEachBatch(kwargs.get("worker_init_fn"))
        super().__init__(dataset, batch_sampler=sampler, generator=torch.Generator(), **kwargs)
        self.seed, self.epoch, self.consumed = int(seed), 0, 0
        self._start = 0  # where the epoch's iterators start: 0, or the position loaded
        self._current: object | None = None  # the newest iterator's token
        self._opened_at = 0  # where the newest iterator started

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        """The current epoch from the loader's start, counting each batch as the loop takes it."""
        token = self._current = object()
        self.consumed = self._opened_at = self._start
        return self._batches(token, self.epoch, self._start)

    def _batches(self, token: object, epoch: int, start: int) -> Iterator[Any]:
        sampler = self.batch_sampler
        sampler.epoch, sampler.position = epoch, start
        self.generator.manual_seed(_epoch_seed(self.seed, self.epoch) ^ 0x5EED)
        for batch in super().__iter__():
            if self._current is token:
                self.consumed += 1
            yield batch
        if self._current is token:  # the newest iterator ran to the end: the next epoch
            self.epoch, self._start, self.consumed, self._current = epoch + 1, 0, 0, None

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the batches of it the loop took, and the settings they depend on."""
        return {**self.batch_sampler.state_dict(), "epoch": self.epoch, "position": self.consumed}

    def state_before_last_batch(self) -> dict[str, Any] | None:
        """:meth:`state_dict` as it was before the newest iterator handed out its last batch.

        ``None`` when no iterator is open or the newest has handed out nothing. What a checkpoint
        written before the first step holds: the loop has drawn the first step's batch, and the
        resumed run must draw it again, wherever a peek left an older iterator.

        Example:
            >>> import torch
            >>> from torch.utils.data import TensorDataset
            >>> from trainopt.stability import ResumableDataLoader
            >>> loader = ResumableDataLoader(TensorDataset(torch.arange(8.0)), batch_size=2)
            >>> peek = next(iter(loader))           # an iterator the loop does not use
            >>> batch = next(iter(loader))          # the loop's first batch
            >>> loader.state_dict()["position"], loader.state_before_last_batch()["position"]
            (1, 0)
        """
        if self._current is None or self.consumed <= self._opened_at:
            return None
        return {**self.state_dict(), "position": self.consumed - 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position (the settings must match)."""
        self.batch_sampler.load_state_dict(state)
        self.epoch, self.consumed = self.batch_sampler.epoch, self.batch_sampler.position
        self._start, self._current = self.consumed, None  # open iterators count no more
