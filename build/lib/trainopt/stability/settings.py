"""The settings of a :class:`~trainopt.stability.stabilizer.TrainingStabilizer`, checked before
anything is built."""

from __future__ import annotations

from typing import Any

import torch

from trainopt.config.precisions import ALIASES, AUTOCAST_DTYPES
from trainopt.stability.skipping.optimizers import (
    check_no_step_hooks,
    check_skippable,
    keep_state_on_device,
)
from trainopt.validation import check_int

__all__ = ["DTYPES", "check_settings", "is_metric_scheduler", "step_with_metric"]

# the stabilizer's autocast names: the one vocabulary's, less tf32 (a matmul mode, not a dtype)
DTYPES = {
    None: None,
    **{name: AUTOCAST_DTYPES[name] for name in ("fp32", "bf16", "fp16")},
    **{alias: AUTOCAST_DTYPES[name] for alias, name in ALIASES.items()},
}


def is_metric_scheduler(scheduler: Any) -> bool:
    """Whether ``scheduler`` is stepped with a metric (``ReduceLROnPlateau``,
    ``AdaptiveLearningRate``).

    Example:
        >>> import torch
        >>> from trainopt.stability.settings import is_metric_scheduler
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> is_metric_scheduler(torch.optim.lr_scheduler.ReduceLROnPlateau(opt))
        True
    """
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) or callable(
        getattr(scheduler, "update_lr", None)
    )


def step_with_metric(scheduler: Any, metric: float) -> None:
    """Step a scheduler of :func:`is_metric_scheduler` with ``metric`` (the window's median loss).

    Example:
        >>> import torch
        >>> from trainopt.stability.settings import step_with_metric
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        >>> plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        >>> for loss in (1.0, 1.0, 1.0):
        ...     step_with_metric(plateau, loss)
        >>> opt.param_groups[0]["lr"]
        0.025
    """
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        scheduler.step(metric)
    else:
        scheduler.update_lr(metric)


def check_settings(
    model: torch.nn.Module,
    optimizers: list[Any],
    schedulers: list[Any],
    *,
    dtype: Any,
    scaler: Any,
    check_every: Any,
    accumulate: Any,
    max_grad_norm: Any,
    checkpoint_dir: Any,
    rollback: Any,
    recovery: Any,
) -> None:
    """Refuse inconsistent settings with an error that names the argument and what is allowed.

    Example:
        >>> import torch
        >>> from trainopt.stability.settings import check_settings
        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> try:
        ...     check_settings(
        ...         model, [opt], [None], dtype=None, scaler=None, check_every=0, accumulate=1,
        ...         max_grad_norm=1.0, checkpoint_dir=None, rollback=None, recovery=None,
        ...     )
        ... except ValueError as error:
        ...     print(error)
        check_every must be an int >= 1, got check_every=0
    """
    if (isinstance(dtype, str) or dtype is None) and dtype not in DTYPES:
        raise ValueError(
            f"dtype must be one of {sorted(k for k in DTYPES if k)} or a torch dtype, got {dtype=}"
        )
    if not (isinstance(dtype, str) or dtype is None) and dtype not in (
        torch.float32,
        torch.bfloat16,
        torch.float16,
    ):
        raise ValueError(
            f"dtype must be torch.bfloat16, torch.float16, torch.float32 or None, got {dtype=}"
        )
    if scaler is not None and DTYPES.get(dtype, dtype) is not torch.float16:
        raise ValueError(f"a loss scaler is only needed with dtype=torch.float16, got {dtype=}")
    check_int("check_every", check_every, 1)
    check_int("accumulate", accumulate, 1)
    if max_grad_norm is not None and not (
        isinstance(max_grad_norm, (int, float)) and max_grad_norm > 0
    ):
        raise ValueError(f"max_grad_norm must be a positive number or None, got {max_grad_norm=}")
    if len(schedulers) != len(optimizers):
        raise ValueError(
            f"scheduler must give one scheduler (or None) per optimizer: "
            f"{len(schedulers)} schedulers for {len(optimizers)} optimizers"
        )
    for opt, sched in zip(optimizers, schedulers):
        keep_state_on_device(opt)  # a bare AdamW on CUDA: its step counters on the GPU
        check_skippable(opt)
        check_no_step_hooks(opt)
        if sched is not None and not (
            is_metric_scheduler(sched) or callable(getattr(sched, "step", None))
        ):
            raise ValueError(
                f"scheduler must have step() (stepped once per applied step) or be stepped with "
                f"a metric (ReduceLROnPlateau, AdaptiveLearningRate); got a {type(sched).__name__}"
            )
        if sched is not None and getattr(sched, "optimizer", opt) is not opt:
            raise ValueError(
                f"scheduler {type(sched).__name__} drives another optimizer than the one "
                "it is paired with"
            )
    if recovery is not None:
        if checkpoint_dir is not None or rollback is not None:
            raise ValueError(
                "give either checkpoint_dir= (and rollback=) or a recovery= built by hand, not both"
            )
        if len(optimizers) > 1:
            raise ValueError(
                "a recovery= built by hand holds one optimizer: with several, give checkpoint_dir="
            )
        for name, mine in (("optimizer", optimizers[0]), ("scheduler", schedulers[0])):
            if getattr(recovery, name) is not mine:
                raise ValueError(
                    f"recovery.{name} is not the stabilizer's {name}: a rollback would restore "
                    f"and cut another {name} (build the recovery with the same objects, or "
                    "give checkpoint_dir= instead)"
                )
        if recovery.model is not model:
            raise ValueError(
                "recovery.model is not the stabilizer's model: a rollback would restore another "
                "model"
            )
