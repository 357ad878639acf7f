"""The page's data loading resumes bit for bit, workers included (issue 21, requirement 4).

A model with dropout (a random draw every step) trains on a :class:`ResumableDataLoader`; the
interrupted run saves model, optimizer, loader and generators with ``torch.save`` mid-epoch,
then new objects load them and train on: the weights equal the uninterrupted run's bit for
bit. The control is the loader the page used before: ``DataLoader(batch_sampler=
ResumableSampler(...))``, whose iterators draw their seed from the global generator.

The data set may draw random numbers itself (augmentation: ``torch.rand`` in ``__getitem__``,
:class:`Noisy`): in the main process from the global generators, in a worker from a seed of the
batch's epoch and place, so a run resumed mid-epoch with workers draws what the uninterrupted
run drew, whatever the number of workers, and every epoch draws anew. A peek at a batch
before training (``next(iter(loader))``) takes no batch from the training loop.
"""

from __future__ import annotations

import io
import random

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainopt.stability import ResumableDataLoader
from trainopt.stability.checkpointing.loader import ResumableSampler
from trainopt.stability.checkpointing.rng import get_rng_state, set_rng_state

STEPS, STOP = 23, 13  # 10 batches an epoch: the run stops in the second epoch, ends in the third
DATA = TensorDataset(
    torch.randn(40, 6, generator=torch.Generator().manual_seed(0)),
    torch.randint(0, 3, (40,), generator=torch.Generator().manual_seed(1)),
)


class Noisy(torch.utils.data.Dataset):
    """``DATA`` with noise drawn in ``__getitem__``, from torch's and Python's generators."""

    def __len__(self) -> int:
        return len(DATA)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = DATA[i]
        return x + 0.5 * torch.rand(6) + random.random(), y


def _build(old_loader: bool, num_workers: int, persistent: bool = False, data=DATA):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 3)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if old_loader:
        loader = DataLoader(
            data,
            batch_sampler=ResumableSampler(len(data), batch_size=4, seed=3),
            num_workers=num_workers,
        )
        return model, optimizer, loader, loader.batch_sampler
    kwargs = {"num_workers": num_workers, "persistent_workers": persistent} if num_workers else {}
    loader = ResumableDataLoader(data, batch_size=4, seed=3, **kwargs)
    return model, optimizer, loader, loader


def _train(model, optimizer, loader, steps: int) -> None:
    batches = iter(loader)
    for _ in range(steps):
        try:
            x, y = next(batches)
        except StopIteration:  # the next epoch
            batches = iter(loader)
            x, y = next(batches)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def _weights(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _straight_and_resumed(
    old_loader: bool, num_workers: int, persistent: bool = False, data=DATA
) -> tuple[torch.Tensor, torch.Tensor]:
    random.seed(0)
    model, optimizer, loader, position = _build(old_loader, num_workers, persistent, data)
    _train(model, optimizer, loader, STEPS)
    straight = _weights(model)

    random.seed(0)
    model, optimizer, loader, position = _build(old_loader, num_workers, persistent, data)
    _train(model, optimizer, loader, STOP)
    buffer = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "data": position.state_dict(),
            "rng": get_rng_state(),
        },
        buffer,
    )
    del model, optimizer, loader, position
    torch.rand(100), random.random()  # a new process: the global generators are elsewhere

    model, optimizer, loader, position = _build(old_loader, num_workers, persistent, data)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    position.load_state_dict(state["data"])
    set_rng_state(state["rng"])
    _train(model, optimizer, loader, STEPS - STOP)
    return straight, _weights(model)


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_a_resumed_run_with_dropout_equals_the_uninterrupted_run_bitwise(
    num_workers: int, persistent: bool
) -> None:
    straight, resumed = _straight_and_resumed(False, num_workers, persistent)
    assert torch.equal(straight, resumed), (straight - resumed).abs().max()


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_random_draws_in_getitem_resume_bitwise_mid_epoch(
    num_workers: int, persistent: bool
) -> None:
    """Workers seeded per epoch and worker start their generators again at the resumed position:
    they draw batch 0's numbers for the batch they resume with."""
    straight, resumed = _straight_and_resumed(False, num_workers, persistent, data=Noisy())
    assert torch.equal(straight, resumed), (straight - resumed).abs().max()


class Indexed(torch.utils.data.Dataset):
    """The index, and noise drawn in ``__getitem__``: which sample drew what."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, torch.rand(3)


def _draws(loader, epochs: int) -> list[dict[int, torch.Tensor]]:
    seen = []
    for _ in range(epochs):
        seen.append({int(i): noise for index, draws in loader for i, noise in zip(index, draws)})
    return seen


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_draw_anew_every_epoch(persistent: bool) -> None:
    """A worker seed made of the position in the epoch alone would repeat each epoch's draws."""
    loader = ResumableDataLoader(
        Indexed(), batch_size=4, seed=3, num_workers=2, persistent_workers=persistent
    )
    first, second = _draws(loader, 2)
    assert sorted(first) == sorted(second) == list(range(40))
    assert not any(torch.equal(first[i], second[i]) for i in range(40))


