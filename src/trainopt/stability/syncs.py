"""Count host-device synchronisations: the proof that a training step makes none.

``.item()``, ``float(t)``, ``bool(t)`` and ``if t:`` on a tensor all reach the host through one
ATen operator, ``aten._local_scalar_dense``. :class:`HostSyncCounter` is a
``TorchDispatchMode`` that counts those calls (and remembers where they came from), so a CPU
test can prove that code would not synchronise a GPU. It also counts copies from an accelerator
to the CPU (``.cpu()``, ``.to("cpu")``), which only show up when the tensors live on one;
``.tolist()`` and ``.numpy()`` read memory without dispatching, so no dispatch mode sees them.
On a GPU, ``torch.cuda.set_sync_debug_mode("error")`` catches every kind at run time.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _is_device_to_host(func: Any, args: tuple, kwargs: dict | None) -> bool:
    """A copy from a non-CPU tensor into CPU memory (it waits for the device)."""
    kwargs = kwargs or {}
    if func is torch.ops.aten._to_copy.default:
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"
    if func is torch.ops.aten.copy_.default:
        return args[0].device.type == "cpu" and args[1].device.type != "cpu"
    return False


class HostSyncCounter(TorchDispatchMode):
    """Count ``aten._local_scalar_dense`` calls (tensor → Python scalar) inside a ``with`` block.

    Attributes:
        count: Number of calls seen.
        stacks: The Python stack of each call (the last few frames), to find the culprit.

    Example:
        >>> import torch
        >>> from trainopt.stability import HostSyncCounter
        >>> x = torch.ones(3)
        >>> with HostSyncCounter() as counter:
        ...     y = (x * 2).sum()          # stays a tensor: no sync
        ...     value = y.item()           # reads it on the host: one sync
        >>> counter.count
        1
    """

    def __init__(self, keep_stacks: int = 5) -> None:
        super().__init__()
        self.count = 0
        self.keep_stacks = keep_stacks
        self.stacks: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten._local_scalar_dense.default or _is_device_to_host(func, args, kwargs):
            self.count += 1
            if len(self.stacks) < self.keep_stacks:
                self.stacks.append("".join(traceback.format_stack(limit=8)[:-1]))
        return func(*args, **(kwargs or {}))
