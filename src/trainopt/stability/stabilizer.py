"""A stabilized training step that costs no host-device synchronisation in the steady state.

:class:`TrainingStabilizer` composes, in this order, what a stable mixed-precision step needs:

1. ``torch.amp.autocast(device_type, dtype)`` around the forward pass;
2. a loss scaler (:class:`~trainopt.stability.scaling.DynamicLossScaler`) for ``float16`` only, and its
   ``unscale_`` before anything looks at the gradients (``bfloat16`` needs no scaling);
3. the monitors of a :class:`StabilityChecker`: loss spikes, gradient norms, explosions;
4. gradient clipping with the norm the monitor already measured;
5. the optimizer step, *skipped on the device* when a gradient is non-finite (and, by default,
   when the loss spikes or the gradient norm explodes): the flag goes to fused optimizers as
   their ``found_inf`` argument, and other optimizers step through
   :func:`~trainopt.stability.skip.masked_step`. No inf/NaN ever reaches the weights or the optimizer
   state, and nothing is read on the host to decide;
6. every ``check_every`` steps, one boundary where the host reads the statistics: it reconciles
   the learning-rate schedule with the steps actually applied, saves a checkpoint while the run
   is stable, and lets :class:`~trainopt.stability.recovery.TrainingRecovery` roll back when it is not.

Skipped steps and the schedule. A skipped step must not advance the schedule, but knowing that
a step was skipped needs the host. The stabilizer steps the scheduler every step and, at each
boundary, rewinds it by the number of steps skipped in the window: for a ``LambdaLR`` (every
:mod:`trainopt.schedules` schedule is one) it sets ``last_epoch`` back and recomputes the rates
in closed form; any other scheduler holds still for that many steps instead. So at every boundary
the schedule position equals the number of applied optimizer steps, and in between it runs
ahead by at most the steps skipped since the last boundary.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from trainopt.stability.clipping import clip_grads_with_norm_
from trainopt.stability.gradients import GradientMonitor
from trainopt.stability.monitors import LossStabilityMonitor
from trainopt.stability.scaling import DynamicLossScaler
from trainopt.stability.optimizers import check_skippable, skips_in_kernel
from trainopt.stability.skip import fused_step, masked_step

_DTYPES = {None: None, "fp32": None, "float32": None, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16}


class StabilityChecker:
    """Loss and gradient monitors behind one ``update`` (device only) and one ``check`` (host).

    :meth:`update` returns a 0-d bool tensor per step: ``True`` when the loss is non-finite or
    spikes, or the gradient norm is non-finite or explodes. :meth:`check` reads the monitors and
    says whether the last window was stable, and why not.

    Args:
        model_or_optimizer: What the :class:`~trainopt.stability.gradients.GradientMonitor` measures (an
            optimizer gives per-group norms).
        loss_monitor: Defaults to ``LossStabilityMonitor(check_every=check_every)``.
        gradient_monitor: Defaults to ``GradientMonitor(model_or_optimizer, check_every=check_every)``.
        check_every: Steps between host reads.

    Example:
        >>> import torch
        >>> from trainopt.stability import StabilityChecker
        >>> model = torch.nn.Linear(4, 1)
        >>> checker = StabilityChecker(model, check_every=20)
        >>> for step in range(20):
        ...     model.zero_grad()
        ...     loss = model(torch.randn(8, 4)).pow(2).mean()
        ...     loss.backward()
        ...     flag = checker.update(loss)
        >>> report = checker.check()
        >>> report["is_stable"], report["flagged_steps"]
        (True, 0)
    """

    def __init__(
        self,
        model_or_optimizer: torch.nn.Module | torch.optim.Optimizer,
        loss_monitor: LossStabilityMonitor | None = None,
        gradient_monitor: GradientMonitor | None = None,
        check_every: int = 100,
    ) -> None:
        self.loss_monitor = loss_monitor or LossStabilityMonitor(check_every=check_every)
        self.gradient_monitor = gradient_monitor or GradientMonitor(model_or_optimizer, check_every=check_every)
        self.check_every = check_every
        self.flagged = torch.zeros((), dtype=torch.long)
        self.last_flag = torch.tensor(False)
        self.last_grad_norm = torch.tensor(math.nan)
        self.nonfinite_grads = torch.tensor(False)

    @torch.no_grad()
    def update(self, loss: torch.Tensor) -> torch.Tensor:
        """Fold this step's loss and gradients into the monitors; return the "unstable" flag."""
        self.loss_monitor.update(loss)
        self.last_grad_norm = self.gradient_monitor.update()
        detector = self.loss_monitor.detector
        self.nonfinite_grads = ~torch.isfinite(self.last_grad_norm)
        self.last_flag = (detector.last_spike | detector.last_nonfinite | self.nonfinite_grads
                          | self.gradient_monitor.last_explosion)
        if self.flagged.device != self.last_flag.device:
            self.flagged = self.flagged.to(self.last_flag.device)
        self.flagged.add_(self.last_flag.long())
        return self.last_flag

    def check(self) -> dict[str, Any]:
        """Read both monitors (host), start a new window, return a report with ``is_stable``."""
        loss = self.loss_monitor.check()
        grads = self.gradient_monitor.check()
        flagged = int(self.flagged.item())
        self.flagged.zero_()
        reasons = []
        if loss["nonfinite"]:
            reasons.append(f"{loss['nonfinite']} non-finite losses")
        if loss["spikes"]:
            reasons.append(f"{loss['spikes']} loss spikes (max robust z {loss['max_z']:.1f})")
        if grads["nonfinite"]:
            reasons.append(f"{grads['nonfinite']} non-finite gradient norms")
        if grads["explosions"]:
            reasons.append(f"{grads['explosions']} gradient explosions (max norm {grads['max_grad_norm']:.3g})")
        return {
            "is_stable": not reasons,
            "reasons": reasons,
            "flagged_steps": flagged,
            "weights_finite": math.isfinite(grads["param_norm"]),
            "loss": loss,
            "gradients": grads,
        }

    def state_dict(self) -> dict[str, Any]:
        """Settings, counters and tensors: everything to resume (loads with ``weights_only=True``)."""
        return {"loss_monitor": self.loss_monitor.state_dict(),
                "gradient_monitor": self.gradient_monitor.state_dict(),
                "flagged": self.flagged.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.loss_monitor.load_state_dict(state["loss_monitor"])
        self.gradient_monitor.load_state_dict(state["gradient_monitor"])
        self.flagged = state["flagged"].detach().clone().to(self.flagged.device)


class TrainingStabilizer:
    """One call per training step: autocast, scaling, monitoring, clipping, a guarded update.

    Args:
        model: The model being trained (its parameters pick the device type of autocast).
        optimizer: Any optimizer. Fused ones (``torch.optim.AdamW(..., fused=True)``) skip a
            step inside their kernel; others go through :func:`~trainopt.stability.skip.masked_step`,
            which copies parameters and state every step. Either way nothing syncs.
        scheduler: A learning-rate scheduler to step once per call (see the module notes on
            skipped steps), or ``None``.
        dtype: Autocast dtype: ``torch.bfloat16``, ``torch.float16`` (adds a loss scaler) or
            ``None`` for full precision. The strings ``"bf16"``, ``"fp16"``, ``"fp32"`` work too.
        scaler: A loss scaler with the ``torch.amp.GradScaler`` interface; for ``float16`` only,
            defaults to :class:`~trainopt.stability.scaling.DynamicLossScaler`.
        max_grad_norm: Global-norm clipping threshold, or ``None`` for no clipping.
        clipper: A clipper with ``clip(params, total_norm=...)`` (e.g.
            :class:`~trainopt.stability.clipping.ZScoreClipper`), used instead of ``max_grad_norm``.
        check_every: Steps between host reads (the boundaries).
        skip_unstable: Also skip steps whose loss spikes or whose gradient norm explodes (steps
            with non-finite gradients are always skipped).
        recovery: A :class:`~trainopt.stability.recovery.TrainingRecovery` for rollbacks; its checkpoint
            manager receives a checkpoint at every stable boundary where its ``should_save(step)``
            is true (make ``save_frequency`` a multiple of ``check_every``).
        checker: A :class:`StabilityChecker`; one is built on ``optimizer`` by default.

    Example:
        >>> import torch
        >>> from trainopt.stability import TrainingStabilizer
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> model = torch.nn.Linear(4, 1)
        >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        >>> stabilizer = TrainingStabilizer(model, opt, max_grad_norm=1.0, check_every=10)
        >>> x, y = torch.randn(64, 4), torch.randn(64, 1)
        >>> loss = stabilizer.step(lambda: (model(x) - y).pow(2).mean())
        >>> before = model.weight.detach().clone()
        >>> loss = stabilizer.step(lambda: (model(x) - y).pow(2).mean() * float("nan"))
        >>> torch.equal(model.weight, before)  # the NaN step was skipped on the device
        True
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        *,
        dtype: torch.dtype | str | None = None,
        scaler: Any = None,
        max_grad_norm: float | None = 1.0,
        clipper: Any = None,
        check_every: int = 100,
        skip_unstable: bool = True,
        recovery: Any = None,
        checker: StabilityChecker | None = None,
    ) -> None:
        if isinstance(dtype, str) or dtype is None:
            if dtype not in _DTYPES:
                raise ValueError(f"dtype must be one of {sorted(k for k in _DTYPES if k)} or a torch dtype, got {dtype=}")
            dtype = _DTYPES[dtype]
        if dtype not in (None, torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"dtype must be torch.bfloat16, torch.float16, torch.float32 or None, got {dtype=}")
        if dtype is torch.float32:
            dtype = None
        if scaler is not None and dtype is not torch.float16:
            raise ValueError(f"a loss scaler is only needed with dtype=torch.float16, got {dtype=}")
        if not isinstance(check_every, int) or isinstance(check_every, bool) or check_every < 1:
            raise ValueError(f"check_every must be a positive int, got {check_every=}")
        if max_grad_norm is not None and not (isinstance(max_grad_norm, (int, float)) and max_grad_norm > 0):
            raise ValueError(f"max_grad_norm must be a positive number or None, got {max_grad_norm=}")
        check_skippable(optimizer)
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.dtype = dtype
        self.scaler = scaler if scaler is not None else (DynamicLossScaler() if dtype is torch.float16 else None)
        self.max_grad_norm = max_grad_norm
        self.clipper = clipper
        self.check_every = check_every
        self.skip_unstable = skip_unstable
        self.recovery = recovery
        self.checker = checker or StabilityChecker(optimizer, check_every=check_every)
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.device = self.params[0].device
        self.fused = skips_in_kernel(optimizer)
        self.steps = 0
        self.skipped = torch.zeros((), dtype=torch.long, device=self.device)
        self.total_skipped = 0  # skipped steps on the current trajectory (rewound on rollback)
        self.skip_events = 0  # every step ever skipped, rolled back or not
        self._skipped_at_checkpoint: dict[int, int] = {}
        self.scheduler_debt = 0
        self.last_report: dict[str, Any] | None = None
        self.reports: list[dict[str, Any]] = []

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast context of this stabilizer (a no-op in full precision)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.amp.autocast(self.device.type, dtype=self.dtype)

    def step(self, compute_loss: Callable[[], torch.Tensor]) -> torch.Tensor | None:
        """Run one guarded training step; return the loss (a detached tensor, not read).

        ``compute_loss`` runs the forward pass and returns the scalar loss; it runs under
        autocast. Returns ``None`` without computing anything when the recovery asks to skip
        this batch (after a rollback).
        """
        if self.recovery is not None and self.recovery.should_skip_batch():
            return None
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = compute_loss()
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        loss = loss.detach()
        flag = self.checker.update(loss)
        skip = flag if self.skip_unstable else self.checker.nonfinite_grads
        norm = self.checker.last_grad_norm
        if self.clipper is not None:
            self.clipper.clip(self.params, total_norm=norm)
        elif self.max_grad_norm is not None:
            clip_grads_with_norm_(self.params, self.max_grad_norm, norm)
        self._optimizer_step(skip)
        self.skipped.add_(skip.long())
        if self.scaler is not None:
            self.scaler.update()
        if self.scheduler is not None:
            if self.scheduler_debt:
                self.scheduler_debt -= 1
            else:
                self.scheduler.step()
        self.steps += 1
        if self.steps % self.check_every == 0:
            self.check()
        return loss

    def _optimizer_step(self, skip: torch.Tensor) -> None:
        found_inf = skip.to(torch.float32)
        if self.fused:
            fused_step(self.optimizer, found_inf)
        else:
            masked_step(self.optimizer, found_inf)

    def check(self) -> dict[str, Any]:
        """The boundary: read the statistics, fix the schedule, checkpoint or recover."""
        report = self.checker.check()
        skipped = int(self.skipped.item())
        self.skipped.zero_()
        self.total_skipped += skipped
        self.skip_events += skipped
        report.update(step=self.steps, skipped_steps=skipped, recovered=None)
        self._reconcile_schedule(skipped)
        reason = self.recovery.check(report) if self.recovery is not None else None
        if reason is not None:
            self.steps = self.recovery.recover(reason)
            self.total_skipped = self._skipped_at_checkpoint.get(self.steps, self.total_skipped)
            self.scheduler_debt = 0
            report["recovered"] = reason
        elif report["is_stable"] and self._checkpoint_due():
            loss = report["loss"]["median"]
            self.recovery.checkpoint_manager.save_checkpoint(
                self.model, self.optimizer, self.steps, loss if math.isfinite(loss) else math.inf,
                scheduler=self.scheduler, scaler=self.scaler,
            )
            self._skipped_at_checkpoint[self.steps] = self.total_skipped
        self.last_report = report
        self.reports.append(report)
        return report

    def _checkpoint_due(self) -> bool:
        manager = getattr(self.recovery, "checkpoint_manager", None)
        if manager is None:
            return False
        should_save = getattr(manager, "should_save", None)
        return should_save is None or bool(should_save(self.steps))

    def _reconcile_schedule(self, skipped: int) -> None:
        if self.scheduler is None or skipped == 0:
            return
        if isinstance(self.scheduler, torch.optim.lr_scheduler.LambdaLR):
            self.scheduler.last_epoch -= skipped + 1
            self.scheduler.step()  # LambdaLR recomputes lr = base_lr * lambda(last_epoch)
        else:
            self.scheduler_debt += skipped

    @property
    def applied_steps(self) -> int:
        """Optimizer steps applied so far (exact at boundaries; reads the device)."""
        return self.steps - self.total_skipped - int(self.skipped.item())

    def state_dict(self) -> dict[str, Any]:
        """Settings, counters and tensors: everything to resume (loads with ``weights_only=True``)."""
        state = {"steps": self.steps, "total_skipped": self.total_skipped, "skip_events": self.skip_events,
                 "scheduler_debt": self.scheduler_debt, "skipped": self.skipped.detach().clone(),
                 "checker": self.checker.state_dict()}
        if self.clipper is not None and hasattr(self.clipper, "state_dict"):
            state["clipper"] = self.clipper.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.steps = int(state["steps"])
        self.total_skipped = int(state["total_skipped"])
        self.skip_events = int(state.get("skip_events", self.total_skipped))
        self.scheduler_debt = int(state["scheduler_debt"])
        self.skipped = state["skipped"].detach().clone().to(self.device)
        self.checker.load_state_dict(state["checker"])
        if "clipper" in state and self.clipper is not None:
            self.clipper.load_state_dict(state["clipper"])
