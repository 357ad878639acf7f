"""A skipped step leaves the model's buffers as it found them, decided on the device.

The forward pass of a step changes buffers before anyone knows whether the step will be
skipped: a training-mode ``BatchNorm`` moves ``running_mean`` and ``running_var`` (and counts
``num_batches_tracked``) with the batch it normalises, so one NaN pixel makes them NaN, and the
model in eval mode is ruined although the skipped update never reached its parameters.
:class:`BufferSnapshot` copies every buffer before the forward pass (:meth:`~BufferSnapshot.take`)
and puts it back where the step's skip flag is set (:meth:`~BufferSnapshot.restore_where`),
chosen on the device the way :class:`~trainopt.stability.skipping.step.StepSnapshot` chooses the
optimizer's state (the same flat copies per device and dtype): nothing is read on the host.
:func:`nonfinite_buffers` counts the floating buffers that hold an inf or a NaN, as a device
tensor, for the boundary's "weights finite" test.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.nn.parameter import is_lazy

from trainopt.stability.skipping.step import SCRATCH_BYTES, _Masks, _SnapshotGroup

__all__ = ["BufferSnapshot", "nonfinite_buffers"]


def _slots(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
    """(module, name, buffer) for each buffer, each once, leaving out lazy ones not yet
    materialised.

    A walk over ``modules()`` and their ``_buffers``: the same buffers as ``named_buffers()``,
    in its order, without building the dotted names (a third of the time).
    """
    seen: set[int] = set()
    slots = []
    for module in model.modules():
        for name, b in module._buffers.items():
            if b is not None and id(b) not in seen and not is_lazy(b):
                seen.add(id(b))
                slots.append((module, name, b))
    return slots


class BufferSnapshot:
    """Every buffer of ``model`` before a step, put back on the device where the step is skipped.

    Call :meth:`take` before the step's first forward pass and :meth:`restore_where` with the
    step's skip flag after the optimizer step: where the flag is set every buffer gets its value
    from before the step (floating and integer ones alike, ``num_batches_tracked`` included),
    elsewhere it keeps what the forward passes made of it. Neither reads the device.

    The copies are allocated at the first :meth:`take` (three flat tensors per device and dtype,
    three times the buffers' size) and reused; they are made again only when the model's buffers
    change shape, dtype or device. A model without buffers costs nothing.

    Limits: a buffer registered between two boundaries is seen from the next boundary on
    (:meth:`refresh`, which the stabilizer calls there); a buffer that appears during the step (a
    lazy module's, materialised by its first forward pass), or whose shape or dtype changes, has
    nothing to return to and is left as it is. A buffer the forward pass replaces by another
    tensor of the same shape and dtype is restored in the new tensor.

    Args:
        model: The module whose buffers a skipped step must leave unchanged.

    Example:
        >>> import torch
        >>> from trainopt.stability import BufferSnapshot
        >>> model = torch.nn.BatchNorm1d(3)
        >>> snapshot = BufferSnapshot(model)
        >>> snapshot.take()
        >>> _ = model(torch.full((4, 3), float("nan")))  # the forward pass moves the statistics
        >>> snapshot.restore_where(torch.tensor(True))  # the step was skipped
        >>> model.running_mean, int(model.num_batches_tracked)
        (tensor([0., 0., 0.]), 0)
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._slots: list[tuple[torch.nn.Module, str]] = []  # where each buffer lives
        self._tensors: list[torch.Tensor] = []  # the buffers at the last take()
        self._groups: list[_SnapshotGroup] = []
        self._saved: list[torch.Tensor] = []  # the snapshot of each buffer, in that order
        self._ratios: list[None] = []  # no buffer's change is rescaled
        self._walk = True  # walk the module tree at the next take()

    def refresh(self) -> None:
        """Walk the module tree again at the next :meth:`take` (a buffer registered since)."""
        self._walk = True

    def _current_slots(self) -> list[tuple[torch.nn.Module, str, torch.Tensor]]:
        """The buffers now: the last walk's slots while each still holds its tensor, else a new
        walk."""
        if not self._walk:
            now = [(module, name, module._buffers.get(name)) for module, name in self._slots]
            if all(b is t for (_, _, b), t in zip(now, self._tensors)):
                return now  # type: ignore[return-value]
        self._walk = False
        return _slots(self.model)

    def take(self) -> None:
        """Copy every buffer into the preallocated snapshot (device copies, no host read).

        The module tree is walked at the first call, after :meth:`refresh`, and whenever a buffer
        the last walk found was replaced; otherwise the last walk's buffers are copied (a walk
        over every module each step costs more than copying a few statistics).
        """
        slots = self._current_slots()
        tensors = [b for _, _, b in slots]
        same = len(tensors) == len(self._tensors) and all(
            a is b and a.shape == s.shape for a, b, s in zip(tensors, self._tensors, self._saved)
        )
        if not same:
            by_kind: dict[tuple[torch.device, torch.dtype], list[int]] = {}
            for i, b in enumerate(tensors):
                by_kind.setdefault((b.device, b.dtype), []).append(i)
            self._ratios = [None] * len(tensors)
            self._groups = [
                _SnapshotGroup(tensors, self._ratios, indices, SCRATCH_BYTES)
                for indices in by_kind.values()
            ]
            self._slots = [(module, name) for module, name, _ in slots]
            self._tensors = tensors
            self._saved = [None] * len(tensors)  # type: ignore[list-item]
            for group in self._groups:
                for i, view in zip(group.indices, group.saved_views):
                    self._saved[i] = view
        for group in self._groups:
            group.take(tensors)

    @torch.no_grad()
    def restore_where(self, skip: torch.Tensor) -> None:
        """Where ``skip`` (a 0-d bool tensor) is true, put every buffer back to its snapshot."""
        if not self._tensors:
            return
        if not torch.is_tensor(skip) or skip.dim() != 0:
            raise ValueError(f"skip must be a 0-d tensor (the step's skip flag), got {skip!r}")
        masks = _Masks(skip)
        # a buffer the forward pass replaced by another tensor of its shape and dtype is restored
        # in the new tensor; one that is gone or changed shape or dtype is left as it is
        now = [module._buffers.get(name) for module, name in self._slots]
        for group in self._groups:
            group.restore(now, self._ratios, masks)


@torch.no_grad()
def nonfinite_buffers(
    buffers: torch.nn.Module | Iterable[torch.Tensor], device: torch.device | str | None = None
) -> torch.Tensor:
    """How many floating buffers hold an inf or a NaN: a 0-d ``long`` tensor, nothing read.

    ``buffers`` is a module (its buffers) or the tensors themselves; integer and bool buffers
    are always finite and left out. The count is exact (``isfinite`` per buffer, not a norm
    that overflows). It lands on ``device`` (default: the first buffer's, else the CPU).

    Example:
        >>> import torch
        >>> from trainopt.stability.skipping.buffers import nonfinite_buffers
        >>> model = torch.nn.BatchNorm1d(3)
        >>> int(nonfinite_buffers(model))
        0
        >>> model.running_var[1] = float("inf")
        >>> int(nonfinite_buffers(model))
        1
    """
    tensors = list(buffers.buffers()) if isinstance(buffers, torch.nn.Module) else list(buffers)
    floats = [t for t in tensors if not is_lazy(t) and (t.is_floating_point() or t.is_complex())]
    if device is None:
        device = floats[0].device if floats else torch.device("cpu")
    if not floats:
        return torch.zeros((), dtype=torch.long, device=device)
    bad = [(~torch.isfinite(t).all()).to(device) for t in floats]
    return torch.stack(bad).sum()
