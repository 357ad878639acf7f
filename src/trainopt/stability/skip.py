"""Skip an optimizer step on the device: undo it where a flag is set, without a host sync."""

from __future__ import annotations

from typing import Any

import torch


@torch.no_grad()
def masked_step(optimizer: torch.optim.Optimizer, found_inf: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """Run ``optimizer.step()`` and undo it where ``found_inf`` is non-zero, without a host sync.

    Parameters and every tensor in the optimizer state are copied before the step and chosen
    with ``torch.where(found_inf > 0, old, new)`` after it, so a skipped step leaves them bit for
    bit unchanged and an applied step is exactly ``optimizer.step()``. State created by this
    very step (the first one) is reset to zeros on a skip, which is what Adam-style optimizers
    start from. The price is one copy of the parameters and the state per step: prefer a fused
    optimizer where one exists. State tensors on another device than ``found_inf`` (e.g. Adam's
    CPU ``step`` counters when ``capturable=False`` on CUDA) are masked with a copy of the flag
    to their device, which syncs; use ``capturable=True`` there.

    Args:
        optimizer: Any ``torch.optim.Optimizer``.
        found_inf: 0-d tensor, non-zero when this step must be skipped.
        *args: Passed to ``optimizer.step``.
        **kwargs: Passed to ``optimizer.step``.

    Returns:
        Whatever ``optimizer.step`` returned.

    Example:
        >>> import torch
        >>> from trainopt.stability import masked_step
        >>> w = torch.nn.Parameter(torch.ones(2))
        >>> opt = torch.optim.AdamW([w], lr=0.1)
        >>> w.grad = torch.tensor([float("inf"), 1.0])
        >>> _ = masked_step(opt, torch.tensor(1.0))
        >>> w.detach(), opt.state[w]["exp_avg"]
        (tensor([1., 1.]), tensor([0., 0.]))
    """
    skip = found_inf > 0
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    old_params = [p.detach().clone() for p in params]
    old_state = {
        id(p): {k: v.detach().clone() for k, v in optimizer.state[p].items() if torch.is_tensor(v)}
        for p in params
        if p in optimizer.state
    }
    result = optimizer.step(*args, **kwargs)
    masks: dict[torch.device, torch.Tensor] = {skip.device: skip}

    def mask_for(t: torch.Tensor) -> torch.Tensor:
        if t.device not in masks:
            masks[t.device] = skip.to(t.device)
        return masks[t.device]

    for p, old in zip(params, old_params):
        p.copy_(torch.where(mask_for(p), old, p))
        before = old_state.get(id(p))
        for key, value in optimizer.state.get(p, {}).items():
            if not torch.is_tensor(value):
                continue
            prev = before[key] if before is not None and key in before else torch.zeros_like(value)
            value.copy_(torch.where(mask_for(value), prev, value))
    return result
