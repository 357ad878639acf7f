"""Automatic recovery from training instability: decide, roll back, lower the learning rate.

:class:`TrainingRecovery` decides *whether* a run needs a rollback, from the report a
:class:`~trainopt.stability.monitoring.checker.StabilityChecker` made of a window (non-finite
weights, a diverging run, too many flagged steps in a row: :meth:`TrainingRecovery.rollback_reason`;
the spikes themselves are scored on the device by
:func:`~trainopt.stability.monitoring.statistics.tail_score`), and *recovers*: it reloads the newest
valid checkpoint through a :class:`~trainopt.stability.checkpointing.checkpoint.CheckpointManager`,
multiplies the learning rate by ``lr_factor`` in a way the scheduler keeps
(:func:`~trainopt.stability.recovery.rates.scale_learning_rate`), optionally
skips the next batches, and gives up with :class:`TrainingInstabilityError` after
``max_rollbacks``.

It reads only host values (a report the checker produced with one sync), so it runs at the
``check_every`` boundaries, not inside the step.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from trainopt.stability.config import RENAMED, deprecated_name
from trainopt.stability.recovery.rates import check_scalable, lr_scale, scale_learning_rate
from trainopt.validation import check_int

__all__ = ["TrainingInstabilityError", "TrainingRecovery", "scale_learning_rate"]


class TrainingInstabilityError(RuntimeError):
    """Raised when training stays unstable after ``max_rollbacks`` rollbacks.

    Example:
        >>> import torch
        >>> from trainopt.stability import TrainingInstabilityError
        >>> from trainopt.stability import TrainingRecovery
        >>> recovery = TrainingRecovery(torch.nn.Linear(2, 1), None, None)
        >>> try:
        ...     recovery.recover("non-finite loss")
        ... except TrainingInstabilityError as error:
        ...     print(error)
        cannot recover from non-finite loss: no checkpoint_manager
    """


class TrainingRecovery:
    """Decide when to roll back; roll back to the last good checkpoint with a lower learning rate.

    Args:
        model: The model to restore.
        optimizer: The optimizer to restore (its state and learning rates).
        checkpoint_manager: A
            :class:`~trainopt.stability.checkpointing.checkpoint.CheckpointManager`; only
            checkpoints saved while training was stable should go in it (the stabilizer saves at
            stable ``check_every`` boundaries only), so its newest valid checkpoint is a good one.
        scheduler: The learning-rate scheduler, restored and scaled with the optimizer.
        scaler: A loss scaler (``torch.amp.GradScaler`` interface) to restore, if any.
        lr_factor: Learning-rate multiplier applied at each recovery (cumulative).
        skip_batches: Batches to skip after a rollback. PaLM restarted about 100 steps before a
            spike and skipped 200 to 500 batches (Chowdhery et al. 2022, arXiv:2204.02311).
        max_rollbacks: Rollbacks allowed before :class:`TrainingInstabilityError`
            (``max_recovery_attempts=``, its former name, is deprecated).
        patience: Consecutive flagged steps that call for a rollback (:meth:`rollback_reason`).
            What counts as a spike or an explosion is the monitors' business
            (:class:`~trainopt.stability.config.Detection`), scored on the device.

    Example:
        >>> import torch
        >>> from trainopt.stability import TrainingRecovery
        >>> recovery = TrainingRecovery(torch.nn.Linear(2, 1), None, None)
        >>> recovery.rollback_reason({"max_streak": 3, "reasons": ["3 loss spikes"]}) is None
        True
        >>> recovery.rollback_reason({"max_streak": 10, "reasons": ["10 loss spikes"]})
        '10 consecutive unstable steps (10 loss spikes)'
        >>> recovery.rollback_reason({"weights_finite": False})
        'non-finite weights'
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        checkpoint_manager: Any,
        scheduler: Any = None,
        scaler: Any = None,
        lr_factor: float = 0.5,
        skip_batches: int = 0,
        max_rollbacks: int = 3,
        patience: int = 10,
        *,
        max_recovery_attempts: int | None = None,
        spike_factor: float | None = None,
        explosion_factor: float | None = None,
        min_history: int | None = None,
        spike_threshold: float | None = None,
    ) -> None:
        max_rollbacks = deprecated_name(
            "TrainingRecovery", "max_recovery_attempts", max_recovery_attempts, max_rollbacks, 3
        )
        ignored = [
            name
            for name, value in (
                ("spike_factor", spike_factor),
                ("explosion_factor", explosion_factor),
                ("min_history", min_history),
                ("spike_threshold", spike_threshold),
            )
            if value is not None
        ]
        if ignored:  # 0.4 scored spikes here too; the monitors do it now, on the device
            warnings.warn(
                f"TrainingRecovery({ignored[0]}=...) is deprecated and ignored: the monitors score "
                f"spikes; say detection=Detection({RENAMED.get(ignored[0], ignored[0])}=...) "
                "to the stabilizer or the guard",
                DeprecationWarning,
                stacklevel=2,
            )
        if not isinstance(lr_factor, (int, float)) or not 0 < lr_factor <= 1:
            raise ValueError(f"lr_factor must be in (0, 1], got {lr_factor=}")
        for name, value, low in (
            ("skip_batches", skip_batches, 0),
            ("max_rollbacks", max_rollbacks, 1),
            ("patience", patience, 1),
        ):
            check_int(name, value, low)
        self.model = model
        self.optimizer = optimizer
        self.checkpoint_manager = checkpoint_manager
        self.scheduler = scheduler
        self.scaler = scaler
        self.lr_factor = float(lr_factor)
        self.skip_batches = skip_batches
        self.max_rollbacks = max_rollbacks
        self.patience = patience
        check_scalable(
            scheduler
        )  # refuse a scheduler that would undo the cut now, not at a rollback
        self.recovery_attempts = 0
        self.lr_scale = lr_scale(optimizer) if optimizer is not None else 1.0
        self.batches_to_skip = 0
        self.history: list[dict[str, Any]] = []

    # -- the decision ---------------------------------------------------------------------------

    def rollback_reason(self, report: Mapping[str, Any]) -> str | None:
        """Why a :class:`~trainopt.stability.stabilizer.StabilityChecker` report calls for a
        rollback, or ``None``.

        Bad steps were already skipped on the device and never reached the weights, so a bad
        batch, or a few, needs no rollback. A rollback needs persistence. It is due when:

        - the weights themselves are non-finite;
        - the run diverges: the median of the recent losses lies above every loss the last
          stable window accepted (``report["loss"]["diverging"]``);
        - ``patience`` or more consecutive steps were flagged (``report["max_streak"]``): the
          loss or the gradients left their range and stayed out.
        """
        if not report.get("weights_finite", True):
            return "non-finite weights"
        if report.get("loss", {}).get("diverging"):
            return next(
                (r for r in report.get("reasons", []) if r.startswith("diverging")), "diverging"
            )
        streak = int(report.get("max_streak", 0))
        if streak >= self.patience:
            return f"{streak} consecutive unstable steps ({', '.join(report.get('reasons', []))})"
        return None

    def check(self, report: Mapping[str, Any]) -> str | None:
        """Deprecated: say :meth:`rollback_reason`."""
        warnings.warn(
            "TrainingRecovery.check(report) is deprecated: say rollback_reason(report)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.rollback_reason(report)

    @property
    def max_recovery_attempts(self) -> int:
        """Deprecated: say :attr:`max_rollbacks`."""
        warnings.warn(
            "TrainingRecovery.max_recovery_attempts is deprecated: say max_rollbacks",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.max_rollbacks

    # -- recovery ------------------------------------------------------------------------------

    def recover(
        self, reason: str = "instability", path: Any = None, extra: dict[str, Any] | None = None
    ) -> int:
        """Roll back to a checkpoint, lower the learning rate; return the checkpoint's step.

        After the ``k``-th rollback the learning rates are ``lr_factor ** k`` times those of the
        run without rollbacks (times the scale the recovery started from), whatever cut the
        checkpoint was saved with: the optimizer's groups carry their ``lr_scale``.

        Args:
            reason: Why (kept in :attr:`history` and the error messages).
            path: The checkpoint to load; ``None`` loads the newest valid one.
            extra: More objects to restore from the checkpoint (passed to the manager).

        Raises:
            TrainingInstabilityError: After ``max_rollbacks`` recoveries, or when no
                valid checkpoint exists.
        """
        if self.recovery_attempts >= self.max_rollbacks:
            raise TrainingInstabilityError(
                f"training is still unstable ({reason}) after max_rollbacks="
                f"{self.max_rollbacks} rollbacks; lower the learning rate, tighten "
                "clipping or inspect the data around the last spike"
            )
        if self.checkpoint_manager is None:
            raise TrainingInstabilityError(f"cannot recover from {reason}: no checkpoint_manager")
        # The random number generators move on: the rolled-back run sees new dropout masks and
        # new batches rather than replaying the ones that led to the divergence.
        pieces = dict(scheduler=self.scheduler, scaler=self.scaler, extra=extra, restore_rng=False)
        if path is None:
            restored = self.checkpoint_manager.load_latest(self.model, self.optimizer, **pieces)
        else:
            restored = self.checkpoint_manager.load_checkpoint(
                self.model, self.optimizer, path, **pieces
            )
        if restored is None:
            raise TrainingInstabilityError(
                f"cannot recover from {reason}: no valid checkpoint in "
                f"{self.checkpoint_manager.save_dir}"
            )
        step, loss = restored
        self.recovery_attempts += 1
        self.lr_scale *= self.lr_factor
        self._apply_lr_scale()
        self.batches_to_skip = self.skip_batches
        self.history.append(
            {"reason": reason, "restored_step": int(step), "lr_scale": self.lr_scale}
        )
        return int(step)

    def _apply_lr_scale(self) -> None:
        """Cut the restored rates from the scale the checkpoint was saved with to
        :attr:`lr_scale`."""
        if self.optimizer is None:
            return
        saved = lr_scale(self.optimizer)
        if saved != self.lr_scale:
            scale_learning_rate(self.optimizer, self.lr_scale / saved, self.scheduler)

    def should_skip_batch(self) -> bool:
        """True while batches after a rollback remain to be skipped (counts one down per call)."""
        if self.batches_to_skip > 0:
            self.batches_to_skip -= 1
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        """Settings, counters and tensors: everything to resume (loads with
        ``weights_only=True``)."""
        return {
            "recovery_attempts": self.recovery_attempts,
            "lr_scale": self.lr_scale,
            "batches_to_skip": self.batches_to_skip,
            "history": [dict(h) for h in self.history],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        missing = [
            k
            for k in ("recovery_attempts", "lr_scale", "batches_to_skip", "history")
            if k not in state
        ]
        if missing:
            raise KeyError(f"TrainingRecovery state_dict is missing {missing}")
        self.recovery_attempts = int(state["recovery_attempts"])
        self.lr_scale = float(state["lr_scale"])
        self.batches_to_skip = int(state["batches_to_skip"])
        self.history = [dict(h) for h in state["history"]]
