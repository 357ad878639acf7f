"""A stabilized training step that costs no host-device synchronisation in the steady state.

:class:`TrainingStabilizer` is the whole recipe in one object. Per call of
:meth:`~TrainingStabilizer.step` (per micro-batch with ``accumulate=N``):

1. ``torch.amp.autocast(device_type, dtype)`` around the forward pass, and a loss scaler
   (:class:`~trainopt.stability.scaling.scaler.DynamicLossScaler`) for ``float16`` only;
2. the monitors of a :class:`~trainopt.stability.monitoring.checker.StabilityChecker`: a non-finite
   loss or gradient, a loss or gradient norm far outside the range of the recent window, agreed over
   the ranks when ``torch.distributed`` is initialised;
3. gradient clipping with the norm the monitor already measured;
4. the optimizer step, *skipped on the device* when flagged: fused optimizers get the flag as
   their ``found_inf`` (:func:`~trainopt.stability.skipping.step.fused_step`), others step through
   :func:`~trainopt.stability.skipping.step.masked_step`. A skipped step leaves the weights, the
   optimizer state, the schedule position
   (:class:`~trainopt.stability.skipping.schedule.ScheduleWindow`), the model's buffers
   (:class:`~trainopt.stability.skipping.buffers.BufferSnapshot`) and any averaged model
   (``averaged=``) exactly as if the batch had never been drawn;
5. every ``check_every`` steps, one boundary where the host reads the statistics: it steps the
   schedulers once per applied step, rolls back to the last checkpoint with a learning-rate cut
   when the run diverges or stays out of range for ``patience`` steps, and saves a checkpoint
   every ``save_every`` steps at boundaries whose window flagged nothing.

Where the host syncs: between boundaries, a stabilized step adds no host read to what the
optimizer's own step makes, for every ``torch.optim`` optimizer in its default, ``foreach``,
``fused`` and ``capturable`` forms, with any scheduler
(:mod:`~trainopt.stability.skipping.schedule` says how the rates reach each form). Refused when
built: a tensor ``lr`` in ``param_groups`` with a scheduler, and ``foreach=True`` ASGD and Rprop
(torch's foreach kernels take no tensor rate, and their step is not linear in it).
``DynamicLossScaler`` only matters through its ``state``: the stabilizer steps the optimizer
itself, so the scaler's ``skip_mode`` never runs.

Checkpoints and restarts: a boundary checkpoint holds the model, the optimizers, the schedulers,
the scaler, averaged models, the recovery's state (its learning-rate scale included) and, for
every rank, the stabilizer's counters, its checker windows, the clipper's statistics, the random
number generators and the position in the data (``data=``, e.g. a
:class:`~trainopt.stability.checkpointing.loader.ResumableDataLoader`).
:meth:`TrainingStabilizer.resume` loads the newest valid one, so a killed run continues as the run
it replaced. Rank 0 writes; every rank loads the file rank 0 picked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from trainopt.stability.checkpointing.rank_state import Gathered, RankEntries
from trainopt.stability.config import Detection, Rollback, grouped_settings
from trainopt.stability.core import CoreView, GuardedUpdate, build_checker, build_recovery
from trainopt.stability.distributed import all_gather
from trainopt.stability.monitoring.checker import StabilityChecker
from trainopt.stability.scaling.scaler import DynamicLossScaler
from trainopt.stability.settings import DTYPES, check_settings

__all__ = ["StabilityChecker", "TrainingStabilizer"]


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


class TrainingStabilizer(CoreView):
    """One call per training step: autocast, scaling, monitoring, clipping, a guarded update,
    recovery.

    Args:
        model: The model being trained (its parameters pick the device type of autocast).
        optimizer: An optimizer that :func:`~trainopt.stability.skipping.optimizers.check_skippable`
            accepts, or a list of them (one update per step for each). Optimizers with step hooks
            are refused (:func:`~trainopt.stability.skipping.optimizers.check_no_step_hooks`): use
            ``averaged=`` for an EMA.
        scheduler: A learning-rate scheduler stepped once per applied step, a list (one per
            optimizer, ``None`` where there is none), or ``None``. A scheduler stepped with a
            metric (``ReduceLROnPlateau``, ``AdaptiveLearningRate``) is stepped at each boundary
            with the median training loss of the window.
        checkpoint_dir: Where boundary checkpoints go. With it, the stabilizer saves one before
            the first step and then every ``save_every`` steps while the run is stable, rolls back
            when it is not, and :meth:`resume` continues a killed run. Without it, bad steps are
            still skipped, but nothing is saved or rolled back. The directory survives the run:
            building the stabilizer again with it and calling :meth:`resume` continues the run.
        dtype: Autocast dtype: ``torch.bfloat16``, ``torch.float16`` (adds a loss scaler) or
            ``None`` for full precision. The strings ``"bf16"``, ``"fp16"``, ``"fp32"`` work too.
        scaler: A loss scaler with the ``torch.amp.GradScaler`` interface; for ``float16`` only.
        max_grad_norm: Global-norm clipping threshold, or ``None`` for no clipping.
        clipper: A clipper with ``clip(params, total_norm=...)`` (e.g.
            :class:`~trainopt.stability.clipping.norms.ZScoreClipper`), used instead of
            ``max_grad_norm``.
        check_every: Steps between host reads (the boundaries).
        accumulate: Micro-batches per optimizer step: each :meth:`step` call runs one forward and
            backward pass on ``loss / accumulate``; every ``accumulate``-th call updates.
        detection: What counts as a bad step (:class:`~trainopt.stability.config.Detection`:
            ``spike_factor``, ``explosion_factor``, ``window_size``, ``min_history``,
            ``skip_unstable``); default ``Detection()``.
        rollback: When checkpoints are saved and what a rollback does
            (:class:`~trainopt.stability.config.Rollback`: ``save_every``, ``keep_last``,
            ``lr_factor``, ``max_rollbacks``, ``patience``, ``skip_batches``); with
            ``checkpoint_dir``; default ``Rollback()``.
        averaged: A ``torch.optim.swa_utils.AveragedModel`` (or a list) to update after each
            applied step, left unchanged by skipped ones.
        data: The position in the data (``state_dict()``/``load_state_dict()``, e.g. a
            :class:`~trainopt.stability.checkpointing.loader.ResumableDataLoader`), saved with every
            checkpoint.
        process_group: The ranks that agree on every decision; ``None`` is the default group
            when ``torch.distributed`` is initialised (nothing to agree on otherwise).
        recovery: A :class:`~trainopt.stability.recovery.rollback.TrainingRecovery` built by hand,
            instead of ``checkpoint_dir`` (it must hold this model, optimizer and scheduler).
        checker: A :class:`~trainopt.stability.monitoring.checker.StabilityChecker` built by hand.
        **deprecated: The grouped knobs as flat keywords (0.4's spelling): each warns with
            :class:`DeprecationWarning` and goes into its group.

    Example:
        >>> import tempfile
        >>> import torch
        >>> from trainopt.stability import TrainingStabilizer
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        >>> stabilizer = TrainingStabilizer(
        ...     model, opt, checkpoint_dir=tempfile.mkdtemp(), check_every=10
        ... )
        >>> x, y = torch.randn(64, 4), torch.randn(64, 1)
        >>> loss = stabilizer.step(lambda: (model(x) - y).pow(2).mean())
        >>> before = model.weight.detach().clone()
        >>> loss = stabilizer.step(lambda: (model(x) - y).pow(2).mean() * float("nan"))
        >>> torch.equal(model.weight, before)  # the NaN step was skipped on the device
        True
    """

    def __init__(  # noqa: PLR0913 - the loop's settings, each with a default
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
        scheduler: Any = None,
        *,
        checkpoint_dir: str | Path | None = None,
        check_every: int = 100,
        max_grad_norm: float | None = 1.0,
        clipper: Any = None,
        dtype: torch.dtype | str | None = None,
        scaler: Any = None,
        accumulate: int = 1,
        detection: Detection | None = None,
        rollback: Rollback | None = None,
        averaged: Any = None,
        data: Any = None,
        process_group: Any = None,
        recovery: Any = None,
        checker: StabilityChecker | None = None,
        **deprecated: Any,
    ) -> None:
        self.detection, self.rollback = grouped_settings(
            "TrainingStabilizer", detection, rollback, deprecated
        )
        self.optimizers = _as_list(optimizer)
        self.schedulers = (
            _as_list(scheduler) if scheduler is not None else [None] * len(self.optimizers)
        )
        check_settings(
            model,
            self.optimizers,
            self.schedulers,
            dtype=dtype,
            scaler=scaler,
            check_every=check_every,
            accumulate=accumulate,
            max_grad_norm=max_grad_norm,
            checkpoint_dir=checkpoint_dir,
            rollback=rollback,
            recovery=recovery,
        )
        dtype = DTYPES[dtype] if isinstance(dtype, str) or dtype is None else dtype
        self.model = model
        self.optimizer, self.scheduler = self.optimizers[0], self.schedulers[0]
        self.dtype = None if dtype is torch.float32 else dtype
        self.scaler = (
            scaler
            if scaler is not None
            else (DynamicLossScaler() if dtype is torch.float16 else None)
        )
        self.accumulate = accumulate
        if recovery is None and checkpoint_dir is not None:
            recovery = build_recovery(
                self.rollback,
                model,
                self.optimizer,
                checkpoint_dir,
                check_every=check_every,
                scheduler=self.scheduler,
                scaler=self.scaler,
            )
        elif recovery is not None and recovery.scaler is None:
            recovery.scaler = self.scaler
        if checker is None:
            monitored = self.optimizer if len(self.optimizers) == 1 else model
            checker = build_checker(self.detection, monitored, check_every, process_group)
        self.core = GuardedUpdate(
            model,
            self.optimizers,
            self.schedulers,
            checker=checker,
            recovery=recovery,
            check_every=check_every,
            max_grad_norm=max_grad_norm,
            clipper=clipper,
            skip_unstable=self.detection.skip_unstable,
            averaged=[] if averaged is None else _as_list(averaged),
            data=data,
            process_group=process_group,
            scaler=self.scaler,
            trajectory=self._trajectory,
        )
        self.micro = 0
        # the step-0 checkpoint's generators and data position: before the loop draws a batch
        self._initial_entry: dict[str, Any] | None = RankEntries.initial(self)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of this stabilizer (a no-op in full precision)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.amp.autocast(self.device.type, dtype=self.dtype)

    def step(self, compute_loss: Callable[[], torch.Tensor]) -> torch.Tensor | None:
        """Run one micro-batch of a guarded training step; return its loss (detached, not read).

        ``compute_loss`` runs the forward pass under autocast and returns the scalar loss. The
        optimizers update on every ``accumulate``-th call. Returns ``None`` without computing
        anything when the recovery asks to skip this batch (after a rollback).
        """
        if self.micro == 0:
            if not self.core.begin():
                return None
            for opt in self.optimizers:
                opt.zero_grad(set_to_none=True)
            self.core.take_buffers()  # before the first forward pass of this optimizer step
        self.micro += 1
        last = self.micro == self.accumulate
        no_sync = getattr(self.model, "no_sync", None)
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            with self.autocast():
                loss = compute_loss()
            scaled = loss / self.accumulate if self.accumulate > 1 else loss
            (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
        loss = loss.detach()
        self._loss_sum = loss.float() if self.micro == 1 else self._loss_sum + loss.float()
        if last:
            self.micro = 0
            self.core.update(self._loss_sum / self.accumulate if self.accumulate > 1 else loss)
        return loss

    def _trajectory(self, mode: str) -> dict[str, Any]:
        """The per-rank part of a checkpoint (see
        :class:`~trainopt.stability.checkpointing.rank_state.RankEntries`)."""
        if mode == "save":
            return {
                "stabilizer": Gathered(
                    {
                        "ranks": all_gather(
                            RankEntries(self, resume=True).local(), self.process_group
                        )
                    }
                )
            }
        return {"stabilizer": RankEntries(self, resume=mode == "resume")}

    def resume(self) -> int | None:
        """Load the newest valid boundary checkpoint into everything; return its step (``None``:
        none).

        Model, optimizers, schedulers, scaler, averaged models, the recovery's state, and this
        rank's stabilizer state, random number generators and data position: the run continues
        exactly where the checkpoint was taken. Every rank loads the file rank 0 picked.
        """
        return self.core.resume()

    @property
    def last_lr(self) -> list[Any]:
        """The learning rate of each group of the first optimizer as the last step used it, exactly.

        A Python float, or a 0-d device tensor while the schedule changes the rate within the
        window (reading it as a float is a host read). ``param_groups`` hold the rate at the
        host's count of steps, the same until the window's first skipped step.
        """
        return self.window.applied_rates()[0]

    def state_dict(self) -> dict[str, Any]:
        """Counters, checker windows and clipper statistics (loads with ``weights_only=True``)."""
        return self.core.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.core.load_state_dict(state)
        self.micro = 0

    def _load_trajectory(self, state: dict[str, Any]) -> None:
        """Everything but the count of every skip ever made (a rollback keeps counting)."""
        self.core.load_state_dict(state, trajectory_only=True)
        self.micro = 0
