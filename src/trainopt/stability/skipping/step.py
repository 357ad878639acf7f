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
:func:`~trainopt.stability.skipping.optimizers.check_skippable` refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["StepSnapshot", "fused_step", "masked_step"]

# The most bytes per device and dtype for which a snapshot keeps three flat copies (the row
# choice); above it, only the old values and a ``torch.where`` per tensor.
SCRATCH_BYTES = 256 * 2**20


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


class StepSnapshot:
    """The parameters and optimizer state before a step, in one flat copy per device and dtype.

    :func:`masked_step` copies every tensor the step may change here before the step
    (:meth:`take`: one ``torch._foreach_copy_`` per device and dtype), and afterwards, where the
    step is skipped, chooses the copy (:meth:`restore_where`). Per device and dtype that is a copy
    of the new values into a scratch tensor, one ``torch.lerp`` per parameter group that
    rescales its change (``lr_ratios``), one choice of row and one copy back: a handful of
    operators instead of three per tensor, which is what a step costs on a CPU or in kernel
    launches. The choice itself is a row of ``index_select`` on ``(new, old)`` stacked, a copy at
    memory speed (a ``torch.where`` with a 0-d condition runs several times slower on a CPU), and
    exact for any value, NaN included. That takes three flat copies of the tensors; where they
    would exceed ``scratch_bytes`` (a large model, where a step is bound by memory bandwidth and
    not by operators) only the old values are kept and each tensor gets its own ``lerp`` and
    ``where``, in place.

    Kept from step to step, the copies are allocated once and made again only when the set of
    tensors changes (the first step creates the optimizer state). The values are exactly those of
    ``torch.lerp(old, new, ratio)`` followed by ``torch.where(skip, old, new)`` per tensor.

    Example:
        >>> import torch
        >>> from trainopt.stability.skipping.step import StepSnapshot, masked_step
        >>> w = torch.nn.Parameter(torch.ones(3))
        >>> opt = torch.optim.Adam([w], lr=0.1)
        >>> snapshot = StepSnapshot()
        >>> for skip in (0.0, 1.0):
        ...     w.grad = torch.ones(3)
        ...     _ = masked_step(opt, torch.tensor(skip), snapshot=snapshot)
        >>> w.detach(), int(opt.state[w]["step"])  # the second step was skipped
        (tensor([0.9000, 0.9000, 0.9000]), 1)
    """

    def __init__(self, scratch_bytes: int = SCRATCH_BYTES) -> None:
        self.scratch_bytes = scratch_bytes
        self._tensors: list[torch.Tensor] = []
        self._shared: tuple[int, ...] = ()
        self._groups: list[_SnapshotGroup] = []

    def take(
        self, params: list[torch.Tensor], state: list[torch.Tensor], ratios: list[Any]
    ) -> None:
        """Copy ``params`` (each changed by its ratio, or ``None``) and ``state`` before the
        step."""
        tensors = [*params, *state]
        ratios = [*ratios, *([None] * len(state))]
        # which tensors share a ratio: the first index of each ratio object
        first: dict[int, int] = {}
        shared = tuple(
            -1 if r is None else first.setdefault(id(r), i) for i, r in enumerate(ratios)
        )
        same = (
            shared == self._shared
            and len(tensors) == len(self._tensors)
            and all(a is b for a, b in zip(tensors, self._tensors))
        )
        if not same:
            self._layout(tensors, ratios)
            self._shared = shared
        for group in self._groups:
            group.take(tensors)
        self._ratio_values = ratios

    def _layout(self, tensors: list[torch.Tensor], ratios: list[Any]) -> None:
        by_kind: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, t in enumerate(tensors):
            by_kind.setdefault((t.device, t.dtype), []).append(i)
        self._groups = [
            _SnapshotGroup(tensors, ratios, indices, self.scratch_bytes)
            for indices in by_kind.values()
        ]
        self._tensors = tensors

    @torch.no_grad()
    def restore_where(self, masks: Callable[[torch.Tensor], torch.Tensor], now: list[Any]) -> None:
        """After the step: rescale each parameter's change by its ratio, then put back where
        skipped.

        ``now`` holds the state tensors as the step left them (``None`` for one it removed).
        """
        tensors = [*self._tensors[: len(self._tensors) - len(now)], *now]
        for group in self._groups:
            group.restore(tensors, self._ratio_values, masks)


