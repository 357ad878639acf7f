"""Skip an optimizer step on the device: the flag decides, and nothing is read on the host.

Two ways to skip, both exact:

- :func:`fused_step` hands the flag to a fused optimizer as its ``found_inf`` argument
  (``torch.optim.AdamW(..., fused=True)``, fused Adam, SGD and Adagrad): the kernel does nothing
  where the flag is set.
- :func:`masked_step` runs any other optimizer's ``step()`` and puts back the old parameters and
  state where the flag is set.

A skipped step must leave the optimizer as if it had never been called, and the first step is
the hard case: the state it creates has to look like the state torch would create on the next,
real first step. Both functions catch every state tensor the step assigns for the first time
and, where the step is skipped, reset it to the value it was created with (``mu_product = 1``
for NAdam, ``step_size = lr`` for Rprop, ``eta = lr`` and ``mu = 1`` for ASGD, zeros for Adam's
moments). torch's SGD is the exception: its momentum buffer is created *after* the update (or,
in the fused kernel, with ``torch.empty_like`` even when ``found_inf`` skips it, so the next
step reads uninitialised memory; ``torch.amp.GradScaler`` shares that upstream behaviour). A
zero buffer is what a first step starts from when ``dampening=0``, so that is what a skipped
first step leaves; SGD with momentum and ``dampening != 0`` cannot be skipped exactly at its
first step without reading the flag on the host, and
:func:`~trainopt.stability.optimizers.check_skippable` refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["fused_step", "masked_step"]


# State that torch's step assigns after the update: what a first step starts from instead.
_INITIAL_VALUE: dict[type, dict[str, Callable[[torch.Tensor], torch.Tensor]]] = {
    torch.optim.SGD: {"momentum_buffer": torch.zeros_like},
}


class _FirstAssignments(dict):
    """A parameter's state dict that keeps a copy of the value first assigned to each key."""

    def __init__(self) -> None:
        super().__init__()
        self.initial: dict[str, torch.Tensor] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self.initial and torch.is_tensor(value):
            self.initial[key] = value.detach().clone()
        super().__setitem__(key, value)


class _Masks:
    """The skip flag as a bool tensor on each device that asks for it (a copy per device)."""

    def __init__(self, found_inf: torch.Tensor) -> None:
        skip = found_inf > 0
        self.by_device = {skip.device: skip}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if t.device not in self.by_device:
            # another device than the flag's: a copy, which syncs if it is the CPU
            self.by_device[t.device] = next(iter(self.by_device.values())).to(t.device)
        return self.by_device[t.device]


