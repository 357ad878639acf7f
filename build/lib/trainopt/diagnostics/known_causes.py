"""Training runs with a known cause of trouble, to see what ``diagnose`` says of them.

:func:`generate_run` trains :func:`trainopt.models.digits_mlp` on scikit-learn's digits for a few
hundred steps on one CPU thread (well under a second) with one cause of trouble, and logs
``step``, ``loss``, ``grad_norm`` (before any clipping) and ``lr``: what the troubleshooting page
asks a user to log. The page diagnoses these runs and shows each fix on them; the tests prove
``diagnose`` on a grid of them (other seeds, widths and optimizers than the runs it was written
on).

The causes, with SGD (momentum 0.9; healthy at lr 0.05) or AdamW (healthy at lr 1e-3):

- ``healthy``: the healthy settings.
- ``lr_too_high``: SGD at lr 2.0, AdamW at 0.3: blown up in the first 10 steps.
- ``lr_too_low``: SGD at 1e-3, AdamW at 3e-5: the loss hardly moves.
- ``gradient_spike``: one batch from a corrupt shard (features 30x, labels shifted) at a step
  in the middle third of the run.
- ``nan_sample``: one sample with a NaN feature, at a step in the middle third.
- ``high_momentum`` (SGD only): momentum 0.99 at lr 0.02, an effective step
  ``lr / (1 - momentum)`` four times the healthy one: the loss swings and spikes.

A ``schedule`` trains the same run with its learning rate scheduled: what a fix does to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from trainopt.models import digits_data, digits_mlp
from trainopt.validation import check_int

CAUSES = ("healthy", "lr_too_high", "lr_too_low", "gradient_spike", "nan_sample", "high_momentum")
"""The known causes a generated run can have."""

OPTIMIZERS = ("sgd", "adamw")
"""SGD with momentum, and AdamW: names of the one vocabulary (:mod:`trainopt.config.optimizers`)."""

HEALTHY = {"sgd": (0.05, 0.9), "adamw": (1e-3, None)}
SETTINGS: dict[tuple[str, str], tuple[float, float | None]] = {
    **{
        (cause, opt): HEALTHY[opt]
        for cause in ("healthy", "gradient_spike", "nan_sample")
        for opt in OPTIMIZERS
    },
    ("lr_too_high", "sgd"): (2.0, 0.9),
    ("lr_too_high", "adamw"): (0.3, None),
    ("lr_too_low", "sgd"): (1e-3, 0.9),
    ("lr_too_low", "adamw"): (3e-5, None),
    ("high_momentum", "sgd"): (0.02, 0.99),
}
"""``(cause, optimizer) -> (learning rate, SGD momentum)``: the combinations that are generated."""


def _fault_step(seed: int, steps: int) -> int:
    """A step in the middle third of the run, drawn from the seed."""
    g = torch.Generator().manual_seed(10_000 + seed)
    return int(torch.randint(steps // 3, max(steps // 3 + 1, 2 * steps // 3), (1,), generator=g))


def generate_run(
    cause: str = "healthy",
    optimizer: str = "sgd",
    hidden: int = 128,
    seed: int = 0,
    steps: int = 300,
    batch_size: int = 64,
    schedule: Callable[[int], float] | None = None,
) -> list[dict[str, Any]]:
    """Train the digits MLP with a known ``cause`` of trouble; return one record per step.

    Args:
        cause: One of :data:`CAUSES`.
        optimizer: ``"sgd"`` (with momentum) or ``"adamw"``; see :data:`SETTINGS` for the pairs.
        hidden: Width of the MLP's two hidden layers.
        seed: Seeds the model, the batches and the step of a fault.
        steps: Optimizer steps.
        batch_size: Samples per step.
        schedule: A learning-rate multiplier ``step -> float`` (a pure schedule of
            :mod:`trainopt.schedules`, e.g. ``cosine_annealing`` with its counts bound), applied
            through ``torch.optim.lr_scheduler.LambdaLR``; None keeps the rate constant. It
            shows what a fix does to a run with a known cause.

    Returns:
        Records ``{"step", "loss", "grad_norm", "lr"}``: the gradient norm taken before the step,
        the learning rate the step used.

    Example:
        >>> from functools import partial
        >>> from trainopt.diagnostics import generate_run
        >>> from trainopt.schedules import cosine_annealing
        >>> records = generate_run("lr_too_high", "sgd", steps=12)
        >>> sorted(records[0]), records[0]["loss"] < 2.5 < max(r["loss"] for r in records)
        (['grad_norm', 'loss', 'lr', 'step'], True)
        >>> decayed = generate_run("healthy", "sgd", steps=12,
        ...                        schedule=partial(cosine_annealing, total_steps=12))
        >>> decayed[0]["lr"], decayed[-1]["lr"] < decayed[0]["lr"] / 50
        (0.05, True)
    """
    if (cause, optimizer) not in SETTINGS:
        raise ValueError(
            f"(cause, optimizer) must be one of {sorted(SETTINGS)}, got {(cause, optimizer)!r}"
        )
    check_int("steps", steps, 1)
    lr, momentum = SETTINGS[cause, optimizer]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # seconds per run on one core, and the same numbers on any machine
    try:
        x, y, _, _ = digits_data(seed=seed)
        model = digits_mlp(hidden=hidden, seed=seed)
        params = list(model.parameters())
        opt = (
            torch.optim.SGD(params, lr=lr, momentum=momentum)
            if optimizer == "sgd"
            else torch.optim.AdamW(params, lr=lr)
        )
        scheduler = None if schedule is None else torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        batches = torch.Generator().manual_seed(seed)
        fault = _fault_step(seed, steps)
        losses, norms, rates = [], [], []
        for step in range(steps):
            idx = torch.randint(0, len(x), (batch_size,), generator=batches)
            xb, yb = x[idx], y[idx]
            if (
                cause == "gradient_spike" and step == fault
            ):  # a corrupt shard: unnormalised, labels shifted
                xb, yb = xb * 30.0, (yb + 1) % 10
            if cause == "nan_sample" and step == fault:
                xb = xb.clone()
                xb[0, 0] = math.nan
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(
                torch.nn.utils.clip_grad_norm_(params, math.inf)
            )  # the norm only: no clipping
            rates.append(opt.param_groups[0]["lr"])  # a Python float: no sync
            opt.step()
            if scheduler is not None:
                scheduler.step()
            losses.append(loss.detach())
    finally:
        torch.set_num_threads(threads)
    # Read on the host once, at the end: the loop itself makes no host-device sync.
    loss_values, norm_values = torch.stack(losses).tolist(), torch.stack(norms).tolist()
    return [
        {"step": t, "loss": loss_values[t], "grad_norm": norm_values[t], "lr": rates[t]}
        for t in range(steps)
    ]
