"""DistributedDataParallel: wrapping, communication hooks and a count of all-reduces."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

COMM_HOOKS: tuple[str, ...] = ("allreduce", "fp16", "bf16", "powersgd")


def wrap_ddp(
    model: nn.Module,
    *,
    bucket_cap_mb: float = 25.0,
    gradient_as_bucket_view: bool = True,
    static_graph: bool = False,
) -> DistributedDataParallel:
    """Wrap ``model`` (already on this rank's device) in ``DistributedDataParallel``.

    Args:
        model: The replica of this rank; DDP broadcasts rank 0's weights to the others.
        bucket_cap_mb: Gradients are all-reduced in buckets of about this size, each one as
            soon as backward has filled it, so communication overlaps the rest of backward.
        gradient_as_bucket_view: Make ``param.grad`` a view into the bucket, which saves one
            copy of the gradients in memory and one memory copy per step.
        static_graph: Promise that the set of used parameters is the same every step, which
            lets DDP skip bookkeeping and re-order buckets once.

    Returns:
        The wrapped model.

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> import torch
        >>> from trainopt.perf.distributed import wrap_ddp
        >>> with single_process_group():
        ...     model = wrap_ddp(torch.nn.Linear(4, 2), bucket_cap_mb=1.0, static_graph=True)
        ...     type(model).__name__, model.module.out_features
        ('DistributedDataParallel', 2)
    """
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb=}")
    device = next(model.parameters()).device
    return DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        static_graph=static_graph,
    )


@dataclass
class CommCounter:
    """Counts the gradient all-reduce calls of a DDP model (one per bucket) and their elements.

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> import torch
        >>> from trainopt.perf.distributed.ddp import CommCounter
        >>> from trainopt.perf.distributed import register_comm_hook
        >>> from trainopt.perf.distributed import wrap_ddp
        >>> counter = CommCounter()
        >>> with single_process_group():
        ...     model = wrap_ddp(torch.nn.Linear(4, 2))
        ...     _ = register_comm_hook(model, "allreduce", counter=counter)
        ...     model(torch.ones(3, 4)).sum().backward()
        >>> counter.state_dict()  # one bucket: 4 x 2 weights and 2 biases
        {'calls': 1, 'elements': 10}
    """

    calls: int = 0
    elements: int = 0

    def state_dict(self) -> dict[str, int]:
        return {"calls": self.calls, "elements": self.elements}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.calls, self.elements = int(state["calls"]), int(state["elements"])


def _counting_hook(state, bucket):  # noqa: ANN001 - DDP rejects string annotations on hooks
    state.counter.calls += 1
    state.counter.elements += bucket.buffer().numel()
    return state.hook(state.inner, bucket)


def backend_reduces_dtype(dtype: torch.dtype, device: torch.device | str = "cpu") -> bool:
    """Whether the default process group can all-reduce ``dtype`` tensors on ``device``.

    A one-element all-reduce, run by every rank (so every rank gets the same answer). Gloo,
    for instance, has no bfloat16 kernels in older torch releases nor for CUDA tensors.

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> import torch
        >>> from trainopt.perf.distributed.ddp import backend_reduces_dtype
        >>> with single_process_group("gloo"):
        ...     backend_reduces_dtype(torch.float32)
        True
    """
    try:
        dist.all_reduce(torch.zeros(1, dtype=dtype, device=device))
    except (RuntimeError, ValueError):
        return False
    return True


def register_comm_hook(
    model: DistributedDataParallel,
    name: str = "allreduce",
    *,
    counter: CommCounter | None = None,
    powersgd_rank: int = 1,
    start_powersgd_iter: int = 2,
) -> Any:
    """Register one of torch's DDP communication hooks by name, optionally counting calls.

    Args:
        model: A ``DistributedDataParallel`` model (it takes one hook).
        name: ``"allreduce"`` (exact), ``"fp16"`` or ``"bf16"`` (cast each bucket before the
            all-reduce: half the bytes, rounding error), ``"powersgd"`` (rank-``powersgd_rank``
            low-rank approximation of each gradient matrix, with error feedback).
        counter: If given, counts every all-reduce of a bucket.
        powersgd_rank: Rank of the PowerSGD approximation.
        start_powersgd_iter: Steps of exact all-reduce before PowerSGD starts (at least 2).

    Returns:
        The ``PowerSGDState`` for ``"powersgd"``, else ``None``. Save the PowerSGD state with
        the checkpoint, since it holds the error-feedback memory.

    Raises:
        ValueError: unknown ``name``; ``"bf16"`` on a backend other than NCCL/XCCL (trainopt's
            own rule: DDP checks only that the build has CUDA with NCCL 2.10 or later, or XPU
            with XCCL); ``"fp16"`` where the backend can't all-reduce float16. The message
            names the backend and the hooks to use instead.

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> import torch
        >>> from trainopt.perf.distributed import register_comm_hook
        >>> from trainopt.perf.distributed import wrap_ddp
        >>> with single_process_group("gloo"):
        ...     model = wrap_ddp(torch.nn.Linear(16, 16))
        ...     state = register_comm_hook(model, "powersgd", powersgd_rank=2)
        >>> type(state).__name__, state.matrix_approximation_rank
        ('PowerSGDState', 2)
    """
    if name not in COMM_HOOKS:
        raise ValueError(f"name must be one of {list(COMM_HOOKS)}, got {name=}")
    hooks = {
        "allreduce": default_hooks.allreduce_hook,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
        "powersgd": powerSGD_hook.powerSGD_hook,
    }
    state: Any = None
    if name == "bf16" and dist.get_backend() not in ("nccl", "xccl"):
        # DDP itself checks the build (CUDA with NCCL >= 2.10, or XPU with XCCL), not the group's
        # backend; trainopt refuses other backends so a run behaves the same on every build.
        raise ValueError(
            f"name='bf16' needs the NCCL (or XCCL) backend, got {dist.get_backend()!r}; "
            "use 'allreduce', 'fp16' or 'powersgd'"
        )
    device = next(model.parameters()).device
    if name == "fp16" and not backend_reduces_dtype(torch.float16, device):
        raise ValueError(
            f"the {dist.get_backend()!r} backend can't all-reduce float16 on "
            f"{device.type} in torch {torch.__version__}, so name='fp16' can't run "
            "here; use 'allreduce' or 'powersgd'"
        )
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=start_powersgd_iter,
            use_error_feedback=True,
            warm_start=True,
        )
    if counter is None:
        model.register_comm_hook(state, hooks[name])
    else:
        model.register_comm_hook(
            SimpleNamespace(hook=hooks[name], inner=state, counter=counter), _counting_hook
        )
    return state


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Communicate gradients in the backward passes of this block only if ``enabled``.

    Put every micro-batch but the last of an accumulation under ``enabled=False``: gradients
    accumulate locally, and the last backward communicates the sum once. DDP uses
    ``no_sync()``; FSDP2 uses ``set_requires_gradient_sync``; other modules run as they are.

    Example:
        >>> import torch
        >>> from trainopt.perf.distributed import gradient_sync
        >>> model = torch.nn.Linear(2, 1)
        >>> with gradient_sync(model, enabled=False):
        ...     model(torch.ones(1, 2)).sum().backward()
        >>> model.weight.grad.shape
        torch.Size([1, 2])
    """
    if isinstance(model, DistributedDataParallel):
        with contextlib.nullcontext() if enabled else model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(enabled)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield
