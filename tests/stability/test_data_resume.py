"""The page's data loading resumes bit for bit, workers included (issue 21, requirement 4).

A model with dropout (a random draw every step) trains on a :class:`ResumableDataLoader`; the
interrupted run saves model, optimizer, loader and generators with ``torch.save`` mid-epoch,
then new objects load them and train on: the weights equal the uninterrupted run's bit for
bit. The control is the loader the page used before: ``DataLoader(batch_sampler=
ResumableSampler(...))``, whose iterators draw their seed from the global generator.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainopt.stability import ResumableDataLoader, ResumableSampler, get_rng_state, set_rng_state

STEPS, STOP = 23, 13  # 10 batches an epoch: the run stops in the second epoch, ends in the third
DATA = TensorDataset(torch.randn(40, 6, generator=torch.Generator().manual_seed(0)),
                     torch.randint(0, 3, (40,), generator=torch.Generator().manual_seed(1)))


def _build(old_loader: bool, num_workers: int, persistent: bool = False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if old_loader:
        loader = DataLoader(DATA, batch_sampler=ResumableSampler(len(DATA), batch_size=4, seed=3),
                            num_workers=num_workers)
        return model, optimizer, loader, loader.batch_sampler
    kwargs = {"num_workers": num_workers, "persistent_workers": persistent} if num_workers else {}
    loader = ResumableDataLoader(DATA, batch_size=4, seed=3, **kwargs)
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


def _straight_and_resumed(old_loader: bool, num_workers: int,
                          persistent: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    model, optimizer, loader, position = _build(old_loader, num_workers, persistent)
    _train(model, optimizer, loader, STEPS)
    straight = _weights(model)

    model, optimizer, loader, position = _build(old_loader, num_workers, persistent)
    _train(model, optimizer, loader, STOP)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "data": position.state_dict(), "rng": get_rng_state()}, buffer)
    del model, optimizer, loader, position
    torch.rand(100)  # a new process: the global generator is elsewhere

    model, optimizer, loader, position = _build(old_loader, num_workers, persistent)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    position.load_state_dict(state["data"])
    set_rng_state(state["rng"])
    _train(model, optimizer, loader, STEPS - STOP)
    return straight, _weights(model)


@pytest.mark.parametrize("num_workers, persistent", [(0, False), (2, False), (2, True)])
def test_a_resumed_run_with_dropout_equals_the_uninterrupted_run_bitwise(num_workers: int, persistent: bool) -> None:
    straight, resumed = _straight_and_resumed(False, num_workers, persistent)
    assert torch.equal(straight, resumed), (straight - resumed).abs().max()


def test_the_loader_the_page_used_before_does_not_resume_bitwise() -> None:
    """Its resumed run opens one iterator more, which draws one seed more from the global generator."""
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
