"""Measure the memory of a training step on any device, the CPU included: a live-storage tracker.

PyTorch keeps allocator statistics (``torch.cuda.max_memory_allocated``) for CUDA only. On a
CPU, :class:`LiveStorageTracker` measures the same quantity from the tensors themselves: a
``TorchDispatchMode`` sees every operator's outputs, adds the bytes of each storage it has not
seen yet, and subtracts them when that storage is freed or resized (FSDP2 frees a gathered
weight by ``untyped_storage().resize_(0)`` and allocates it again the same way, outside any
operator). Its peak is the most bytes of tensor storage alive at once, as an allocator would
count them (without rounding or caching). Buffers an operator allocates and frees inside its
own kernel are not seen.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveStorageTracker(TorchDispatchMode):
    """Count the bytes of live tensor storages on one device type; keep the peak.

    Use it as a context manager around the step. Tensors that exist before (weights, optimizer
    state, the batch) are counted with :meth:`count`; everything the step creates is counted
    as operators create it. :attr:`current` and :attr:`peak` are in bytes; :meth:`reset_peak`
    starts a new peak, for one phase of a step at a time.

    Example:
        >>> import torch
        >>> from trainopt.perf import LiveStorageTracker
        >>> weight = torch.randn(256, 256, requires_grad=True)  # 256 KiB
        >>> tracker = LiveStorageTracker("cpu")
        >>> tracker.count([weight])
        >>> with tracker:
        ...     # the matmul output is freed: relu keeps its own output
        ...     loss = (weight @ weight).relu().sum()
        ...     loss.backward()  # the gradient appears: 256 KiB more
        >>> tracker.peak // 2**10, tracker.current // 2**10  # KiB: during backward, after it
        (1024, 512)
    """

    def __init__(self, device: str | torch.device = "cpu") -> None:
        super().__init__()
        self.device_type = torch.device(device).type
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}  # id of each live storage -> its bytes
        self._resize: Callable[..., Any] | None = None

    def count(self, tensors: Iterable[torch.Tensor]) -> None:
        """Count storages that already exist (each storage once, views included)."""
        for tensor in tensors:
            self._add(tensor)

    def reset_peak(self) -> None:
        """Make the current bytes the peak, so that the next peak is of what follows."""
        self.peak = self.current

    def _add(self, tensor: torch.Tensor, size: int | None = None) -> None:
        """Count ``tensor``'s storage once, as ``size`` bytes if given (else its own)."""
        if tensor.device.type != self.device_type:
            return
        storage = tensor.untyped_storage()
        key = id(storage)  # the storage's Python object lives exactly as long as the storage
        if key in self._live:
            return
        size = storage.nbytes() if size is None else size
        self._live[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def _resized(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        if key in self._live and storage.device.type == self.device_type:
            size = storage.nbytes()
            self.current += size - self._live[key]
            self._live[key] = size
            self.peak = max(self.peak, self.current)

    def __enter__(self) -> LiveStorageTracker:
        resize = self._resize = torch.UntypedStorage.resize_

        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            out = resize(storage, size)
            self._resized(storage)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._resize is not None:
            torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
            self._resize = None
        super().__exit__(*exc)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                self._add(value)
        return out


def training_state(
    model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> Iterator[torch.Tensor]:
    """The tensors a training step keeps between steps: parameters, gradients, optimizer state.

    Example:
        >>> import torch
        >>> from trainopt.perf.peak import training_state
        >>> model = torch.nn.Linear(4, 2)
        >>> optimizer = torch.optim.AdamW(model.parameters())
        >>> model(torch.randn(3, 4)).sum().backward()
        >>> optimizer.step()
        >>> len(list(training_state(model, optimizer)))  # 2 weights, 2 gradients, 2 × (step, m, v)
        10
    """
    for param in model.parameters():
        yield param
        if param.grad is not None:
            yield param.grad
    if optimizer is not None:
        for state in optimizer.state.values():
            yield from (value for value in state.values() if isinstance(value, torch.Tensor))


def measure_peak_memory(
    step: Callable[[], Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    inputs: Iterable[torch.Tensor] = (),
    device: str | torch.device = "cpu",
) -> int:
    """Peak bytes of tensor storage alive during one call of ``step`` (on any device).

    Counts the model's parameters, gradients and optimizer state, the ``inputs`` and everything
    ``step`` creates. Run a step before, so that the optimizer state exists: this measures the
    steady state, as ``torch.cuda.max_memory_allocated`` over a later step would on a GPU.

    Example:
        >>> import torch
        >>> from trainopt.perf import measure_peak_memory
        >>> model = torch.nn.Linear(1024, 1024, bias=False)  # 4 MiB of fp32 weights
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> x = torch.randn(8, 1024)
        >>> def step():
        ...     model(x).sum().backward()
        ...     optimizer.step()
        ...     optimizer.zero_grad(set_to_none=True)
        >>> measure_peak_memory(step, model, optimizer, [x]) // 2**20  # weights + gradient
        8
    """
    tracker = LiveStorageTracker(device)
    tracker.count(training_state(model, optimizer))
    tracker.count(inputs)
    with tracker:
        step()
    return tracker.peak
