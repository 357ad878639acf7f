"""Count host-device synchronisations on a CPU: the operators that would make a training step
sync on a GPU.

:class:`HostSyncCounter` is a ``TorchDispatchMode`` that sees every ATen operator a block of
code runs, on any device, and counts the ones that make the host wait for a CUDA device:

- ``aten._local_scalar_dense``: what ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` and
  ``if t:`` dispatch to (the value must be on the host);
- copies from an accelerator to the CPU (``.cpu()``, ``.to("cpu")``), which only show when the
  tensors live on one;
- the operators whose output size or result the host needs before it can go on, listed in
  :data:`SYNCING_OPERATORS`: ``nonzero`` (also behind ``argwhere`` and one-argument
  ``torch.where``), indexing and index assignment with a boolean mask (``x[mask]``,
  ``x[mask] = v``), ``masked_select``, ``unique`` and ``unique_consecutive``,
  ``repeat_interleave`` with a tensor of repeats and no ``output_size``, ``bincount``,
  ``torch.equal`` and ``torch.allclose`` (they return a Python bool), and the error checks of
  ``torch.linalg.inv``/``cholesky``/``solve`` (the ``*_ex`` variants do not check).

On a CPU these run without waiting for anything, so they are flagged by name: the count says
what the same code would do on a GPU. ``.tolist()`` and ``.numpy()`` read memory without
dispatching an operator, so no dispatch mode sees them; on a GPU,
``torch.cuda.set_sync_debug_mode("error")`` catches every kind at run time.
"""

from __future__ import annotations

import traceback
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["SYNCING_OPERATORS", "HostSyncCounter"]

_aten = torch.ops.aten

SYNCING_OPERATORS: dict[Any, str] = {
    _aten._local_scalar_dense: "a tensor read as a Python number (.item(), float(), bool(), if)",
    _aten.nonzero: "nonzero (argwhere, one-argument torch.where): its size is data-dependent",
    _aten.masked_select: "masked_select: its size is data-dependent",
    _aten._unique: "unique: its size is data-dependent",
    _aten._unique2: "unique: its size is data-dependent",
    _aten.unique_dim: "unique: its size is data-dependent",
    _aten.unique_consecutive: "unique_consecutive: its size is data-dependent",
    _aten.unique_dim_consecutive: "unique_consecutive: its size is data-dependent",
    _aten.bincount: "bincount: its size depends on the largest value",
    _aten.equal: "torch.equal returns a Python bool",
    _aten.allclose: "torch.allclose returns a Python bool",
    _aten.is_nonzero: "a tensor read as a Python bool",
    _aten._linalg_check_errors: (
        "linalg error checks read the info on the host (use the *_ex variants)"
    ),
    _aten.index: "indexing with a boolean mask: its size is data-dependent",
    _aten.index_put: "assignment through a boolean mask (use torch.where or masked_fill)",
    _aten.index_put_: "assignment through a boolean mask (use torch.where or masked_fill)",
    _aten.repeat_interleave: "repeat_interleave without output_size: its size is data-dependent",
}
"""Operator (overload packet) → why it synchronises on CUDA. ``index``/``index_put`` count only
with a boolean index, ``repeat_interleave`` only with a tensor of repeats and no ``output_size``."""


def _is_device_to_host(func: Any, args: tuple, kwargs: dict) -> bool:
    """A copy from a non-CPU tensor into CPU memory (it waits for the device)."""
    if func is _aten._to_copy.default:
        device = kwargs.get("device")
        return (
            device is not None
            and torch.device(device).type == "cpu"
            and args[0].device.type != "cpu"
        )
    if func is _aten.copy_.default:
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


def _syncs(func: Any, args: tuple, kwargs: dict) -> str | None:
    """The operator's name when it would make the host wait for a CUDA device, else ``None``."""
    packet = func.overloadpacket
    if _is_device_to_host(func, args, kwargs):
        return "device-to-host copy"
    if packet not in SYNCING_OPERATORS:
        return None
    if packet in (_aten.index, _aten.index_put, _aten.index_put_):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if not any(
            torch.is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in indices or ()
        ):
            return None
    if packet is _aten.repeat_interleave:
        repeats = (
            args[1] if func is _aten.repeat_interleave.self_Tensor else (args[0] if args else None)
        )
        if not torch.is_tensor(repeats) or kwargs.get("output_size") is not None:
            return None
    return f"aten.{packet.__name__}"


class HostSyncCounter(TorchDispatchMode):
    """Count, inside a ``with`` block, the operators that make the host wait for a CUDA device.

    See the module notes for the list. ``count`` is the total, ``operators`` the count per
    operator name, ``stacks`` where the first few came from.

    Args:
        keep_stacks: How many Python stacks to keep (the last few frames each).

    Attributes:
        count: Number of syncing calls seen.
        operators: ``Counter`` of their names (``aten._local_scalar_dense``, ``aten.nonzero``, ...).
        stacks: The Python stack of the first ``keep_stacks`` calls, to find the culprit.

    Example:
        >>> import torch
        >>> from trainopt.stability import HostSyncCounter
        >>> x = torch.randn(8)
        >>> with HostSyncCounter() as counter:
        ...     y = torch.where(x > 0, x, 0.0).sum()   # stays a tensor: no sync
        ...     value = y.item()                       # read on the host: a sync
        ...     positive = x[x > 0]                    # boolean mask: its size needs the host
        >>> counter.count, sorted(counter.operators)
        (2, ['aten._local_scalar_dense', 'aten.index'])
    """

    def __init__(self, keep_stacks: int = 5) -> None:
        super().__init__()
        self.count = 0
        self.operators: Counter[str] = Counter()
        self.keep_stacks = keep_stacks
        self.stacks: list[str] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = _syncs(func, args, kwargs)
        if name is not None:
            self.count += 1
            self.operators[name] += 1
            if len(self.stacks) < self.keep_stacks:
                self.stacks.append(f"{name}\n" + "".join(traceback.format_stack(limit=8)[:-1]))
        return func(*args, **kwargs)
