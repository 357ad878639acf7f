"""The stabilizer inside Lightning: a ``GuardedOptimizer`` from ``configure_optimizers`` and a ``Callback``.

Automatic optimization already hands the optimizer a closure: Lightning calls
``optimizer.step(closure)``, and the closure runs ``training_step``, the backward pass and
``gradient_clip_val`` clipping. A :class:`~trainopt.stability.integrations.guard.GuardedOptimizer`
returned from ``configure_optimizers`` runs that closure, takes the loss it returns, and skips the
update on the device when the loss or the gradients are bad. No manual optimization is needed.
Return ``guarded.scheduler`` as the ``lr_scheduler``: the guard steps the real scheduler once per
applied step, whatever its ``interval``.

The callback of :func:`stabilizer_callback` refuses to clip twice and logs ``trainopt/skipped_steps``
and ``trainopt/rollbacks`` at each boundary. What stays Lightning's: ``gradient_clip_val``, the
precision plugin's loss scaling, ``ModelCheckpoint`` and ``ckpt_path=`` (the guard's state rides in
the optimizer state of the ``.ckpt``). ``lightning`` is imported when :func:`stabilizer_callback`
is first called.
"""

from __future__ import annotations

import functools
from typing import Any

from trainopt.stability.integrations.guard import GuardedOptimizer

__all__ = ["stabilizer_callback"]


def _guards(trainer: Any) -> list[GuardedOptimizer]:
    found = [getattr(o, "_optimizer", o) for o in trainer.optimizers]
    return [o for o in found if isinstance(o, GuardedOptimizer)]


@functools.cache
def _callback_class() -> type:
    from lightning.pytorch import Callback

    class StabilizerCallback(Callback):
        """Checks the set-up at the start of ``fit`` and logs what the guards skipped."""

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            guards = _guards(trainer)
            if not guards:
                raise ValueError("configure_optimizers returned no GuardedOptimizer: return "
                                 "GuardedOptimizer(optimizer, scheduler) and its .scheduler")
            clip = trainer.gradient_clip_val
            for guard in guards:
                if clip and guard.max_grad_norm is not None:
                    raise ValueError(f"clip once: Trainer(gradient_clip_val={clip}) clips and so does the guard "
                                     f"(max_grad_norm={guard.max_grad_norm}); set one of them to None")
            self.seen = [None] * len(guards)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, index: int) -> None:
            for i, guard in enumerate(_guards(trainer)):
                if guard.last_report is not None and guard.last_report is not self.seen[i]:
                    self.seen[i] = guard.last_report
                    rollbacks = 0 if guard.recovery is None else len(guard.recovery.history)
                    pl_module.log_dict({"trainopt/skipped_steps": float(guard.skipped_steps),
                                        "trainopt/rollbacks": float(rollbacks)}, on_step=True, on_epoch=False)

    return StabilizerCallback


def stabilizer_callback() -> Any:
    """A ``lightning.pytorch.Callback`` for a module whose optimizers are ``GuardedOptimizer``.

    Returns:
        A ``StabilizerCallback`` for ``Trainer(callbacks=[...])``.

    Example:
        >>> from lightning.pytorch import Callback
        >>> from trainopt.stability.integrations.lightning import stabilizer_callback
        >>> isinstance(stabilizer_callback(), Callback)
        True
    """
    return _callback_class()()
