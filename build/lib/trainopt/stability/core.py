"""The one guarded update that every front door of the stabilizer wraps.

:class:`GuardedUpdate` holds, once, everything a stabilized optimizer step decides and keeps:

- the skip decision (a :class:`~trainopt.stability.monitoring.checker.StabilityChecker`, agreed over
  ranks) and the step skipped on the device (:func:`~trainopt.stability.skipping.step.fused_step` or
  :func:`~trainopt.stability.skipping.step.masked_step`), the model's buffers included
  (:class:`~trainopt.stability.skipping.buffers.BufferSnapshot`: BatchNorm's running statistics);
- the schedule window (:class:`~trainopt.stability.skipping.schedule.ScheduleWindow`): a skipped
  step consumes no schedule position, and the rates cost no host read;
- the boundaries: every ``check_every`` steps the host reads the statistics once, steps the
  schedulers once per applied step (and a metric-stepped one with the window's median loss), logs
  every skipped step with its reason, and either rolls back or saves a checkpoint;
- the rollback rules (:class:`~trainopt.stability.recovery.rollback.TrainingRecovery`): a rollback
  restores the model, the optimizers, the schedulers, the scaler, averaged models and the
  trajectory, cuts the rate by ``lr_factor`` and reopens the window at the cut rate;
- the checkpointed state: counters, the checker's windows, the clipper's statistics.

:class:`~trainopt.stability.stabilizer.TrainingStabilizer` (your loop: autocast, accumulation,
loss scaling, then this update) and
:class:`~trainopt.stability.integrations.guard.GuardedOptimizer` (a framework's loop: the update
as ``optimizer.step()``), and through the guard the Hugging Face, Lightning and Accelerate
integrations, wrap one of these. Nothing of the update is written twice.

Skips and rollbacks are logged through :mod:`logging`, logger ``trainopt.stability``: each skipped
step at ``INFO`` (read at the boundary after it, with its step and reason; a step records its
reason only while the logger takes ``INFO``, so a run that logs nothing pays nothing for it), each
rollback at ``WARNING``.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from trainopt.stability.checkpointing.checkpoint import CheckpointManager
from trainopt.stability.clipping.norms import clip_grads_with_norm_
from trainopt.stability.config import Detection, Rollback
from trainopt.stability.distributed import barrier, broadcast_from_rank0, is_main_process
from trainopt.stability.monitoring.checker import StabilityChecker
from trainopt.stability.monitoring.gradients import GradientMonitor
from trainopt.stability.monitoring.loss import LossStabilityMonitor
from trainopt.stability.recovery.rates import lr_scale, scale_learning_rate
from trainopt.stability.recovery.rollback import TrainingRecovery
from trainopt.stability.settings import is_metric_scheduler, step_with_metric
from trainopt.stability.skipping.averaging import masked_update_parameters
from trainopt.stability.skipping.buffers import BufferSnapshot
from trainopt.stability.skipping.optimizers import check_no_step_hooks, skips_in_kernel
from trainopt.stability.skipping.schedule import ScheduleWindow
from trainopt.stability.skipping.step import StepSnapshot, fused_step, masked_step

__all__ = ["CoreView", "GuardedUpdate", "build_checker", "build_recovery"]

logger = logging.getLogger("trainopt.stability")

# Why a step was flagged, as bits of the per-step code the boundary reads.
_REASONS = (
    (1, "non-finite loss"),
    (2, "loss spike"),
    (4, "non-finite gradient norm"),
    (8, "gradient explosion"),
)


def build_checker(
    detection: Detection, monitored: Any, check_every: int, process_group: Any = None
) -> StabilityChecker:
    """The :class:`~trainopt.stability.monitoring.checker.StabilityChecker` of a front door's
    ``detection``.

    Example:
        >>> import torch
        >>> from trainopt.stability import Detection
        >>> from trainopt.stability.core import build_checker
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
        >>> checker = build_checker(Detection(window_size=50, min_history=10), opt, check_every=25)
        >>> checker.min_history, checker.loss_monitor.detector.window_size
        (10, 50)
    """
    losses = LossStabilityMonitor(
        detection.window_size,
        spike_factor=detection.spike_factor,
        check_every=check_every,
        min_history=detection.min_history,
    )
    grads = GradientMonitor(
        monitored,
        detection.window_size,
        detection.explosion_factor,
        detection.min_history,
        check_every,
    )
    return StabilityChecker(
        monitored, losses, grads, check_every=check_every, process_group=process_group
    )


def build_recovery(
    rollback: Rollback,
    model: Any,
    optimizer: Any,
    checkpoint_dir: Any,
    *,
    check_every: int,
    scheduler: Any = None,
    scaler: Any = None,
) -> TrainingRecovery:
    """The :class:`~trainopt.stability.recovery.rollback.TrainingRecovery` of a front door's
    ``rollback``.

    Example:
        >>> import tempfile
        >>> import torch
        >>> from trainopt.stability import Rollback
        >>> from trainopt.stability.core import build_recovery
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> recovery = build_recovery(
        ...     Rollback(lr_factor=0.25), model, opt, tempfile.mkdtemp(), check_every=50
        ... )
        >>> recovery.lr_factor, recovery.checkpoint_manager.save_every
        (0.25, 50)
    """
    manager = CheckpointManager(
        checkpoint_dir, save_every=rollback.save_every or check_every, keep_last=rollback.keep_last
    )
    return TrainingRecovery(
        model,
        optimizer,
        manager,
        scheduler=scheduler,
        scaler=scaler,
        lr_factor=rollback.lr_factor,
        skip_batches=rollback.skip_batches,
        max_rollbacks=rollback.max_rollbacks,
        patience=rollback.patience,
    )


class GuardedUpdate:
    """One guarded optimizer step per :meth:`update`, one boundary every ``check_every`` steps.

    Args:
        model: The model (a rollback restores it; averaged models follow it).
        optimizers: The optimizers, each stepped once per update.
        schedulers: One scheduler (or ``None``) per optimizer.
        checker: The monitors.
        recovery: A :class:`~trainopt.stability.recovery.rollback.TrainingRecovery` holding the
            first optimizer and scheduler, or ``None`` (skip only: nothing saved, no rollback).
        check_every: Steps between boundaries.
        max_grad_norm: Clip by the norm the monitor measured, or ``None``.
        clipper: A clipper with ``clip(params, total_norm=...)``, used instead of ``max_grad_norm``.
        skip_unstable: Also skip spikes and explosions (non-finite steps are always skipped).
        averaged: ``AveragedModel`` instances updated after each applied step.
        data: The position in the data (``state_dict()``/``load_state_dict()``), or ``None``.
        process_group: The ranks that agree.
        scaler: The loss scaler whose state a checkpoint holds, or ``None``.
        trajectory: What a checkpoint holds of the front door and this update, as
            ``trajectory(mode) -> {name: object with state_dict/load_state_dict}``, ``mode`` one of
            ``"save"``, ``"resume"`` (everything) and ``"rollback"`` (the trajectory only: the run
            moves on in the data and the random numbers, and keeps counting skipped steps).

    Example:
        >>> import torch
        >>> from trainopt.stability.monitoring.checker import StabilityChecker
        >>> from trainopt.stability.core import GuardedUpdate
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> update = GuardedUpdate(
        ...     model, [opt], [None], checker=StabilityChecker(opt, check_every=5), check_every=5
        ... )
        >>> before = model.weight.detach().clone()
        >>> model(torch.ones(1, 2)).sum().backward()
        >>> skip = update.update(torch.tensor(float("nan")))  # a NaN loss: skipped on the device
        >>> torch.equal(model.weight, before), int(update.skipped)
        (True, 1)
    """

    def __init__(  # noqa: PLR0913 - the update's collaborators, built by a front door
        self,
        model: torch.nn.Module | None,
        optimizers: list[torch.optim.Optimizer],
        schedulers: list[Any],
        *,
        checker: StabilityChecker,
        recovery: Any = None,
        check_every: int = 100,
        max_grad_norm: float | None = None,
        clipper: Any = None,
        skip_unstable: bool = True,
        averaged: list[Any] | None = None,
        data: Any = None,
        process_group: Any = None,
        scaler: Any = None,
        trajectory: Callable[[str], dict[str, Any]] | None = None,
    ) -> None:
        self.model, self.optimizers, self.schedulers = model, optimizers, schedulers
        self.checker, self.recovery = checker, recovery
        self.check_every, self.max_grad_norm, self.clipper = check_every, max_grad_norm, clipper
        self.skip_unstable = skip_unstable
        self.averaged = averaged or []
        self.data, self.process_group, self.scaler = data, process_group, scaler
        self.trajectory = trajectory or (lambda mode: {})
        self.save_every = getattr(getattr(recovery, "checkpoint_manager", None), "save_every", None)
        # buffers: a skipped step puts them back (BatchNorm's running statistics); NaN ones
        # roll back
        self.buffers = BufferSnapshot(model) if model is not None else None
        if model is not None:
            self.checker.gradient_monitor.watch_buffers(model)
        self._taken = False
        self.params = [
            p for opt in optimizers for group in opt.param_groups for p in group["params"]
        ]
        self.device = self.params[0].device
        self.fused = [skips_in_kernel(opt) for opt in optimizers]
        self.snapshots = [
            None if fused else StepSnapshot() for fused in self.fused
        ]  # masked_step's copies
        self.window = ScheduleWindow(
            [
                (opt, None if is_metric_scheduler(sched) else sched)
                for opt, sched in zip(optimizers, schedulers)
            ],
            check_every,
        )
        self.window.check()
        self.steps = 0  # guarded steps on this trajectory, applied or skipped
        self.window_start = 0  # steps at the last boundary (or rollback, or resume)
        self.last_save: int | None = None
        self.skipped = torch.zeros((), dtype=torch.long, device=self.device)  # in the open window
        self.codes = torch.zeros(
            check_every, dtype=torch.uint8, device=self.device
        )  # why each was skipped
        self.skipped_steps = 0  # skipped steps on the current trajectory (rewound on rollback)
        self.skip_events = 0  # every step ever skipped, rolled back or not
        self.last_report: dict[str, Any] | None = None
        self.reports: list[dict[str, Any]] = []

    # -- the step ----------------------------------------------------------------------------------

    def begin(self) -> bool:
        """Before a step's first micro-batch: ``False`` when the recovery asks to skip this batch.

        Refuses step hooks (they would see skipped steps) and writes the first rollback target
        before the first step.
        """
        if self.recovery is not None and self.recovery.should_skip_batch():
            return False
        for opt in self.optimizers:
            check_no_step_hooks(opt)
        if self.steps == 0 and self.last_save is None:
            self.save(math.inf)  # the first rollback target: a run that diverges at once
        return True

    def take_buffers(self) -> None:
        """Before the first forward pass of a step: copy the model's buffers (once per step)."""
        if self.buffers is not None and not self._taken:
            self.buffers.take()
            self._taken = True

    @torch.no_grad()
    def update(self, loss: torch.Tensor) -> torch.Tensor:
        """The guarded step on the gradients at hand, ``loss`` their loss; returns the skip flag."""
        if self.scaler is not None:
            for opt in self.optimizers:
                self.scaler.unscale_(opt)
        flag = self.checker.update(loss)
        skip = flag if self.skip_unstable else self.checker.nonfinite_grads
        norm = self.checker.last_grad_norm
        if self.clipper is not None:
            self.clipper.clip(self.params, total_norm=norm)
        elif self.max_grad_norm is not None:
            clip_grads_with_norm_(self.params, self.max_grad_norm, norm)
        found_inf = skip.to(torch.float32)
        with self.window.applied() as ratios:
            for opt, fused, snapshot in zip(self.optimizers, self.fused, self.snapshots):
                if fused:
                    fused_step(opt, found_inf)
                else:
                    masked_step(opt, found_inf, lr_ratios=ratios, snapshot=snapshot)
        if self._taken:
            self.buffers.restore_where(skip)  # what the forward passes moved (BatchNorm statistics)
            self._taken = False
        self.window.count(skip)
        for average in self.averaged:
            masked_update_parameters(average, self.model, skip)
        self.skipped.add_(skip)
        if logger.isEnabledFor(logging.INFO):  # the reasons are only read to be logged
            self.codes[(self.steps - self.window_start) % self.check_every] = self._code(skip)
        if self.scaler is not None:
            self.scaler.update()
        self.steps += 1
        if self.steps % self.check_every == 0:
            self.boundary()
        return skip

    def _code(self, skip: torch.Tensor) -> torch.Tensor:
        detector = self.checker.loss_monitor.detector
        bits = (
            detector.last_nonfinite.long()
            | detector.last_spike.long() * 2
            | self.checker.nonfinite_grads.long() * 4
            | self.checker.gradient_monitor.last_explosion.long() * 8
        )
        return (bits * skip.long()).to(torch.uint8)

    # -- the boundary ------------------------------------------------------------------------------

    def boundary(self) -> dict[str, Any]:
        """Read the statistics, step the schedules, log the skips, then roll back or checkpoint.

        Called between boundaries it ends the window early: the schedule moves on by the steps
        applied since the last boundary, as plain torch's would.
        """
        report = self.checker.check()
        if self.buffers is not None:
            # buffers registered in the window are copied from the next step on
            self.buffers.refresh()
        since = self.steps - self.window_start
        skipped, *codes = torch.cat(
            [self.skipped.view(1), self.codes[:since].long()]
        ).tolist()  # one read
        self.skipped.zero_()
        self.codes.zero_()
        self.skipped_steps += skipped
        self.skip_events += skipped
        self.window.close(since - skipped)
        self.window_start = self.steps
        self._log_skips(codes)
        report.update(step=self.steps, skipped_steps=skipped, recovered=None)
        metric_stepped = [s for s in self.schedulers if is_metric_scheduler(s)]
        if metric_stepped and math.isfinite(report["loss"]["median"]):
            for scheduler in metric_stepped:
                step_with_metric(scheduler, report["loss"]["median"])
            self.window.reopen()
        reason = self.recovery.rollback_reason(report) if self.recovery is not None else None
        if reason is not None:
            restored = self.roll_back(reason)
            report["recovered"] = reason
            report["restored_step"] = restored
        elif self.is_safe(report):  # a state to return to, and a window to compare with
            self.checker.accept(report)
            if self._checkpoint_due():
                self.save(report["loss"]["median"])
        self.last_report = report
        self.reports.append(report)
        return report

    def is_safe(self, report: dict[str, Any]) -> bool:
        """Whether the window just checked is a state to return to.

        Nothing flagged; or, when flagged steps are skipped (``skip_unstable``), nothing but
        isolated skipped steps: a skipped step never reached the weights, so one bad batch in
        every window still leaves checkpoints to roll back to. Two flagged steps in a row, a
        divergence or non-finite weights make a window unsafe.
        """
        if report["is_stable"]:
            return True
        return (
            self.skip_unstable
            and report["max_streak"] <= 1
            and report["weights_finite"]
            and not report["loss"].get("diverging")
        )

    def _log_skips(self, codes: list[int]) -> None:
        for offset, code in enumerate(codes):
            if code:
                why = ", ".join(name for bit, name in _REASONS if code & bit)
                logger.info(
                    "step %d: skipped (%s)", self.window_start - len(codes) + offset + 1, why
                )

    def roll_back(self, reason: str) -> int:
        """Load the newest checkpoint, cut the rate, reopen the window at the cut rate; its step."""
        manager = self.recovery.checkpoint_manager
        path = broadcast_from_rank0(
            manager.latest_path() if manager is not None else None, self.process_group
        )
        at = self.steps
        restored = self.recovery.recover(reason, path=path, extra=self._extra("rollback"))
        for opt, sched in zip(
            self.optimizers[1:], self.schedulers[1:]
        ):  # the first is cut by the recovery
            saved = lr_scale(opt)
            if saved != self.recovery.lr_scale:
                scale_learning_rate(opt, self.recovery.lr_scale / saved, sched)
        self.window.reopen()
        self.window_start = self.steps
        logger.warning(
            "step %d: rolled back to step %d (%s); learning rate now x%g of the schedule",
            at,
            restored,
            reason,
            self.recovery.lr_scale,
        )
        return restored

    # -- checkpoints -------------------------------------------------------------------------------

    def _extra(self, mode: str) -> dict[str, Any]:
        extra = dict(self.trajectory(mode))
        for i, (opt, sched) in enumerate(zip(self.optimizers[1:], self.schedulers[1:]), start=1):
            extra[f"optimizer_{i}"] = opt
            if sched is not None:
                extra[f"scheduler_{i}"] = sched
        extra.update({f"averaged_{i}": average for i, average in enumerate(self.averaged)})
        return extra

    def save(self, loss: float) -> None:
        """Write a checkpoint of everything (rank 0 writes; every rank waits for the file)."""
        manager = getattr(self.recovery, "checkpoint_manager", None)
        if manager is None:
            return
        self.last_save = self.steps
        extra = {**self._extra("save"), "recovery": self.recovery}
        if is_main_process(self.process_group):
            manager.save_checkpoint(
                self.model,
                self.optimizers[0],
                self.steps,
                loss if math.isfinite(loss) else math.inf,
                scheduler=self.schedulers[0],
                scaler=self.scaler,
                extra=extra,
            )
        barrier(self.process_group)  # no rank reads the directory before the file is complete

    def resume(self) -> int | None:
        """Load the newest valid checkpoint into everything; return its step (``None``: none)."""
        manager = getattr(self.recovery, "checkpoint_manager", None)
        if manager is None:
            raise ValueError(
                "resume() needs checkpoint_dir= (or a recovery with a checkpoint_manager)"
            )
        path = broadcast_from_rank0(manager.latest_path(), self.process_group)
        if path is None:
            return None
        step, _ = manager.load_checkpoint(
            self.model,
            self.optimizers[0],
            path,
            scheduler=self.schedulers[0],
            scaler=self.scaler,
            extra={**self._extra("resume"), "recovery": self.recovery},
            restore_rng=False,
        )
        self.window.reopen()
        self.window_start = self.steps
        return step

    def _checkpoint_due(self) -> bool:
        if self.save_every is None:
            return False
        return self.last_save is None or self.steps - self.last_save >= self.save_every

    # -- state -------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Counters, checker windows and clipper statistics (loads with ``weights_only=True``)."""
        state = {
            "steps": self.steps,
            "skipped_steps": self.skipped_steps,
            "skip_events": self.skip_events,
            "skipped": self.skipped.detach().clone(),
            "checker": self.checker.state_dict(),
            "last_save": -1 if self.last_save is None else self.last_save,
            "window_start": self.window_start,
            "codes": self.codes.detach().clone(),
            "applied": self.window.applied_steps.detach().clone(),
            "position": self.window.position,
        }
        if self.clipper is not None and hasattr(self.clipper, "state_dict"):
            state["clipper"] = self.clipper.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], trajectory_only: bool = False) -> None:
        """Restore what :meth:`state_dict` returned (a rollback keeps counting every skip
        ever made)."""
        if "total_skipped" in state and "skipped_steps" not in state:  # written by trainopt 0.4
            state = {**state, "skipped_steps": state["total_skipped"]}
        required = ("steps", "skipped_steps", "skipped", "checker", "last_save", "skip_events")
        missing = [k for k in required if k not in state]
        if ("clipper" in state) != (
            self.clipper is not None and hasattr(self.clipper, "state_dict")
        ):
            missing.append("clipper (in the state or in this stabilizer, not both)")
        if missing:
            raise KeyError(f"stabilizer state_dict does not fit: {missing}")
        self.checker.load_state_dict(state["checker"])
        if "clipper" in state:
            self.clipper.load_state_dict(state["clipper"])
        self.steps = int(state["steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self.last_save = None if int(state["last_save"]) < 0 else int(state["last_save"])
        self.skipped = state["skipped"].detach().clone().to(self.device)
        self.window_start = int(
            state.get("window_start", self.steps - self.steps % self.check_every)
        )
        if "codes" in state and state["codes"].numel() == self.check_every:
            self.codes = state["codes"].detach().clone().to(self.device)
        else:
            self.codes = torch.zeros(self.check_every, dtype=torch.uint8, device=self.device)
        if not trajectory_only:
            self.skip_events = int(state["skip_events"])

    def restore_window(self, state: dict[str, Any]) -> None:
        """Reopen the window mid-way, as :meth:`state_dict` saw it (a framework's own
        checkpoint)."""
        self.window.reopen()
        if "applied" in state:
            self.window.applied_steps.copy_(state["applied"].to(self.window.applied_steps.device))
            self.window.position = int(state.get("position", 0))


def _view(name: str, doc: str) -> property:
    return property(lambda self: getattr(self.core, name), doc=doc)


class CoreView:
    """What both front doors show of their :class:`GuardedUpdate` (``self.core``), under one
    name each.

    Counters: :attr:`steps` (guarded steps on the current trajectory), :attr:`skipped_steps`
    (skipped ones up to the last boundary), :attr:`skipped` (skipped in the open window, on the
    device), :attr:`skip_events` (every skip ever made, rolled back or not) and
    :attr:`applied_steps`.

    Example:
        >>> import torch
        >>> from trainopt.stability import TrainingStabilizer
        >>> model = torch.nn.Linear(2, 1)
        >>> stabilizer = TrainingStabilizer(
        ...     model, torch.optim.SGD(model.parameters(), lr=0.1), check_every=4
        ... )
        >>> for factor in (1.0, float("nan"), 1.0, 1.0):
        ...     _ = stabilizer.step(lambda: model(torch.ones(3, 2)).pow(2).mean() * factor)
        >>> # the boundary at 4:
        >>> stabilizer.steps, stabilizer.skipped_steps, stabilizer.applied_steps
        (4, 1, 3)
    """

    core: GuardedUpdate

    @property
    def applied_steps(self) -> int:
        """Optimizer steps applied on the current trajectory (reads the device)."""
        return self.core.steps - self.core.skipped_steps - int(self.core.skipped.item())

    def end_window(self) -> dict[str, Any]:
        """End the window now: read the statistics, step the schedules, then roll back or
        checkpoint.

        Called every ``check_every`` steps (every rank calls it); called between boundaries, the
        schedule moves on by the steps applied since the last one, as plain torch's would.
        Returns the boundary's report.
        """
        return self.core.boundary()

    def check(self) -> dict[str, Any]:
        """Deprecated: say :meth:`end_window`."""
        warnings.warn(
            f"{type(self).__name__}.check() is deprecated: say end_window()",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.end_window()

    @property
    def total_skipped(self) -> int:
        """Deprecated: say :attr:`skipped_steps`."""
        warnings.warn(
            f"{type(self).__name__}.total_skipped is deprecated: say skipped_steps",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.core.skipped_steps


for _name, _doc in (
    ("steps", "Guarded steps on the current trajectory, applied or skipped."),
    ("skipped", "Steps skipped in the open window (a 0-d device tensor)."),
    ("skipped_steps", "Skipped steps on the current trajectory up to the last boundary."),
    ("skip_events", "Every step ever skipped, rolled back or not."),
    ("last_report", "The report of the last boundary, or ``None``."),
    ("reports", "Every boundary's report."),
    ("checker", "The :class:`~trainopt.stability.monitoring.checker.StabilityChecker`."),
    (
        "recovery",
        "The :class:`~trainopt.stability.recovery.rollback.TrainingRecovery`, or ``None``.",
    ),
    ("window", "The :class:`~trainopt.stability.skipping.schedule.ScheduleWindow`."),
    ("last_save", "The step of the last checkpoint written, or ``None``."),
    ("save_every", "Steps between checkpoints, or ``None``."),
    ("check_every", "Steps between boundaries."),
    ("averaged", "The averaged models updated after each applied step."),
    ("data", "The position in the data saved with each checkpoint, or ``None``."),
    ("process_group", "The ranks that agree on every decision."),
    ("max_grad_norm", "The clipping threshold, or ``None``."),
    ("clipper", "The clipper used instead of ``max_grad_norm``, or ``None``."),
    ("skip_unstable", "Whether spikes and explosions are skipped too."),
    ("params", "Every parameter of the optimizers."),
    (
        "buffers",
        "The :class:`~trainopt.stability.skipping.buffers.BufferSnapshot` a skipped step restores.",
    ),
    ("device", "The parameters' device."),
):
    setattr(CoreView, _name, _view(_name, _doc))
