"""Data-parallel training on ``torch.distributed``: DDP, FSDP2, accumulation, agreement.

Everything here calls torch's own machinery; nothing sends bytes by itself:

- :func:`launch` runs an importable function on N local processes (gloo on a CPU, NCCL on
  GPUs), the way ``torchrun`` would, and returns each rank's result.
- :func:`wrap_ddp` and :func:`register_comm_hook` set up ``DistributedDataParallel`` with its
  bucket size, bucket views, static graph and a communication hook (plain all-reduce, fp16 or
  bf16 compression, PowerSGD); :class:`CommCounter` counts the all-reduce calls.
- :func:`shard_model` applies FSDP2's ``fully_shard`` block by block, then to the root.
- :func:`gradient_sync` skips gradient communication on the micro-batches of an accumulation
  (``no_sync`` for DDP, ``set_requires_gradient_sync`` for FSDP2).
- :func:`memory_per_rank` is the ZeRO memory formula.

Checks and decisions that must agree across ranks are in
:mod:`trainopt.perf.distributed_consistency`.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

COMM_HOOKS: tuple[str, ...] = ("allreduce", "fp16", "bf16", "powersgd")
ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)


class WorkerError(RuntimeError):
    """A function run by :func:`launch` raised on one rank; the message names the rank.

    Example:
        >>> error = WorkerError(1, "ValueError: bad batch")
        >>> error.rank, str(error).splitlines()
        (1, ['rank 1 failed:', 'ValueError: bad batch'])
    """

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"rank {rank} failed:\n{message}")
        self.rank = rank


# ---------------------------------------------------------------------------------------------
# Launching N local processes
# ---------------------------------------------------------------------------------------------


def default_backend(nprocs: int) -> str:
    """``"nccl"`` when there is one CUDA device per process, else ``"gloo"`` (CPU).

    Example:
        >>> default_backend(1) in ("gloo", "nccl")
        True
    """
    if torch.cuda.is_available() and torch.cuda.device_count() >= nprocs and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def free_port() -> int:
    """A TCP port on the loopback that was free a moment ago (the OS picks it).

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_device() -> torch.device:
    """The device of this rank: ``cuda:<LOCAL_RANK>`` under NCCL, else the CPU.

    Example:
        >>> with single_process_group("gloo"):
        ...     rank_device()
        device(type='cpu')
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


@contextlib.contextmanager
def single_process_group(backend: str = "gloo") -> Iterator[None]:
    """A process group of this one process (world size 1): run distributed code without spawning.

    Handy to step through DDP or FSDP2 code in a debugger, and for quick checks.

    Example:
        >>> with single_process_group():
        ...     rank_and_world_size()
        (0, 1)
        >>> dist.is_initialized()
        False
    """
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _run_rank(rank: int, fn: Callable[..., Any], args: tuple, nprocs: int, port: int,
              backend: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(nprocs))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    else:  # as torchrun does: N processes must not each start one thread per core
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nprocs))
    dist.init_process_group(backend, init_method="env://")
    try:
        result = fn(*args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()  # leave together: a rank that tears down early can abort a peer's gloo
    except BaseException:
        # Other ranks fail next (a peer vanished mid-collective): keep the time to find the first.
        (Path(out_dir) / f"rank{rank}.error").write_text(f"{time.time()!r}\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()


def _first_error(out_dir: str) -> WorkerError | None:
    errors = []
    for path in Path(out_dir).glob("rank*.error"):
        stamp, _, message = path.read_text().partition("\n")
        errors.append((float(stamp), int(path.stem[4:]), message))
    if not errors:
        return None
    _, rank, message = min(errors)
    return WorkerError(rank, message)


def launch(fn: Callable[..., Any], nprocs: int, *args: Any, backend: str | None = None) -> list[Any]:
    """Run ``fn(*args)`` on ``nprocs`` local processes joined in one process group.

    Each process gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` (a free loopback port) in its environment, as ``torchrun`` sets them, and
    joins the default group with ``init_method="env://"``. ``fn`` must be importable (defined
    in a module, not in ``__main__`` or a notebook), because the processes are spawned. Its
    result must be made of tensors, numbers, strings, lists and dicts.

    Args:
        fn: The function each rank runs; it reads its rank from ``torch.distributed``.
        nprocs: Number of processes (the world size), at least 1.
        *args: Passed to ``fn`` on every rank.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per process); ``None`` picks
            :func:`default_backend`.

    Returns:
        The results of ``fn``, indexed by rank.

    Raises:
        WorkerError: ``fn`` raised on some rank; the message names the rank that failed
            first and has its traceback. The other ranks are stopped.

    Example:
        >>> launch(rank_and_world_size, 2)
        [(0, 2), (1, 2)]
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive int, got {nprocs=}")
    backend = backend or default_backend(nprocs)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend=}")
    if backend == "nccl" and torch.cuda.device_count() < nprocs:
        raise ValueError(f"backend='nccl' needs one GPU per process: {nprocs=}, "
                         f"{torch.cuda.device_count()} visible")
    with tempfile.TemporaryDirectory(prefix="trainopt-launch-") as out_dir:
        try:
            mp.start_processes(_run_rank, args=(fn, args, nprocs, free_port(), backend, out_dir),
                               nprocs=nprocs, join=True, start_method="spawn")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            error = _first_error(out_dir)
            finished = all((Path(out_dir) / f"rank{r}.pt").exists() for r in range(nprocs))
            if error is not None or not finished:
                raise error or WorkerError(exc.error_index, str(exc)) from None
            warnings.warn(f"every rank returned its result, then: {exc}", RuntimeWarning, stacklevel=2)
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=True) for r in range(nprocs)]


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of the calling process: the smallest function to :func:`launch`.

    Example:
        >>> with single_process_group():
        ...     rank_and_world_size()
        (0, 1)
    """
    return dist.get_rank(), dist.get_world_size()


# ---------------------------------------------------------------------------------------------
# DDP: buckets and communication hooks
# ---------------------------------------------------------------------------------------------


def wrap_ddp(model: nn.Module, *, bucket_cap_mb: float = 25.0, gradient_as_bucket_view: bool = True,
             static_graph: bool = False) -> DistributedDataParallel:
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
        >>> with single_process_group("gloo"):
        ...     backend_reduces_dtype(torch.float32)
        True
    """
    try:
        dist.all_reduce(torch.zeros(1, dtype=dtype, device=device))
    except (RuntimeError, ValueError):
        return False
    return True


def register_comm_hook(model: DistributedDataParallel, name: str = "allreduce", *,
                       counter: CommCounter | None = None, powersgd_rank: int = 1,
                       start_powersgd_iter: int = 2) -> Any:
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
        ValueError: unknown ``name``; ``"bf16"`` on a backend other than NCCL/XCCL (DDP
            refuses it on gloo); ``"fp16"`` where the backend can't all-reduce float16. The
            message names the backend and the hooks to use instead.

    Example:
        >>> with single_process_group("gloo"):
        ...     model = wrap_ddp(torch.nn.Linear(16, 16))
        ...     state = register_comm_hook(model, "powersgd", powersgd_rank=2)
        >>> type(state).__name__, state.matrix_approximation_rank
        ('PowerSGDState', 2)
    """
    if name not in COMM_HOOKS:
        raise ValueError(f"name must be one of {list(COMM_HOOKS)}, got {name=}")
    hooks = {"allreduce": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
             "bf16": default_hooks.bf16_compress_hook, "powersgd": powerSGD_hook.powerSGD_hook}
    state: Any = None
    if name == "bf16" and dist.get_backend() not in ("nccl", "xccl"):
        raise ValueError(f"name='bf16' needs the NCCL (or XCCL) backend: DDP refuses the bf16 "
                         f"hook on {dist.get_backend()!r}; use 'allreduce', 'fp16' or 'powersgd'")
    device = next(model.parameters()).device
    if name == "fp16" and not backend_reduces_dtype(torch.float16, device):
        raise ValueError(f"the {dist.get_backend()!r} backend can't all-reduce float16 on "
                         f"{device.type} in torch {torch.__version__}, so name='fp16' can't run "
                         "here; use 'allreduce' or 'powersgd'")
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=start_powersgd_iter, use_error_feedback=True, warm_start=True)
    if counter is None:
        model.register_comm_hook(state, hooks[name])
    else:
        model.register_comm_hook(SimpleNamespace(hook=hooks[name], inner=state, counter=counter),
                                 _counting_hook)
    return state


# ---------------------------------------------------------------------------------------------
# FSDP2
# ---------------------------------------------------------------------------------------------


def load_fsdp2() -> Any:
    """FSDP2's API as a namespace with ``fully_shard``, ``MixedPrecisionPolicy`` and ``FSDPModule``.

    ``torch.distributed.fsdp`` exports them from torch 2.6; torch 2.4 and 2.5 have them in
    ``torch.distributed._composable.fsdp``.

    Raises:
        ImportError: this torch has no FSDP2; the message names the version and what is needed.

    Example:
        >>> sorted(vars(load_fsdp2()))
        ['FSDPModule', 'MixedPrecisionPolicy', 'fully_shard']
    """
    for module_name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = importlib.import_module(module_name)
            return SimpleNamespace(fully_shard=module.fully_shard,
                                   MixedPrecisionPolicy=module.MixedPrecisionPolicy,
                                   FSDPModule=module.FSDPModule)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"FSDP2 (fully_shard) needs torch >= 2.4, this is torch {torch.__version__}")


def fsdp2_available() -> bool:
    """Whether this torch has FSDP2's ``fully_shard``.

    Example:
        >>> fsdp2_available() == (tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4))
        True
    """
    try:
        load_fsdp2()
    except ImportError:
        return False
    return True


def shard_model(model: nn.Module, blocks: Iterable[nn.Module], *,
                param_dtype: torch.dtype | None = None,
                reduce_dtype: torch.dtype | None = None, reshard_after_forward: bool = True) -> nn.Module:
    """Shard ``model`` with FSDP2: each block first, then the root for what is left.

    Each ``fully_shard(block)`` makes the block one communication unit: its parameters are
    all-gathered just before its forward (and again before its backward) and its gradients
    reduce-scattered right after its backward, so that only one block is unsharded at a time.
    The root call gathers the remaining parameters (embeddings, final norm, head).

    Args:
        model: The model, on this rank's device.
        blocks: The sub-modules to shard one by one (a transformer's blocks), bottom-up.
        param_dtype: Dtype of the unsharded parameters in forward and backward (``bfloat16``
            for mixed precision); ``None`` keeps the stored dtype.
        reduce_dtype: Dtype of the gradient reduce-scatter; ``None`` uses ``param_dtype``.
        reshard_after_forward: Free the gathered parameters after forward (ZeRO-3); ``False``
            keeps them until backward (ZeRO-2-like: more memory, one all-gather less).

    Returns:
        ``model``, now an ``FSDPModule`` whose parameters are ``DTensor`` shards.

    Example:
        >>> from trainopt.models import GPT, gpt_config
        >>> with single_process_group():
        ...     model = GPT(gpt_config("tiny"))
        ...     model = shard_model(model, model.blocks, param_dtype=torch.bfloat16)
        ...     isinstance(model.blocks[0], load_fsdp2().FSDPModule), type(model.wte.weight).__name__
        (True, 'DTensor')
    """
    fsdp = load_fsdp2()
    policy = fsdp.MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in blocks:
        fsdp.fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fsdp.fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def full_tensors(tensors: Iterable[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Plain tensors from a mix of tensors and FSDP2 ``DTensor`` shards (which are gathered).

    Example:
        >>> full_tensors([torch.ones(2), None])
        [tensor([1., 1.]), None]
    """
    return [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]


# ---------------------------------------------------------------------------------------------
# Gradient accumulation
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Communicate gradients in the backward passes of this block only if ``enabled``.

    Put every micro-batch but the last of an accumulation under ``enabled=False``: gradients
    accumulate locally, and the last backward communicates the sum once. DDP uses
    ``no_sync()``; FSDP2 uses ``set_requires_gradient_sync``; other modules run as they are.

    Example:
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


# ---------------------------------------------------------------------------------------------
# Memory per rank
# ---------------------------------------------------------------------------------------------


def memory_per_rank(n_params: float, world_size: int, stage: int, *, param_bytes: float = 2,
                    grad_bytes: float = 2, optimizer_bytes: float = 12) -> dict[str, float]:
    """Bytes of weights, gradients and optimizer state per rank under ZeRO stage 0-3.

    Stage 0 is DDP (everything replicated); stage 1 shards the optimizer state, stage 2 also
    the gradients, stage 3 (FSDP's full sharding) also the weights. The defaults are mixed
    precision Adam: 2-byte weights and gradients, 12 bytes of fp32 master weight, momentum
    and variance per parameter. Activations and temporary buffers are not included.

    Example:
        >>> round(memory_per_rank(7.5e9, 64, stage=1)["total"] / 1e9, 1)  # ZeRO paper, Fig. 1
        31.4
    """
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage must be one of {list(ZERO_STAGES)}, got {stage=}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size=}")
    shard = 1.0 / world_size
    weights = n_params * param_bytes * (shard if stage >= 3 else 1.0)
    grads = n_params * grad_bytes * (shard if stage >= 2 else 1.0)
    optimizer = n_params * optimizer_bytes * (shard if stage >= 1 else 1.0)
    return {"weights": weights, "gradients": grads, "optimizer": optimizer,
            "total": weights + grads + optimizer}


def memory_table(n_params: float = 350e6, world_size: int = 8) -> str:
    """A Markdown table of :func:`memory_per_rank` for stages 0-3, in GiB.

    Example:
        >>> print(memory_table(1e9, 8).splitlines()[2])
        | DDP (stage 0) | 1.86 GiB | 1.86 GiB | 11.18 GiB | 14.90 GiB |
    """
    names = {0: "DDP (stage 0)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}
    lines = [f"| {n_params / 1e6:.0f}M parameters, {world_size} ranks | weights | gradients | "
             "optimizer | total |", "| --- | ---: | ---: | ---: | ---: |"]
    for stage, name in names.items():
        m = {k: v / 2**30 for k, v in memory_per_rank(n_params, world_size, stage).items()}
        lines.append(f"| {name} | {m['weights']:.2f} GiB | {m['gradients']:.2f} GiB | "
                     f"{m['optimizer']:.2f} GiB | {m['total']:.2f} GiB |")
    return "\n".join(lines)
