"""The loss scaler's two device operations: unscale with an inf check, and update the scale.

Both run on the device and read nothing on the host;
:class:`~trainopt.stability.scaling.scaler.DynamicLossScaler` calls them where
``torch.amp.GradScaler`` calls its private methods.
"""

from __future__ import annotations

from collections import defaultdict

import torch

__all__ = ["unscale_grads_", "update_scale_with_hysteresis_"]


@torch.no_grad()
def unscale_grads_(
    optimizer: torch.optim.Optimizer,
    inv_scale: torch.Tensor,
    found_inf: torch.Tensor,
    allow_fp16: bool,
) -> dict[torch.device, torch.Tensor]:
    """Multiply every gradient by ``inv_scale`` in place; return a ``found_inf`` flag per device.

    The kernel is GradScaler's (``torch._amp_foreach_non_finite_check_and_unscale_``), one call
    per device and dtype. fp16 gradients are refused unless ``allow_fp16`` (fp32 master weights
    are the rule).

    Example:
        >>> import torch
        >>> from trainopt.stability.scaling.kernels import unscale_grads_
        >>> w = torch.nn.Parameter(torch.zeros(2)); w.grad = torch.tensor([4.0, float("inf")])
        >>> found = unscale_grads_(torch.optim.SGD([w], lr=0.1), torch.tensor(0.25),
        ...                        torch.zeros(()), False)
        >>> w.grad, found[torch.device("cpu")]
        (tensor([1., inf]), tensor(1.))
    """
    grads: dict[torch.device, dict[torch.dtype, list[torch.Tensor]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None:
                continue
            if not allow_fp16 and param.grad.dtype == torch.float16:
                raise ValueError("Attempting to unscale FP16 gradients: keep fp32 master weights")
            grad = param.grad
            if grad.is_sparse:
                if grad.dtype is torch.float16:
                    param.grad = grad = grad.coalesce()
                grad = grad._values()
            grads[grad.device][grad.dtype].append(grad)
    per_device: dict[torch.device, torch.Tensor] = {}
    for device, by_dtype in grads.items():
        per_device[device] = found_inf.to(device)
        device_inv_scale = inv_scale.to(device)
        for tensors in by_dtype.values():
            torch._amp_foreach_non_finite_check_and_unscale_(
                tensors, per_device[device], device_inv_scale
            )
    return per_device


@torch.no_grad()
def update_scale_with_hysteresis_(
    scale: torch.Tensor,
    growth: torch.Tensor,
    overflow: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    hysteresis: int,
) -> None:
    """GradScaler's scale update, backing off only after ``hysteresis`` overflows in a row (in
    place).

    With ``hysteresis=1`` it is ``torch._amp_update_scale_``.

    Example:
        >>> import torch
        >>> from trainopt.stability.scaling.kernels import update_scale_with_hysteresis_
        >>> scale, growth, overflow = torch.tensor(8.0), torch.tensor(0), torch.tensor(0)
        >>> for found in (1.0, 1.0):
        ...     update_scale_with_hysteresis_(scale, growth, overflow, torch.tensor(found), 2.0,
        ...                                   0.5, 100, 2)
        ...     print(scale.item())
        8.0
        4.0
    """
    found = found_inf > 0
    zero = torch.zeros_like(growth)
    overflow.copy_(torch.where(found, overflow + 1, zero))
    back_off = found & (overflow >= hysteresis)
    due = ~found & (growth + 1 >= growth_interval)
    grown = scale * growth_factor
    new_scale = torch.where(back_off, scale * backoff_factor, scale)
    new_scale = torch.where(due & torch.isfinite(grown), grown, new_scale)
    scale.copy_(new_scale)
    growth.copy_(torch.where(found | due, zero, growth + 1))
