"""What lossy gradient compression costs in accuracy: DDP hooks against the exact gradient.

:func:`compression_check` runs on every rank of a group (``launch(compression_check, 2)``); the
Distributed Training page records it on two processes with ``python -m
trainopt_site.perf.distributed --out FILE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trainopt.perf.distributed.checks import _batches, _local, _model
from trainopt.perf.distributed.ddp import register_comm_hook, wrap_ddp
from trainopt.perf.distributed.processes import rank_device

MEASURED_HOOKS: tuple[str, ...] = ("allreduce", "fp16", "bf16", "powersgd:1", "powersgd:4")


def compression_check(
    hooks: Sequence[str] = MEASURED_HOOKS,
    iterations: int = 8,
    seed: int = 0,
    start_powersgd_iter: int = 2,
) -> dict[str, Any]:
    """Relative gradient error ``‖g_hook − g_exact‖ / ‖g_exact‖`` of DDP hooks, per iteration.

    Weights stay fixed; each iteration is a new batch. The exact gradient is the single-process
    gradient of the whole batch. ``"powersgd:R"`` is PowerSGD of rank ``R``, measured once it
    has started (it all-reduces exactly before). ``cumulative`` is the relative error of the
    sum over the measured iterations: error feedback carries what one step drops into the next,
    so the sum is far more accurate than any single step.

    Returns:
        ``{hook: {"errors": [...], "mean": e, "max": e, "cumulative": e}}``, or
        ``{hook: {"unsupported": reason}}`` where the backend refuses the hook.

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> from trainopt.perf.distributed.compression import compression_check
        >>> with single_process_group("gloo"):
        ...     result = compression_check(["fp16", "bf16"], iterations=2)
        >>> result["fp16"]["mean"] < 1e-2, "unsupported" in result["bf16"]
        (True, True)
    """
    if any(h.startswith("powersgd") for h in hooks) and iterations <= start_powersgd_iter:
        raise ValueError(
            f"iterations must exceed start_powersgd_iter to measure PowerSGD, got "
            f"{iterations=}, {start_powersgd_iter=}"
        )
    device = rank_device()
    batches = _batches(iterations, 8, 16, seed)
    reference = _model(device, seed)
    exact = []
    for x, y in batches:
        reference.zero_grad(set_to_none=True)
        reference(x.to(device), targets=y.to(device)).backward()
        exact.append(torch.cat([p.grad.reshape(-1) for p in reference.parameters()]))
    result: dict[str, Any] = {}
    for spec in hooks:
        name, _, rank = spec.partition(":")
        model = wrap_ddp(_model(device, seed))
        try:
            state = register_comm_hook(
                model, name, powersgd_rank=int(rank or 1), start_powersgd_iter=start_powersgd_iter
            )
        except ValueError as exc:
            result[spec] = {"unsupported": str(exc)}
            continue
        errors, got_sum, exact_sum = [], torch.zeros_like(exact[0]), torch.zeros_like(exact[0])
        for i, batch in enumerate(batches):
            model.zero_grad(set_to_none=True)
            x, y = _local(batch, device)
            model(x, targets=y).backward()
            if name == "powersgd" and i < start_powersgd_iter:
                continue
            got = torch.cat([p.grad.reshape(-1) for p in model.module.parameters()])
            errors.append(((got - exact[i]).norm() / exact[i].norm()).item())
            got_sum += got
            exact_sum += exact[i]
        if state is not None:  # PowerSGD's own count of elements before and after compression
            _, before, after = state.compression_stats()
            sent = after / before
        else:
            sent = 0.5 if name in ("fp16", "bf16") else 1.0  # bytes: 2 per element instead of 4
        result[spec] = {
            "errors": errors,
            "mean": sum(errors) / len(errors),
            "max": max(errors),
            "cumulative": ((got_sum - exact_sum).norm() / exact_sum.norm()).item(),
            "sent_fraction": sent,
        }
    return result