def test_the_draws_do_not_depend_on_the_number_of_workers() -> None:
    """Each batch draws from a seed of its own: a run resumed with other workers draws the same."""
    one, two = (
        _draws(ResumableDataLoader(Indexed(), batch_size=4, seed=3, num_workers=n), 2)
        for n in (1, 2)
    )
    assert all(torch.equal(one[e][i], two[e][i]) for e in range(2) for i in range(40))


def test_a_peek_before_training_takes_no_training_batch() -> None:
    """``next(iter(loader))``, then the training loop: it starts at the epoch's first batch."""
    loader = ResumableDataLoader(DATA, batch_size=4, seed=3)
    expected = [y for _x, y in ResumableDataLoader(DATA, batch_size=4, seed=3)]
    peeked = next(iter(loader))
    assert torch.equal(peeked[1], expected[0])
    taken = []
    for _x, y in loader:
        taken.append(y)
        assert loader.state_dict()["position"] == len(taken)  # what a checkpoint here would hold
    assert len(taken) == 10 and all(torch.equal(a, b) for a, b in zip(taken, expected))


def test_a_fresh_iterator_restarts_the_epoch_and_owns_the_position() -> None:
    """As with torch's ``DataLoader``, each ``iter()`` starts the epoch again (here: where it was
    loaded); the position is the newest iterator's, and an older one left open changes nothing."""
    loader = ResumableDataLoader(DATA, batch_size=4, seed=3)
    expected = [y for _x, y in ResumableDataLoader(DATA, batch_size=4, seed=3)]
    older = iter(loader)
    next(older), next(older)
    newer = iter(loader)
    assert torch.equal(next(newer)[1], expected[0]) and loader.state_dict()["position"] == 1
    next(older)
    assert loader.state_dict()["position"] == 1
    state = loader.state_dict()
    resumed = ResumableDataLoader(DATA, batch_size=4, seed=3)
    resumed.load_state_dict(state)
    next(iter(resumed))  # a peek at the resumed position
    rest = [y for _x, y in resumed]
    assert len(rest) == 9 and all(torch.equal(a, b) for a, b in zip(rest, expected[1:]))


def test_the_loader_the_page_used_before_does_not_resume_bitwise() -> None:
    """Its resumed run opens one iterator more, which draws one seed more from the global
    generator."""
    straight, resumed = _straight_and_resumed(old_loader=True, num_workers=0)
    assert not torch.equal(straight, resumed)


def test_the_position_counts_batches_taken_not_batches_the_workers_fetched() -> None:
    loader = ResumableDataLoader(DATA, batch_size=4, seed=3, num_workers=2)
    batches = iter(loader)
    next(batches)
    assert loader.state_dict()["position"] == 1
    assert loader.batch_sampler.position > 1  # the workers fetched ahead
    resumed = ResumableDataLoader(DATA, batch_size=4, seed=3)
    resumed.load_state_dict(loader.state_dict())
    rest, expected = [b[1] for b in resumed], [b[1] for b in batches]
    assert len(rest) == 9 and all(torch.equal(a, b) for a, b in zip(rest, expected))


def test_the_global_generator_is_never_drawn_from() -> None:
    loader = ResumableDataLoader(DATA, batch_size=4, seed=3)
    before = torch.get_rng_state()
    list(loader), list(loader)
    assert torch.equal(torch.get_rng_state(), before) and loader.state_dict()["epoch"] == 2


def test_arguments_it_sets_itself_are_refused() -> None:
    with pytest.raises(ValueError, match="ResumableDataLoader sets generator, shuffle itself"):
        ResumableDataLoader(DATA, batch_size=4, shuffle=True, generator=torch.Generator())


@pytest.mark.parametrize("peek", ["before the stabilizer is built", "after it is built", "none"])
def test_a_resume_from_the_step_0_checkpoint_takes_the_first_batch_again(
    peek: str, tmp_path
) -> None:
    """Break caught: the step-0 checkpoint holding the peek's position (the resumed run one batch
    ahead)."""
    from trainopt.stability import TrainingStabilizer

    def run(resume: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = torch.nn.Linear(DATA.tensors[0].shape[1], 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = ResumableDataLoader(DATA, batch_size=4, seed=3)
        if peek == "before the stabilizer is built":
            next(iter(loader))
        stabilizer = TrainingStabilizer(
            model, opt, checkpoint_dir=tmp_path, check_every=50, data=loader
        )
        if peek == "after it is built":
            next(iter(loader))
        if resume:
            assert stabilizer.resume() == 0
        taken = []
        for x, y in loader:
            taken.append(y)
            stabilizer.step(lambda: (model(x).squeeze(-1) - y.float()).pow(2).mean())
            if len(taken) == 3:
                break
        return taken

    first = run(resume=False)  # writes only the step-0 checkpoint (no boundary in 3 steps)
    assert [p.name for p in tmp_path.glob("checkpoint_step_*.pt")] == ["checkpoint_step_0.pt"]
    again = run(resume=True)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