class _SnapshotGroup:
    """The tensors of one device and dtype: their flat copy, segments by ratio, and a scratch."""

    def __init__(
        self, tensors: list[torch.Tensor], ratios: list[Any], indices: list[int], scratch_bytes: int
    ) -> None:
        # tensors sharing a ratio (the same tensor object: one param group) sit side by side
        order: dict[int, list[int]] = {}
        for i in indices:
            order.setdefault(id(ratios[i]) if ratios[i] is not None else 0, []).append(i)
        self.indices = [i for run in order.values() for i in run]
        first = tensors[self.indices[0]]
        sizes = [tensors[i].numel() for i in self.indices]
        total = sum(sizes)
        fits = 3 * total * first.element_size() <= scratch_bytes
        # with room: row 0 takes the new values, row 1 holds the old, and a skip picks a row
        self.pair = torch.empty(
            (2, total) if fits else (1, total), dtype=first.dtype, device=first.device
        )
        self.saved = self.pair[-1]
        self.saved_views = [
            v.view(tensors[i].shape) for v, i in zip(self.saved.split(sizes), self.indices)
        ]
        self.segments = []  # (start, stop, index of a tensor whose ratio applies) per rescaled run
        start = 0
        for run in order.values():
            stop = start + sum(tensors[i].numel() for i in run)
            if ratios[run[0]] is not None:
                self.segments.append((start, stop, run[0]))
            start = stop
        self.scratch = self.pair[0] if fits else None
        self.scratch_views = (
            [v.view(tensors[i].shape) for v, i in zip(self.scratch.split(sizes), self.indices)]
            if fits
            else []
        )
        self.chosen = (
            torch.empty((1, total), dtype=first.dtype, device=first.device) if fits else None
        )
        self.chosen_views = (
            [v.view(tensors[i].shape) for v, i in zip(self.chosen[0].split(sizes), self.indices)]
            if fits
            else []
        )

    @torch.no_grad()
    def take(self, tensors: list[torch.Tensor]) -> None:
        """Copy this group's tensors (``tensors[i]`` for each of :attr:`indices`) into its
        snapshot."""
        torch._foreach_copy_(self.saved_views, [tensors[i] for i in self.indices])

    @torch.no_grad()
    def restore(
        self, tensors: list[Any], ratios: list[Any], masks: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        """Rescale each tensor's change by its ratio, then put back the snapshot where ``masks``
        says so; a tensor that is gone or has another shape or dtype than at :meth:`take` is left
        as it is."""
        now = [tensors[i] for i in self.indices]
        whole = all(_matches(t, v) for t, v in zip(now, self.saved_views))
        if self.scratch is not None and whole:
            torch._foreach_copy_(self.scratch_views, now)
            for start, stop, i in self.segments:
                ratio = ratios[i].to(self.saved.dtype)
                torch.lerp(
                    self.saved[start:stop],
                    self.scratch[start:stop],
                    ratio,
                    out=self.scratch[start:stop],
                )
            # row 1 (the old values) where skipped, row 0 (the step's) where not: a copy, not a
            # where
            row = masks(self.saved).long().view(1)
            torch.index_select(self.pair, 0, row, out=self.chosen)
            torch._foreach_copy_(now, self.chosen_views)
            return
        for t, old, i in zip(now, self.saved_views, self.indices):
            if not _matches(t, old):
                continue  # the step replaced or removed this tensor: nothing to put back
            if ratios[i] is not None:
                torch.lerp(old, t, ratios[i].to(t.dtype), out=t)
            torch.where(masks(t), old, t, out=t)


def _matches(t: Any, saved: torch.Tensor) -> bool:
    """Whether ``t`` is a tensor that ``saved`` can be put back into (same shape and dtype)."""
    return torch.is_tensor(t) and t.shape == saved.shape and t.dtype == saved.dtype


def _params_with_grad(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def _ratios_by_param(
    optimizer: torch.optim.Optimizer, lr_ratios: dict[int, torch.Tensor]
) -> dict[Any, torch.Tensor]:
    return {
        p: lr_ratios[id(group)]
        for group in optimizer.param_groups
        if id(group) in lr_ratios
        for p in group["params"]
    }


def _watch_new_state(
    optimizer: torch.optim.Optimizer, params: list[torch.Tensor]
) -> dict[Any, _FirstAssignments]:
    """Replace each empty state dict by one that records first assignments."""
    watched: dict[Any, _FirstAssignments] = {}
    if len(optimizer.state) >= len(params) and all(optimizer.state.get(p) for p in params):
        return watched  # every parameter has its state: nothing this step creates
    for p in params:
        if not optimizer.state.get(p):
            watched[p] = optimizer.state[p] = _FirstAssignments()
    return watched


@torch.no_grad()
def _reset_new_state(
    optimizer: torch.optim.Optimizer, watched: dict[Any, _FirstAssignments], masks: _Masks
) -> None:
    """Where skipped, give state created by this step its initial value; plain dicts again."""
    if not watched:
        return
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
    optimizer: torch.optim.Optimizer,
    found_inf: torch.Tensor,
    *args: Any,
    lr_ratios: dict[int, torch.Tensor] | None = None,
    snapshot: StepSnapshot | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``optimizer.step()`` and undo it where ``found_inf`` is non-zero, without a host sync.

    Parameters and every tensor in the optimizer state are copied before the step and chosen
    with ``torch.where(found_inf > 0, old, new)`` after it, so a skipped step leaves them bit for
    bit unchanged and an applied step is exactly ``optimizer.step()``. State that this very step
    creates (the first step) gets the value it was created with on a skip, so the next step runs
    as a first step would. The price is one copy of the parameters and the state per step, made
    and chosen from per device and dtype in a handful of operators whatever the number of tensors
    (:class:`StepSnapshot`): prefer a fused optimizer where one exists (:func:`fused_step`).

    Where it syncs: a state tensor on another device than ``found_inf`` is masked with a copy of
    the flag to that device. The step counters of Adam, AdamW, Adamax, NAdam, RAdam, RMSprop,
    Adadelta, Rprop, ASGD and Adagrad live on the CPU unless ``capturable=True`` (or
    ``fused=True``), so with CUDA parameters that copy is a host sync on every step;
    :func:`~trainopt.stability.skipping.optimizers.check_skippable` names those configurations.

    With ``lr_ratios`` (``{id(param_group): ratio}``, 0-d device tensors), the change each
    applied step makes to a group's parameters is multiplied by its ratio: the step ran at a
    Python-float rate ``r`` and the rate wanted is ``ratio * r``, exact for an update linear in the
    rate (:class:`~trainopt.stability.skipping.schedule.ScheduleWindow` hands these out).

    Args:
        optimizer: A ``torch.optim.Optimizer`` (see
            :func:`~trainopt.stability.skipping.optimizers.check_skippable` for the ones it
            refuses).
        found_inf: 0-d tensor, non-zero when this step must be skipped.
        *args: Passed to ``optimizer.step``.
        lr_ratios: Per param group, the factor of the step's change (see above), or ``None``.
        snapshot: A :class:`StepSnapshot` kept from step to step (the stabilizer keeps one per
            optimizer), or ``None`` for one used once.
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
    states = [optimizer.state.get(p, {}) for p in params]
    entries = sum(map(len, states))
    state = [
        (p, k, v) for p, st in zip(params, states) for k, v in st.items() if torch.is_tensor(v)
    ]
    snapshot = snapshot if snapshot is not None else StepSnapshot()
    snapshot.take(params, [v for _, _, v in state], [ratios.get(p) for p in params])
    watched = _watch_new_state(optimizer, params)
    try:
        result = optimizer.step(*args, **kwargs)
    except BaseException:
        _unwatch(optimizer, watched)
        raise
    now = [optimizer.state[p].get(k) for p, k, _ in state]
    snapshot.restore_where(masks, now)
    if watched or sum(len(optimizer.state[p]) for p in params) != entries:
        known = {(id(p), k) for p, k, _ in state}
        for p in params:  # a key this step added to existing state: zeros where skipped
            if p in watched:
                continue
            for key, value in optimizer.state[p].items():
                if torch.is_tensor(value) and (id(p), key) not in known:
                    torch.where(masks(value), torch.zeros_like(value), value, out=value)
    _reset_new_state(optimizer, watched, masks)
    return result


def fused_step(
    optimizer: torch.optim.Optimizer,
    found_inf: torch.Tensor,
    *args: Any,
    grad_scale: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """Step a fused optimizer with ``found_inf`` (and ``grad_scale``): its kernel skips on the
    device.

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
    if watched:
        _reset_new_state(optimizer, watched, _Masks(found_inf))
    return result