def _params_with_grad(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def _ratios_by_param(optimizer: torch.optim.Optimizer, lr_ratios: dict[int, torch.Tensor]) -> dict[Any, torch.Tensor]:
    return {p: lr_ratios[id(group)] for group in optimizer.param_groups if id(group) in lr_ratios
            for p in group["params"]}


def _watch_new_state(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> dict[Any, _FirstAssignments]:
    """Replace each empty state dict by one that records first assignments."""
    watched = {}
    for p in params:
        if not optimizer.state.get(p):
            watched[p] = optimizer.state[p] = _FirstAssignments()
    return watched


@torch.no_grad()
def _reset_new_state(optimizer: torch.optim.Optimizer, watched: dict[Any, _FirstAssignments], masks: _Masks) -> None:
    """Where skipped, give state created by this step its initial value; plain dicts again."""
    overrides = _INITIAL_VALUE.get(type(optimizer), {})
    _unwatch(optimizer, watched)
    for p, state in watched.items():
        plain = optimizer.state.get(p, {})
        for key, value in plain.items():
            if not torch.is_tensor(value):
                continue
            initial = overrides[key](value) if key in overrides else state.initial[key]
            value.copy_(torch.where(masks(value), initial.to(value.device), value))


def _unwatch(optimizer: torch.optim.Optimizer, watched: dict[Any, _FirstAssignments]) -> None:
    """Plain dicts again (a checkpoint must load with ``weights_only=True``); no empty entries."""
    for p, state in watched.items():
        if optimizer.state.get(p) is state:
            if state:
                optimizer.state[p] = dict(state)
            else:
                del optimizer.state[p]


@torch.no_grad()
def masked_step(
    optimizer: torch.optim.Optimizer, found_inf: torch.Tensor, *args: Any,
    lr_ratios: dict[int, torch.Tensor] | None = None, **kwargs: Any,
) -> Any:
    """Run ``optimizer.step()`` and undo it where ``found_inf`` is non-zero, without a host sync.

    Parameters and every tensor in the optimizer state are copied before the step and chosen
    with ``torch.where(found_inf > 0, old, new)`` after it, so a skipped step leaves them bit for
    bit unchanged and an applied step is exactly ``optimizer.step()``. State that this very step
    creates (the first step) gets the value it was created with on a skip, so the next step runs
    as a first step would. The price is one copy of the parameters and the state per step: prefer
    a fused optimizer where one exists (:func:`fused_step`).

    Where it syncs: a state tensor on another device than ``found_inf`` is masked with a copy of
    the flag to that device. The step counters of Adam, AdamW, Adamax, NAdam, RAdam, RMSprop,
    Adadelta, Rprop, ASGD and Adagrad live on the CPU unless ``capturable=True`` (or
    ``fused=True``), so with CUDA parameters that copy is a host sync on every step;
    :func:`~trainopt.stability.optimizers.check_skippable` names those configurations.

    With ``lr_ratios`` (``{id(param_group): ratio}``, 0-d device tensors), the change each
    applied step makes to a group's parameters is multiplied by its ratio: the step ran at a
    Python-float rate ``r`` and the rate wanted is ``ratio * r``, exact for an update linear in the
    rate (:class:`~trainopt.stability.schedule_window.ScheduleWindow` hands these out).

    Args:
        optimizer: A ``torch.optim.Optimizer`` (see
            :func:`~trainopt.stability.optimizers.check_skippable` for the ones it refuses).
        found_inf: 0-d tensor, non-zero when this step must be skipped.
        *args: Passed to ``optimizer.step``.
        lr_ratios: Per param group, the factor of the step's change (see above), or ``None``.
        **kwargs: Passed to ``optimizer.step``.

    Returns:
        Whatever ``optimizer.step`` returned.

    Example:
        >>> import torch
        >>> from trainopt.stability import masked_step
        >>> w = torch.nn.Parameter(torch.ones(2))
        >>> opt = torch.optim.NAdam([w], lr=0.1)
        >>> w.grad = torch.tensor([float("inf"), 1.0])
        >>> _ = masked_step(opt, torch.tensor(1.0))
        >>> w.detach(), opt.state[w]["mu_product"], opt.state[w]["step"]  # as NAdam creates them
        (tensor([1., 1.]), tensor(1.), tensor(0.))
    """
    masks = _Masks(found_inf)
    params = _params_with_grad(optimizer)
    ratios = _ratios_by_param(optimizer, lr_ratios) if lr_ratios else {}
    old_params = [p.detach().clone() for p in params]
    old_state = {p: {k: v.detach().clone() for k, v in optimizer.state[p].items() if torch.is_tensor(v)}
                 for p in params if optimizer.state.get(p)}
    watched = _watch_new_state(optimizer, params)
    try:
        result = optimizer.step(*args, **kwargs)
    except BaseException:
        _unwatch(optimizer, watched)
        raise
    # in place (out=): a where and its copy back cost three times one where writing in place
    for p, old in zip(params, old_params):
        ratio = ratios.get(p)
        if ratio is not None:
            torch.lerp(old, p, ratio.to(p.dtype), out=p)
        torch.where(masks(p), old, p, out=p)
    for p, before in old_state.items():
        for key, value in optimizer.state[p].items():
            if torch.is_tensor(value):
                prev = before.get(key)
                prev = torch.zeros_like(value) if prev is None else prev
                torch.where(masks(value), prev, value, out=value)
    _reset_new_state(optimizer, watched, masks)
    return result


def fused_step(
    optimizer: torch.optim.Optimizer, found_inf: torch.Tensor, *args: Any,
    grad_scale: torch.Tensor | None = None, **kwargs: Any,
) -> Any:
    """Step a fused optimizer with ``found_inf`` (and ``grad_scale``): its kernel skips on the device.

    This is how ``torch.amp.GradScaler`` steps optimizers with ``_step_supports_amp_scaling``,
    with one repair: state the step creates is reset to its initial value where the step was
    skipped. torch's fused SGD with momentum creates its momentum buffer with
    ``torch.empty_like`` and leaves it uninitialised when ``found_inf`` skips the first step; the
    next step would read whatever the memory held. Here the buffer is zero, which is what a
    ``dampening=0`` first step starts from.

    Args:
        optimizer: An optimizer whose ``_step_supports_amp_scaling`` is true (``fused=True``).
        found_inf: 0-d float32 tensor on the parameters' device, non-zero to skip.
        *args: Passed to ``optimizer.step``.
        grad_scale: The loss scale the kernel divides the gradients by, or ``None``.
        **kwargs: Passed to ``optimizer.step``.

    Returns:
        Whatever ``optimizer.step`` returned.

    Example:
        >>> import torch
        >>> from trainopt.stability import fused_step
        >>> w = torch.nn.Parameter(torch.ones(2))
        >>> opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, fused=True)
        >>> w.grad = torch.tensor([float("nan"), 1.0])
        >>> _ = fused_step(opt, torch.tensor(1.0))
        >>> w.detach(), opt.state[w]["momentum_buffer"]
        (tensor([1., 1.]), tensor([0., 0.]))
    """
    if not getattr(optimizer, "_step_supports_amp_scaling", False):
        raise TypeError(f"{type(optimizer).__name__} has no fused found_inf path: use masked_step")
    watched = _watch_new_state(optimizer, _params_with_grad(optimizer))
    optimizer.found_inf = found_inf  # type: ignore[attr-defined]
    if grad_scale is not None:
        optimizer.grad_scale = grad_scale  # type: ignore[attr-defined]
    try:
        result = optimizer.step(*args, **kwargs)
    except BaseException:
        _unwatch(optimizer, watched)
        raise
    finally:
        del optimizer.found_inf  # type: ignore[attr-defined]
        if grad_scale is not None:
            del optimizer.grad_scale  # type: ignore[attr-defined]
    _reset_new_state(optimizer, watched, _Masks(found_inf))
    return result
