"""The stabilizer inside an Accelerate loop: ``accelerator.prepare`` a ``GuardedOptimizer``.

Accelerate leaves the loop to you and wraps what you ``prepare``: the optimizer's ``step()`` runs
only when ``accelerator.sync_gradients`` (the last micro-batch of ``accelerator.accumulate``), and
the scheduler steps with it. :func:`prepare` guards the optimizer, then prepares it with its
:class:`~trainopt.stability.integrations.guard.WindowScheduler`: the prepared optimizer skips a bad
step on the device, and a skipped step consumes no schedule position. Give the guard the loss with
``optimizer.step(lambda: loss)`` (or ``guarded.observe(loss)`` per micro-batch).

Clip with the guard (``max_grad_norm=``), not with ``accelerator.clip_grad_norm_`` before the
step: the guard would then measure the clipped norm, and a gradient 10**4 times too large would
look like any other clipped one. What stays Accelerate's: fp16 loss scaling with its skip on inf,
``save_state``/``load_state`` (the guard's state rides in the optimizer's state),
``skip_first_batches``, and the DDP gradient all-reduce. Nothing here imports ``accelerate``.
"""

from __future__ import annotations

from typing import Any

import torch

from trainopt.stability.integrations.guard import GuardedOptimizer

__all__ = ["prepare"]


def prepare(
    accelerator: Any,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    *others: Any,
    **options: Any,
) -> tuple[Any, ...]:
    """``accelerator.prepare(model, guarded, guarded.scheduler, *others)`` with the optimizer
    guarded.

    Args:
        accelerator: An ``accelerate.Accelerator``.
        model, optimizer, scheduler: Yours, unprepared (the scheduler drives ``optimizer``).
        *others: More objects to prepare (data loaders).
        **options: :class:`~trainopt.stability.integrations.guard.GuardedOptimizer`'s settings.

    Returns:
        What ``accelerator.prepare`` returns, in the same order: model, optimizer, scheduler,
        others.

    Example:
        >>> import torch
        >>> from accelerate import Accelerator
        >>> from trainopt.stability.integrations.accelerate import prepare
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.AdamW(model.parameters(), fused=True)
        >>> model, optimizer, scheduler = prepare(
        ...     Accelerator(cpu=True), model, optimizer, check_every=10
        ... )
        >>> type(optimizer.optimizer).__name__
        'GuardedOptimizer'
    """
    guarded = GuardedOptimizer(optimizer, scheduler, model=model, **options)
    return tuple(accelerator.prepare(model, guarded, guarded.scheduler, *others))
