"""The stabilizer inside Lightning: a ``GuardedOptimizer`` from ``configure_optimizers`` and a
``Callback``.

Automatic optimization already hands the optimizer a closure: Lightning calls
``optimizer.step(closure)``, and the closure runs ``training_step``, the backward pass and
``gradient_clip_val`` clipping. A :class:`~trainopt.stability.integrations.guard.GuardedOptimizer`
returned from ``configure_optimizers`` runs that closure, takes the loss it returns, and skips the
update on the device when the loss or the gradients are bad. No manual optimization is needed.
Return ``guarded.scheduler`` as the ``lr_scheduler``: the guard steps the real scheduler once per
applied step, whatever its ``interval``.

Clipping inside the closure would hide an exploding gradient from the guard (it would measure the
clipped norm), so the callback of :func:`stabilizer_callback` takes it over: with
``Trainer(gradient_clip_val=c)`` (by norm) and guards that do not clip, it sets the ``Trainer``'s
``gradient_clip_val`` to ``None`` for ``fit`` and each guard clips at ``c`` by the norm its monitor
measured; both are put back at the end of ``fit``. Clipping by value
(``gradient_clip_algorithm="value"``), and a guard given its own ``max_grad_norm=`` beside
``gradient_clip_val``, are refused. The callback also logs ``trainopt/skipped_steps`` and
``trainopt/rollbacks`` at each boundary. What stays Lightning's: the precision plugin's loss
scaling, ``ModelCheckpoint`` and ``ckpt_path=`` (the guard's state rides in the optimizer state of
the ``.ckpt``). ``lightning`` is imported when :func:`stabilizer_callback` is first called.
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
        """Checks the set-up, clips for Lightning, and logs what the guards skipped."""

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            guards = _guards(trainer)
            if not guards:
                raise ValueError(
                    "configure_optimizers returned no GuardedOptimizer: return "
                    "GuardedOptimizer(optimizer, scheduler) and its .scheduler"
                )
            clip = trainer.gradient_clip_val
            for guard in guards:
                clips = guard.max_grad_norm is not None or getattr(guard.core, "clipper", None)
                if clip and clips:
                    raise ValueError(
                        f"clip once: Trainer(gradient_clip_val={clip}) clips and so does the guard "
                        f"(max_grad_norm={guard.max_grad_norm}); set one of them to None (the "
                        "guard then clips at gradient_clip_val)"
                    )
            self.seen = [None] * len(guards)
            self.clip_taken = None
            if clip:
                if str(getattr(trainer.gradient_clip_algorithm, "value", "norm")) == "value":
                    raise ValueError(
                        "gradient_clip_algorithm: 'value' clips inside the closure, before the "
                        "guard measures the gradients; allowed with a GuardedOptimizer: 'norm' or "
                        "None"
                    )
                for guard in guards:  # it must see the unclipped norm: it clips, not Lightning
                    guard.core.max_grad_norm = float(clip)
                self.clip_taken = (guards, clip)
                trainer.gradient_clip_val = None

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            if getattr(self, "clip_taken", None) is not None:
                guards, clip = self.clip_taken
                for guard in guards:
                    guard.core.max_grad_norm = None
                trainer.gradient_clip_val = clip
                self.clip_taken = None

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, index: int
        ) -> None:
            for i, guard in enumerate(_guards(trainer)):
                if guard.last_report is not None and guard.last_report is not self.seen[i]:
                    self.seen[i] = guard.last_report
                    rollbacks = 0 if guard.recovery is None else len(guard.recovery.history)
                    pl_module.log_dict(
                        {
                            "trainopt/skipped_steps": float(guard.skipped_steps),
                            "trainopt/rollbacks": float(rollbacks),
                        },
                        on_step=True,
                        on_epoch=False,
                    )

    return StabilizerCallback


def stabilizer_callback() -> Any:
    """A ``lightning.pytorch.Callback`` for a module whose optimizers are ``GuardedOptimizer``.

    With ``Trainer(gradient_clip_val=...)``, the guards clip in Lightning's place (see the module
    notes), so that they measure the gradients before clipping.

    Returns:
        A ``StabilizerCallback`` for ``Trainer(callbacks=[...])``.

    Example:
        >>> from lightning.pytorch import Callback
        >>> from trainopt.stability.integrations.lightning import stabilizer_callback
        >>> isinstance(stabilizer_callback(), Callback)
        True
    """
    return _callback_class()()
