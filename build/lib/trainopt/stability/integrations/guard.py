"""The stabilizer's update as an optimizer: for training loops that someone else owns.

A framework (the Hugging Face ``Trainer``, Lightning, Accelerate) runs the forward and backward
passes, clips, and then calls ``optimizer.step()`` and ``scheduler.step()``.
:class:`GuardedOptimizer` is that optimizer: its :meth:`~GuardedOptimizer.step` is the second half
of :meth:`TrainingStabilizer.step <trainopt.stability.stabilizer.TrainingStabilizer.step>`, with
no host sync between boundaries:

1. the monitors of a :class:`~trainopt.stability.monitoring.checker.StabilityChecker` read the loss
   (given to :meth:`~GuardedOptimizer.observe`, or returned by the closure the framework passes) and
   the gradients, and return the flag agreed over the ranks;
2. optionally, clipping by the norm the monitor already measured (``max_grad_norm``; leave it
   ``None`` when the framework clips);
3. the wrapped optimizer's step, skipped on the device when flagged
   (:func:`~trainopt.stability.skipping.step.fused_step` or
   :func:`~trainopt.stability.skipping.step.masked_step`);
4. the learning rate of the window's applied-step count
   (:class:`~trainopt.stability.skipping.schedule.ScheduleWindow`): a skipped step consumes no
   schedule position. The framework steps :attr:`GuardedOptimizer.scheduler`, whose ``step()`` does
   nothing; the guard steps the real scheduler once per applied step at each boundary;
5. every ``check_every`` steps, a boundary on the host: the report, and with ``checkpoint_dir`` a
   rollback with a learning-rate cut
   (:class:`~trainopt.stability.recovery.rollback.TrainingRecovery`) or a checkpoint of the stable
   state to roll back to.

The guard's state (counters, monitor windows, the window's applied count) travels inside
``state_dict()``, so the framework's own checkpoint (``optimizer.pt`` of the ``Trainer``,
Lightning's ``.ckpt``, ``accelerator.save_state``) resumes it, mid-window included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainopt.stability.config import Detection, Rollback, grouped_settings
from trainopt.stability.core import CoreView, GuardedUpdate, build_checker, build_recovery
from trainopt.stability.settings import check_settings, is_metric_scheduler

__all__ = ["GuardedOptimizer", "WindowScheduler"]


class WindowScheduler(torch.optim.lr_scheduler.LRScheduler):
    """What the framework steps: ``step()`` does nothing, the guard steps the real scheduler.

    It is a ``LRScheduler`` (Lightning checks), drives the :class:`GuardedOptimizer` (Lightning
    checks that too), and saves and loads the real scheduler's state, so the framework's
    checkpoint holds the schedule.

    Example:
        >>> import torch
        >>> from trainopt.stability.integrations import GuardedOptimizer
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> opt = torch.optim.SGD([w], lr=1.0)
        >>> guarded = GuardedOptimizer(opt, torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5))
        >>> guarded.scheduler.step()  # the framework's call: the position is the guard's business
        >>> guarded.scheduler.get_last_lr()
        [1.0]
    """

    def __init__(self, guarded: GuardedOptimizer, scheduler: Any) -> None:  # noqa: D107 - no super(): it would step
        self.optimizer = guarded
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the real scheduler moves at each boundary, once per applied step."""

    def get_last_lr(self) -> list[float]:
        """The rate of each group as the guard's last step used it, as Python floats.

        What logging callbacks read (the ``Trainer``'s ``learning_rate`` after every step;
        Lightning's ``LearningRateMonitor`` reads ``param_groups``, which hold the same values):
        the rate at the host's count of steps, which is the rate applied until the window's first
        skipped step (see :mod:`trainopt.stability.skipping.schedule`).
        """
        return [g["lr"] for g in self.optimizer.param_groups]

    @property
    def last_epoch(self) -> int:
        """The real scheduler's position: the applied steps up to the last boundary."""
        return -1 if self.scheduler is None else self.scheduler.last_epoch

    def state_dict(self) -> dict[str, Any]:
        """The real scheduler's state (empty without one)."""
        return {} if self.scheduler is None else self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the real scheduler's state; the guard reopens its window at the next step."""
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict)
        if self.optimizer._reopen is None:
            self.optimizer._reopen = {}


