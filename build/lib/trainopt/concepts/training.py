"""Training the digits MLP with ``torch.optim.Adam``: the concepts page's runs of Adam.

:func:`train_digits_adam` returns each step's loss of Adam on :func:`trainopt.models.digits_mlp`
under the page's linear warm-up and cosine decay
(:func:`~trainopt.concepts.rules.warmup_cosine_lr`): a careful and a reckless learning rate, and
the early spike that warm-up removes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainopt.concepts.rules import warmup_cosine_lr
from trainopt.models import digits_data, digits_mlp

__all__ = ["train_digits_adam"]


def train_digits_adam(
    lr: float,
    warmup_steps: int = 0,
    steps: int = 50,
    total_steps: int = 200,
    depth: int = 6,
    batch_size: int = 64,
    seed: int = 0,
) -> list[float]:
    """Train the digits MLP with ``torch.optim.Adam`` for ``steps`` steps; return each step's loss.

    The learning rate follows :func:`~trainopt.concepts.rules.warmup_cosine_lr` with peak ``lr``
    over ``total_steps``; ``warmup_steps=0`` starts at the peak. ``depth`` hidden layers (6 by
    default: deeper nets show Adam's early instability more clearly).

    Example:
        >>> from trainopt.concepts import train_digits_adam
        >>> losses = train_digits_adam(lr=1e-3, steps=20)
        >>> len(losses), losses[-1] < losses[0]
        (20, True)
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and the losses reproducible
    try:
        return _train_digits_adam(lr, warmup_steps, steps, total_steps, depth, batch_size, seed)
    finally:
        torch.set_num_threads(threads)


def _train_digits_adam(
    lr: float,
    warmup_steps: int,
    steps: int,
    total_steps: int,
    depth: int,
    batch_size: int,
    seed: int,
) -> list[float]:
    x, y, _, _ = digits_data()
    model = digits_mlp(depth=depth, seed=seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = warmup_cosine_lr(
                step, max_lr=lr, warmup_steps=warmup_steps, total_steps=total_steps
            )
        idx = torch.randint(0, len(x), (batch_size,), generator=generator)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses).tolist()
