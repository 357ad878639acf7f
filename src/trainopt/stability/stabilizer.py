"""A stabilized training step that costs no host-device synchronisation in the steady state.

:class:`TrainingStabilizer` composes, in this order, what a stable mixed-precision step needs:

1. ``torch.amp.autocast(device_type, dtype)`` around the forward pass;
2. a loss scaler (:class:`~trainopt.stability.scaling.DynamicLossScaler`) for ``float16`` only, and its
   ``unscale_`` before anything looks at the gradients (``bfloat16`` needs no scaling);
3. the monitors of a :class:`~trainopt.stability.checker.StabilityChecker`: loss spikes, gradient
   norms, explosions, with the flag agreed over the ranks when ``torch.distributed`` is initialised;
4. gradient clipping with the norm the monitor already measured;
5. the optimizer step, *skipped on the device* when a gradient is non-finite (and, by default,
   when the loss spikes or the gradient norm explodes): fused optimizers get the flag as their
   ``found_inf`` (:func:`~trainopt.stability.skip.fused_step`), others step through
   :func:`~trainopt.stability.skip.masked_step`. A skipped step leaves the weights and the
   optimizer state exactly as if it had never run, first step included, for every optimizer
   that :func:`~trainopt.stability.optimizers.check_skippable` accepts (it refuses the others
   when the stabilizer is built);
6. every ``check_every`` steps, one boundary where the host reads the statistics: it reconciles
   the learning-rate schedule with the steps actually applied, saves a checkpoint while the run
   is stable, and lets :class:`~trainopt.stability.recovery.TrainingRecovery` roll back when it is not.

Where the host syncs. Nowhere between boundaries, on CPU and on CUDA, for the optimizers the
stabilizer accepts: fused ones; SGD; and on CUDA the ``capturable=True`` variants of the others
(their default ``capturable=False`` keeps step counters on the CPU, and is refused there). A
scaler's ``skip_mode`` does not matter here: the stabilizer steps the optimizer itself.

Skipped steps and the schedule. A skipped step must not advance the schedule, but knowing that
a step was skipped needs the host. The stabilizer steps the scheduler every step and, at each
boundary, rewinds it by the number of steps skipped in the window: for a ``LambdaLR`` (every
:mod:`trainopt.schedules` schedule is one) it sets ``last_epoch`` back and recomputes the rates
in closed form; any other scheduler holds still for that many steps instead. So at every boundary
the schedule position equals the number of applied optimizer steps, and in between it runs
ahead by at most the steps skipped since the last boundary.

Checkpoints and restarts. A boundary checkpoint holds the model, the optimizer, the scheduler,
the scaler, the recovery's state (its learning-rate scale included) and, for every rank, the
stabilizer's counters, its checker windows, the clipper's statistics, the random number
generators and the position in the data (``data=``, e.g. a
:class:`~trainopt.stability.data.ResumableSampler`). :meth:`TrainingStabilizer.resume` loads the
newest valid one, so a killed run continues as the run it replaced. Rank 0 writes; every rank
loads the file rank 0 picked.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from trainopt.stability.checker import StabilityChecker
from trainopt.stability.clipping import clip_grads_with_norm_
from trainopt.stability.distributed import (
    all_gather,
    barrier,
    broadcast_from_rank0,
    is_main_process,
    rank_and_world,
)
from trainopt.stability.optimizers import check_skippable, skips_in_kernel
from trainopt.stability.rng import get_rng_state, set_rng_state
from trainopt.stability.scaling import DynamicLossScaler
from trainopt.stability.skip import fused_step, masked_step

__all__ = ["StabilityChecker", "TrainingStabilizer"]

_DTYPES = {None: None, "fp32": None, "float32": None, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16}

_TRAJECTORY = ("steps", "total_skipped", "scheduler_debt", "skipped", "checker")


class _RankEntries:
    """The per-rank part of a checkpoint: each rank's stabilizer state, generators and data position.

    ``state_dict`` gives this rank's entry in its slot; ``load_state_dict`` takes this rank's
    entry: everything on a resume, only the stabilizer's trajectory on a rollback (the run moves
    on in the data and the random numbers, and keeps counting skipped steps).
    """

    def __init__(self, stabilizer: TrainingStabilizer, resume: bool) -> None:
        self.stabilizer, self.resume = stabilizer, resume

    def local(self) -> dict[str, Any]:
        data = self.stabilizer.data
        return {"stabilizer": self.stabilizer.state_dict(), "rng": get_rng_state(),
                "data": None if data is None else data.state_dict()}

    def state_dict(self) -> dict[str, Any]:
        rank, world = rank_and_world(self.stabilizer.process_group)
        return {"ranks": [self.local() if r == rank else None for r in range(world)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rank, world = rank_and_world(self.stabilizer.process_group)
        if len(state["ranks"]) != world:
            raise ValueError(f"the checkpoint holds {len(state['ranks'])} ranks, this run has {world}")
        entry = state["ranks"][rank]
        if not self.resume:
            self.stabilizer._load_trajectory(entry["stabilizer"])
            return
        if (entry["data"] is None) != (self.stabilizer.data is None):
            raise ValueError("the checkpoint and this run disagree on whether there is a data position (data=)")
        self.stabilizer.load_state_dict(entry["stabilizer"])
        if self.stabilizer.data is not None:
            self.stabilizer.data.load_state_dict(entry["data"])
        set_rng_state(entry["rng"])


class _Gathered:
    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state


class TrainingStabilizer:
    """One call per training step: autocast, scaling, monitoring, clipping, a guarded update.

    Args:
        model: The model being trained (its parameters pick the device type of autocast).
        optimizer: An optimizer that :func:`~trainopt.stability.optimizers.check_skippable`
            accepts; others raise :class:`~trainopt.stability.optimizers.UnsupportedOptimizerError`
            here, naming what to use instead. Fused ones skip inside their kernel; the others go
            through :func:`~trainopt.stability.skip.masked_step` (a copy of parameters and state
            per step).
        scheduler: A learning-rate scheduler to step once per call (see the module notes on
            skipped steps), or ``None``. ``ReduceLROnPlateau`` needs a metric: step it yourself.
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
        checker: A :class:`~trainopt.stability.checker.StabilityChecker`; one is built on
            ``optimizer`` by default.
        data: The position in the data (``state_dict()``/``load_state_dict()``, e.g. a
            :class:`~trainopt.stability.data.ResumableSampler`), saved with every checkpoint.
        process_group: The ranks that agree on every decision; ``None`` is the default group
            when ``torch.distributed`` is initialised (nothing to agree on otherwise).

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
        data: Any = None,
        process_group: Any = None,
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
        if scheduler is not None and (isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
                                      or not callable(getattr(scheduler, "step", None))):
            raise ValueError(f"scheduler must be stepped once per step with no argument; a "
                             f"{type(scheduler).__name__} is not: step it yourself and pass it to the recovery only")
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
        self.data = data
        self.process_group = process_group
        self.checker = checker or StabilityChecker(optimizer, check_every=check_every, process_group=process_group)
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.device = self.params[0].device
        self.fused = skips_in_kernel(optimizer)
        self.steps = 0
        self.skipped = torch.zeros((), dtype=torch.long, device=self.device)
        self.total_skipped = 0  # skipped steps on the current trajectory (rewound on rollback)
        self.skip_events = 0  # every step ever skipped, rolled back or not
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
        found_inf = skip.to(torch.float32)
        if self.fused:
            fused_step(self.optimizer, found_inf)
        else:
            masked_step(self.optimizer, found_inf)
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
            path = broadcast_from_rank0(self.recovery.checkpoint_manager.latest_path()
                                        if self.recovery.checkpoint_manager is not None else None,
                                        self.process_group)
            self.recovery.recover(reason, path=path, extra={"stabilizer": _RankEntries(self, resume=False)})
            report["recovered"] = reason
        elif report["is_stable"] and self._checkpoint_due():
            self._save(report["loss"]["median"])
        self.last_report = report
        self.reports.append(report)
        return report

    def _save(self, loss: float) -> None:
        ranks = {"ranks": all_gather(_RankEntries(self, resume=True).local(), self.process_group)}
        if is_main_process(self.process_group):
            self.recovery.checkpoint_manager.save_checkpoint(
                self.model, self.optimizer, self.steps, loss if math.isfinite(loss) else math.inf,
                scheduler=self.scheduler, scaler=self.scaler,
                extra={"stabilizer": _Gathered(ranks), "recovery": self.recovery},
            )
        barrier(self.process_group)  # no rank reads the directory before the file is complete

    def resume(self) -> int | None:
        """Load the newest valid boundary checkpoint into everything; return its step (``None``: none).

        Model, optimizer, scheduler, scaler, the recovery's state, and this rank's stabilizer
        state, random number generators and data position: the run continues exactly where the
        checkpoint was taken. Every rank loads the file rank 0 picked.
        """
        manager = getattr(self.recovery, "checkpoint_manager", None)
        if manager is None:
            raise ValueError("resume() needs a recovery with a checkpoint_manager")
        path = broadcast_from_rank0(manager.latest_path(), self.process_group)
        if path is None:
            return None
        step, _ = manager.load_checkpoint(
            self.model, self.optimizer, path, scheduler=self.scheduler, scaler=self.scaler,
            extra={"recovery": self.recovery, "stabilizer": _RankEntries(self, resume=True)}, restore_rng=False,
        )
        return step

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
        """Counters, checker windows and clipper statistics (loads with ``weights_only=True``)."""
        state = {"steps": self.steps, "total_skipped": self.total_skipped, "skip_events": self.skip_events,
                 "scheduler_debt": self.scheduler_debt, "skipped": self.skipped.detach().clone(),
                 "checker": self.checker.state_dict()}
        if self.clipper is not None and hasattr(self.clipper, "state_dict"):
            state["clipper"] = self.clipper.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._load_trajectory(state)
        self.skip_events = int(state["skip_events"])

    def _load_trajectory(self, state: dict[str, Any]) -> None:
        """Everything but the count of every skip ever made (a rollback keeps counting)."""
        missing = [k for k in (*_TRAJECTORY, "skip_events") if k not in state]
        if ("clipper" in state) != (self.clipper is not None and hasattr(self.clipper, "state_dict")):
            missing.append("clipper (in the state or in this stabilizer, not both)")
        if missing:
            raise KeyError(f"TrainingStabilizer state_dict does not fit: {missing}")
        self.checker.load_state_dict(state["checker"])
        if "clipper" in state:
            self.clipper.load_state_dict(state["clipper"])
        self.steps = int(state["steps"])
        self.total_skipped = int(state["total_skipped"])
        self.scheduler_debt = int(state["scheduler_debt"])
        self.skipped = state["skipped"].detach().clone().to(self.device)