class _Trajectory:
    """The guard's part of a checkpoint: the update's counters and monitor windows."""

    def __init__(self, guard: GuardedOptimizer, trajectory_only: bool) -> None:
        self.guard, self.trajectory_only = guard, trajectory_only

    def state_dict(self) -> dict[str, Any]:
        return self.guard.core.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.guard.core.load_state_dict(state, trajectory_only=self.trajectory_only)


class _Handles:
    """Both hooks of :meth:`GuardedOptimizer.watch`, removed together."""

    def __init__(self, *handles: Any) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class GuardedOptimizer(CoreView, torch.optim.Optimizer):
    """An optimizer whose ``step()`` is the stabilizer's guarded update (see the module notes).

    Args:
        optimizer: The optimizer to guard (one that
            :func:`~trainopt.stability.skipping.optimizers.check_skippable` accepts, with no step
            hooks).
        scheduler: Its learning-rate scheduler, or ``None``. Give the framework
            :attr:`scheduler` (a :class:`WindowScheduler`) instead of this one.
        model: The model; needed with ``checkpoint_dir`` (a rollback restores it).
        check_every: Steps between boundaries (host reads).
        max_grad_norm: Clip by the monitor's norm, or ``None`` (when the framework clips).
        checkpoint_dir: Where the guard saves the stable states it rolls back to; ``None``: no
            rollback (bad steps are still skipped).
        detection: What counts as a bad step (:class:`~trainopt.stability.config.Detection`).
        rollback: When states are saved and what a rollback does
            (:class:`~trainopt.stability.config.Rollback`; with ``checkpoint_dir``).
        process_group: The ranks that agree (``None``: the default group when initialised).

    Example:
        >>> import torch
        >>> from trainopt.stability.integrations import GuardedOptimizer
        >>> model = torch.nn.Linear(4, 1)
        >>> adamw = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        >>> guarded = GuardedOptimizer(adamw, check_every=10)
        >>> before = model.weight.detach().clone()
        >>> loss = model(torch.randn(8, 4)).sum() * float("nan")
        >>> loss.backward()
        >>> _ = guarded.step(lambda: loss)  # the closure returns the loss; NaN: skipped
        >>> torch.equal(model.weight, before)
        True
    """

    def __init__(  # noqa: PLR0913 - the loop's settings, each with a default
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        *,
        model: torch.nn.Module | None = None,
        checkpoint_dir: str | Path | None = None,
        check_every: int = 100,
        max_grad_norm: float | None = None,
        detection: Detection | None = None,
        rollback: Rollback | None = None,
        process_group: Any = None,
        **deprecated: Any,
    ) -> None:
        self.detection, self.rollback = grouped_settings(
            "GuardedOptimizer", detection, rollback, deprecated
        )
        check_settings(
            model,
            [optimizer],
            [scheduler],
            dtype=None,
            scaler=None,
            check_every=check_every,
            accumulate=1,
            max_grad_norm=max_grad_norm,
            checkpoint_dir=checkpoint_dir,
            rollback=None,
            recovery=None,
        )
        if checkpoint_dir is not None and model is None:
            raise ValueError("checkpoint_dir= needs model= (a rollback restores the model)")
        self.optimizer, self.model = optimizer, model
        self.param_groups, self.state = optimizer.param_groups, optimizer.state
        self.defaults = optimizer.defaults
        recovery = None
        if checkpoint_dir is not None:
            recovery = build_recovery(
                self.rollback,
                model,
                optimizer,
                checkpoint_dir,
                check_every=check_every,
                scheduler=scheduler,
            )
        checker = build_checker(self.detection, optimizer, check_every, process_group)
        self.core = GuardedUpdate(
            model,
            [optimizer],
            [scheduler],
            checker=checker,
            recovery=recovery,
            check_every=check_every,
            max_grad_norm=max_grad_norm,
            skip_unstable=self.detection.skip_unstable,
            process_group=process_group,
            trajectory=lambda mode: {
                "guard": _Trajectory(self, trajectory_only=mode == "rollback")
            },
        )
        self.scheduler = WindowScheduler(
            self, None if is_metric_scheduler(scheduler) else scheduler
        )
        self.metric_scheduler = scheduler if is_metric_scheduler(scheduler) else None
        self._loss_sum: torch.Tensor | None = None
        self._loss_count = 0
        self._reopen: dict[str, Any] | None = None  # the update's state to reopen the window with

    def observe(self, loss: torch.Tensor) -> None:
        """Record a micro-batch's loss (device only); the next :meth:`step` monitors their mean."""
        loss = loss.detach().float().reshape(())
        self._loss_sum = loss if self._loss_count == 0 else self._loss_sum + loss
        self._loss_count += 1

    def watch(self, model: torch.nn.Module) -> Any:
        """Observe ``model(...).loss`` of every training forward pass; returns the hook's handle.

        The hook also copies the model's buffers before a step's first training forward pass, so
        a skipped step puts BatchNorm's running statistics back.
        """

        def before(module: torch.nn.Module, args: Any) -> None:
            if module.training and torch.is_grad_enabled() and module is self.core.model:
                self.core.take_buffers()

        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
            if module.training and torch.is_grad_enabled() and torch.is_tensor(loss):
                self.observe(loss)

        pre = model.register_forward_pre_hook(before)
        handle = model.register_forward_hook(hook)
        return _Handles(pre, handle)

    def _prepare(self) -> None:
        """Before a step: reopen the window after a load, save the first rollback target."""
        if self._reopen is not None:
            self.core.restore_window(self._reopen)
            self._reopen = None
        self.core.begin()

    @torch.no_grad()
    def step(self, closure: Any = None) -> torch.Tensor:  # type: ignore[override]
        """The guarded update; ``closure`` (if given) runs first and returns the loss. Returns the
        loss."""
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
            if loss is not None:
                self.observe(loss)
        if self._loss_count == 0:
            raise RuntimeError(
                "GuardedOptimizer.step() has no loss to monitor: call observe(loss) after the "
                "backward pass, pass a closure that returns it, or watch(model)"
            )
        loss = self._loss_sum if self._loss_count == 1 else self._loss_sum / self._loss_count
        self._loss_sum, self._loss_count = None, 0
        self._prepare()
        self.core.update(loss)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The wrapped optimizer's ``zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the monitors and the window are built for the groups at hand."""
        raise TypeError("add a param group to the optimizer before guarding it")

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state plus the guard's, under ``"trainopt"`` (``weights_only``
        loads it).

        Saved mid-window too (a framework checkpoints when it likes): the groups hold the
        boundary's rates, and the update's state the window's applied count.
        """
        self.core.window.restore()
        try:
            state = self.optimizer.state_dict()
        finally:
            self.core.window._publish()
        guard = {"update": self.core.state_dict()}
        if self.core.recovery is not None:
            guard["recovery"] = self.core.recovery.state_dict()
        if self.metric_scheduler is not None:
            guard["metric_scheduler"] = self.metric_scheduler.state_dict()
        return {**state, "trainopt": guard}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load both; the window reopens at the next step with the saved applied count."""
        state_dict = dict(state_dict)
        guard = state_dict.pop("trainopt", None)
        if guard is None or "update" not in guard:
            raise KeyError(
                "this optimizer state was not saved by a GuardedOptimizer of this trainopt "
                "(no 'trainopt' entry with the update's state)"
            )
        self.optimizer.load_state_dict(state_dict)
        self.param_groups, self.state = self.optimizer.param_groups, self.optimizer.state
        self.core.load_state_dict(guard["update"])
        if self.core.recovery is not None and "recovery" in guard:
            self.core.recovery.load_state_dict(guard["recovery"])
        if self.metric_scheduler is not None and "metric_scheduler" in guard:
            self.metric_scheduler.load_state_dict(guard["metric_scheduler"])
        self._reopen = guard["update"]

    def __repr__(self) -> str:
        return f"GuardedOptimizer({self.optimizer!r}, check_every={self.check_every})"

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
