"""Print or check a schedule before training: the rate the optimizer will use at each step."""

from __future__ import annotations

import logging

from torch.optim.lr_scheduler import LRScheduler

from trainopt.schedules.validation import check_int

logger = logging.getLogger(__name__)


def debug_lr_schedule(
    scheduler: LRScheduler, num_steps: int, group: int = 0, log_every: int | None = None
) -> list[float]:
    """Step a scheduler ``num_steps`` times and return the rate of one group at each step.

    Entry ``i`` is the rate the optimizer uses for step ``i`` (from ``get_last_lr()``). The
    scheduler and the optimizer's rates are restored afterwards, so this is safe to call before
    training. With ``log_every``, logs the rate every ``log_every`` steps at INFO level.

    Example:
        >>> import torch
        >>> from trainopt.schedules import step_decay_schedule
        >>> from trainopt.schedules import debug_lr_schedule
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        >>> sched = step_decay_schedule(opt, decay_steps=2, decay_rate=0.5)
        >>> debug_lr_schedule(sched, 5)
        [1.0, 1.0, 0.5, 0.5, 0.25]
        >>> sched.get_last_lr(), sched.last_epoch
        ([1.0], 0)
    """
    import warnings

    check_int("num_steps", num_steps, 0)
    state = scheduler.state_dict()
    saved_lrs = [g["lr"] for g in scheduler.optimizer.param_groups]
    lrs = []
    try:
        with warnings.catch_warnings():
            # Stepping without optimizer.step() is the point here, not a mistake.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            for step in range(num_steps):
                lr = float(scheduler.get_last_lr()[group])
                lrs.append(lr)
                if log_every and step % log_every == 0:
                    logger.info("step %d: lr = %.3e", step, lr)
                scheduler.step()
    finally:
        scheduler.load_state_dict(state)
        for g, lr in zip(scheduler.optimizer.param_groups, saved_lrs):
            g["lr"] = lr
    return lrs
