"""The stabilizer inside the Hugging Face ``Trainer``: an optimizer pair and a ``TrainerCallback``.

The ``Trainer`` owns the loop: forward, backward, ``max_grad_norm`` clipping, then
``optimizer.step()`` and ``lr_scheduler.step()``. :func:`stabilize` hands it, through
``Trainer(optimizers=...)``, a :class:`~trainopt.stability.integrations.guard.GuardedOptimizer`
whose step is skipped on the device when the loss or the gradients are bad, and a scheduler whose
step the guard takes over (a skipped step consumes no schedule position). The callback feeds the
guard each training forward pass's ``outputs.loss`` (a forward hook: no host sync), refuses to
clip twice, and adds ``skipped_steps`` and ``rollbacks`` to the ``Trainer``'s logs.

What stays the ``Trainer``'s: clipping (``max_grad_norm``; or set it to 0 and give the guard
``max_grad_norm=`` to clip by the norm the monitor measured), fp16 loss scaling and its skip on
inf, checkpoints (``save_steps``, ``resume_from_checkpoint``: the guard's state rides in
``optimizer.pt``), the random generators and the data position. ``transformers`` is imported when
:func:`stabilizer_callback` is first called, not before.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from trainopt.stability.integrations.guard import GuardedOptimizer, WindowScheduler

__all__ = ["stabilize", "stabilizer_callback"]


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback

    class StabilizerCallback(TrainerCallback):
        """Feeds a GuardedOptimizer the training loss and reports what it skipped."""

        def __init__(self, guarded: GuardedOptimizer) -> None:
            self.guarded = guarded
            self.handle = None

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                           **kwargs: Any) -> None:
            if getattr(optimizer, "optimizer", optimizer) is not self.guarded:
                raise ValueError("the Trainer does not step this callback's GuardedOptimizer: pass "
                                 "Trainer(optimizers=optimizers) with the pair stabilize() returned")
            if (args.max_grad_norm or 0) > 0 and self.guarded.max_grad_norm is not None:
                raise ValueError(f"clip once: TrainingArguments(max_grad_norm={args.max_grad_norm}) clips and so does "
                                 f"the guard (max_grad_norm={self.guarded.max_grad_norm}); set one of them to "
                                 "0 / None")
            if self.handle is None:
                self.handle = self.guarded.watch(model)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.handle is not None:
                self.handle.remove()
                self.handle = None

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if logs is not None and "loss" in logs:
                recovery = self.guarded.recovery
                logs["skipped_steps"] = self.guarded.skipped_steps
                logs["rollbacks"] = 0 if recovery is None else len(recovery.history)

    return StabilizerCallback


def stabilizer_callback(guarded: GuardedOptimizer) -> Any:
    """A ``transformers.TrainerCallback`` that feeds ``guarded`` the loss of each training step.

    Args:
        guarded: The optimizer given to ``Trainer(optimizers=(guarded, guarded.scheduler))``.

    Returns:
        A ``StabilizerCallback`` (a ``TrainerCallback``) for ``Trainer(callbacks=[...])``.

    Example:
        >>> import torch
        >>> from transformers import TrainerCallback
        >>> from trainopt.stability.integrations import GuardedOptimizer
        >>> from trainopt.stability.integrations.hf import stabilizer_callback
        >>> model = torch.nn.Linear(2, 1)
        >>> guarded = GuardedOptimizer(torch.optim.AdamW(model.parameters(), fused=True))
        >>> isinstance(stabilizer_callback(guarded), TrainerCallback)
        True
    """
    return _callback_class()(guarded)


def stabilize(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None,
              **options: Any) -> tuple[tuple[GuardedOptimizer, WindowScheduler], Any]:
    """Guard ``optimizer`` for the ``Trainer``: ``(optimizers, callback)`` to pass it.

    Args:
        model: The model the ``Trainer`` trains (its ``outputs.loss`` is monitored).
        optimizer: The optimizer, built by you (``fused=True`` skips inside the kernel).
        scheduler: Its scheduler, e.g. ``transformers.get_scheduler(args.lr_scheduler_type, ...)``,
            which is the one the ``Trainer`` would build itself.
        **options: :class:`~trainopt.stability.integrations.guard.GuardedOptimizer`'s settings
            (``check_every``, ``checkpoint_dir`` for rollbacks, ...).

    Returns:
        ``((guarded, guarded.scheduler), callback)``: ``Trainer(optimizers=..., callbacks=[callback])``.

    Example:
        >>> import torch
        >>> from trainopt.stability.integrations.hf import stabilize
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        >>> optimizers, callback = stabilize(model, optimizer, check_every=50)
        >>> optimizers[0].optimizer is optimizer, optimizers[1].optimizer is optimizers[0]
        (True, True)
    """
    guarded = GuardedOptimizer(optimizer, scheduler, model=model, **options)
    return (guarded, guarded.scheduler), stabilizer_callback(guarded)
