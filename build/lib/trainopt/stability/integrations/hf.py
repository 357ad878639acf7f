"""The stabilizer inside the Hugging Face ``Trainer``: an optimizer pair and a ``TrainerCallback``.

The ``Trainer`` owns the loop: forward, backward, ``max_grad_norm`` clipping, then
``optimizer.step()`` and ``lr_scheduler.step()``. :func:`stabilize` hands it, through
``Trainer(optimizers=...)``, a :class:`~trainopt.stability.integrations.guard.GuardedOptimizer`
whose step is skipped on the device when the loss or the gradients are bad, and a scheduler whose
step the guard takes over (a skipped step consumes no schedule position).

The callback, at the start of ``train()``:

- feeds the guard the loss the ``Trainer`` optimises: what its ``training_step`` returns (the
  loss of ``compute_loss``: the model's ``outputs.loss``, the label-smoothed loss of
  ``label_smoothing_factor``, or that of ``compute_loss_func``), times the step's micro-batches,
  so the guard monitors the ``loss`` the ``Trainer`` logs for that step (no host sync). Where the
  callback cannot find the ``Trainer`` that calls it, it falls back to each training forward
  pass's ``outputs.loss`` (a forward hook);
- takes the clipping over: the ``Trainer`` clips (``max_grad_norm``, 1.0 by default) before it
  calls ``optimizer.step()``, so a guard behind it would measure the clipped norm and never see
  an exploding gradient. With ``max_grad_norm > 0`` and a guard that does not clip, the callback
  sets ``args.max_grad_norm = 0`` for the run (the ``Trainer`` still logs the unclipped
  ``grad_norm``) and the guard clips by the norm its monitor measured, at the same threshold;
  both are put back at the end of ``train()``. A guard given its own ``max_grad_norm=`` and a
  ``Trainer`` that clips too are refused (clip once);
- adds ``skipped_steps`` and ``rollbacks`` to the ``Trainer``'s logs.

What stays the ``Trainer``'s: fp16 loss scaling and its skip on inf, checkpoints
(``save_steps``, ``resume_from_checkpoint``: the guard's state rides in ``optimizer.pt``), the
random generators and the data position. ``transformers`` is imported when
:func:`stabilizer_callback` is first called, not before.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from trainopt.stability.integrations.guard import GuardedOptimizer, WindowScheduler

__all__ = ["stabilize", "stabilizer_callback"]


def _calling_trainer(callback: Any) -> Any:
    """The ``Trainer`` up the call stack whose callbacks hold ``callback``, or ``None``."""
    from transformers import Trainer

    frame = inspect.currentframe()
    try:
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer) and callback in candidate.callback_handler.callbacks:
                return candidate
            frame = frame.f_back
        return None
    finally:
        del frame  # no reference cycle through the frames


def _clips_itself(guarded: GuardedOptimizer) -> bool:
    return guarded.max_grad_norm is not None or getattr(guarded.core, "clipper", None) is not None


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback

    class StabilizerCallback(TrainerCallback):
        """Feeds a GuardedOptimizer the training loss, clips for the Trainer, reports the skips."""

        def __init__(self, guarded: GuardedOptimizer) -> None:
            self.guarded = guarded
            self.handle = None
            self.trainer = None  # the Trainer whose training_step is wrapped
            self.clip_taken: tuple[Any, float] | None = None  # (args, its max_grad_norm)

        def on_train_begin(
            self,
            args: Any,
            state: Any,
            control: Any,
            model: Any = None,
            optimizer: Any = None,
            **kwargs: Any,
        ) -> None:
            guarded = self.guarded
            self._give_clipping_back()  # left over from a train() that raised
            if getattr(optimizer, "optimizer", optimizer) is not guarded:
                raise ValueError(
                    "the Trainer does not step this callback's GuardedOptimizer: pass "
                    "Trainer(optimizers=optimizers) with the pair stabilize() returned"
                )
            clip = args.max_grad_norm or 0
            if clip > 0 and _clips_itself(guarded):
                raise ValueError(
                    f"clip once: TrainingArguments(max_grad_norm={args.max_grad_norm}) clips "
                    f"and so does the guard (max_grad_norm={guarded.max_grad_norm}); set "
                    "max_grad_norm=0 in TrainingArguments, or leave the guard's at None (the guard "
                    "then clips at the Trainer's max_grad_norm)"
                )
            if clip > 0:  # the guard must see the unclipped norm: it clips, the Trainer does not
                self.clip_taken = (args, args.max_grad_norm)
                guarded.core.max_grad_norm = float(clip)
                args.max_grad_norm = 0.0
            if self.trainer is None and self.handle is None:
                self._feed(_calling_trainer(self), model)

        def _feed(self, trainer: Any, model: Any) -> None:
            """Observe what ``trainer.training_step`` returns; without a Trainer, the model's."""
            guarded = self.guarded
            if trainer is None:
                self.handle = guarded.watch(model)
                return
            original = trainer.training_step

            def training_step(*args: Any, **kwargs: Any) -> torch.Tensor:
                guarded.core.take_buffers()  # a skipped step puts BatchNorm's statistics back
                loss = original(*args, **kwargs)
                # the Trainer logs the sum of its micro-batches' losses: mean times count
                guarded.observe(loss * trainer.current_gradient_accumulation_steps)
                return loss

            trainer.training_step = training_step
            self.trainer = trainer

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.handle is not None:
                self.handle.remove()
                self.handle = None
            if self.trainer is not None:
                self.trainer.__dict__.pop("training_step", None)
                self.trainer = None
            self._give_clipping_back()

        def _give_clipping_back(self) -> None:
            if self.clip_taken is not None:
                taken_args, value = self.clip_taken
                taken_args.max_grad_norm = value
                self.guarded.core.max_grad_norm = None
                self.clip_taken = None

        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
        ) -> None:
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


def stabilize(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any = None, **options: Any
) -> tuple[tuple[GuardedOptimizer, WindowScheduler], Any]:
    """Guard ``optimizer`` for the ``Trainer``: ``(optimizers, callback)`` to pass it.

    Args:
        model: The model the ``Trainer`` trains (a rollback restores it).
        optimizer: The optimizer, built by you (``fused=True`` skips inside the kernel).
        scheduler: Its scheduler, e.g. ``transformers.get_scheduler(args.lr_scheduler_type, ...)``,
            which is the one the ``Trainer`` would build itself.
        **options: :class:`~trainopt.stability.integrations.guard.GuardedOptimizer`'s settings
            (``check_every``, ``checkpoint_dir`` for rollbacks, ...).

    Returns:
        ``((guarded, guarded.scheduler), callback)``:
        ``Trainer(optimizers=..., callbacks=[callback])``.

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
