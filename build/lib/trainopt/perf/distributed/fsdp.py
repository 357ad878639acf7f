"""FSDP2 sharding and the memory each rank holds under ZeRO stages 0 to 3."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from trainopt.validation import check_int

ZERO_STAGES: tuple[int, ...] = (0, 1, 2, 3)


def load_fsdp2() -> Any:
    """FSDP2's API as a namespace with ``fully_shard``, ``MixedPrecisionPolicy`` and ``FSDPModule``.

    ``torch.distributed.fsdp`` exports them from torch 2.6; torch 2.4 and 2.5 have them in
    ``torch.distributed._composable.fsdp``.

    Raises:
        ImportError: this torch has no FSDP2; the message names the version and what is needed.

    Example:
        >>> from trainopt.perf.distributed.fsdp import load_fsdp2
        >>> sorted(vars(load_fsdp2()))
        ['FSDPModule', 'MixedPrecisionPolicy', 'fully_shard']
    """
    for module_name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            module = importlib.import_module(module_name)
            return SimpleNamespace(
                fully_shard=module.fully_shard,
                MixedPrecisionPolicy=module.MixedPrecisionPolicy,
                FSDPModule=module.FSDPModule,
            )
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"FSDP2 (fully_shard) needs torch >= 2.4, this is torch {torch.__version__}")


def fsdp2_available() -> bool:
    """Whether this torch has FSDP2's ``fully_shard``.

    Example:
        >>> import torch
        >>> from trainopt.perf.distributed import fsdp2_available
        >>> fsdp2_available() == (tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4))
        True
    """
    try:
        load_fsdp2()
    except ImportError:
        return False
    return True


def shard_model(
    model: nn.Module,
    blocks: Iterable[nn.Module],
    *,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
    mesh: Any = None,
) -> nn.Module:
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
        reduce_dtype: Dtype of the gradient reduce-scatter; ``None`` reduces in
            ``param_dtype`` (bf16 gradients summed in bf16). ``torch.float32`` is the usual
            choice with a bf16 ``param_dtype``.
        reshard_after_forward: Free the gathered parameters after forward (ZeRO-3); ``False``
            keeps them until backward (ZeRO-2-like: more memory, one all-gather less).
        mesh: A ``DeviceMesh``; ``None`` shards over every rank. A 2-D mesh with dimensions
            ``("replicate", "shard")`` gives HSDP: shard within a node, replicate across nodes.

    Returns:
        ``model``, now an ``FSDPModule`` whose parameters are ``DTensor`` shards.

    Example:
        >>> from trainopt.perf.distributed import single_process_group
        >>> import torch
        >>> from trainopt.perf.distributed import shard_model
        >>> from trainopt.perf.distributed.fsdp import load_fsdp2
        >>> from trainopt.models import GPT, gpt_config
        >>> with single_process_group():
        ...     model = GPT(gpt_config("tiny"))
        ...     model = shard_model(model, model.blocks, param_dtype=torch.bfloat16)
        ...     sharded = isinstance(model.blocks[0], load_fsdp2().FSDPModule)
        ...     sharded, type(model.wte.weight).__name__
        (True, 'DTensor')
    """
    fsdp = load_fsdp2()
    policy = fsdp.MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for module in [*blocks, model]:
        fsdp.fully_shard(
            module, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward
        )
    return model


def full_tensors(tensors: Iterable[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Plain tensors from a mix of tensors and FSDP2 ``DTensor`` shards (which are gathered).

    Example:
        >>> import torch
        >>> from trainopt.perf.distributed.fsdp import full_tensors
        >>> full_tensors([torch.ones(2), None])
        [tensor([1., 1.]), None]
    """
    return [t.full_tensor() if hasattr(t, "full_tensor") else t for t in tensors]


def memory_per_rank(
    n_params: float,
    world_size: int,
    stage: int,
    *,
    param_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = 12,
) -> dict[str, float]:
    """Bytes of weights, gradients and optimizer state per rank under ZeRO stage 0-3.

    Stage 0 is DDP (everything replicated); stage 1 shards the optimizer state, stage 2 also
    the gradients, stage 3 (FSDP's full sharding) also the weights. The defaults are mixed
    precision Adam: 2-byte weights and gradients, 12 bytes of fp32 master weight, momentum
    and variance per parameter. Activations and temporary buffers are not included.

    Example:
        >>> from trainopt.perf.distributed import memory_per_rank
        >>> round(memory_per_rank(7.5e9, 64, stage=1)["total"] / 1e9, 1)  # ZeRO paper, Fig. 1
        31.4
    """
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage must be one of {list(ZERO_STAGES)}, got {stage=}")
    check_int("world_size", world_size, 1)
    shard = 1.0 / world_size
    weights = n_params * param_bytes * (shard if stage >= 3 else 1.0)
    grads = n_params * grad_bytes * (shard if stage >= 2 else 1.0)
    optimizer = n_params * optimizer_bytes * (shard if stage >= 1 else 1.0)
    return {
        "weights": weights,
        "gradients": grads,
        "optimizer": optimizer,
        "total": weights + grads + optimizer,
    }


def memory_table(n_params: float = 350e6, world_size: int = 8) -> str:
    """A Markdown table of :func:`memory_per_rank` for stages 0-3, in GiB.

    Example:
        >>> from trainopt.perf.distributed.fsdp import memory_table
        >>> print(memory_table(1e9, 8).splitlines()[2])
        | DDP (stage 0) | 1.86 GiB | 1.86 GiB | 11.18 GiB | 14.90 GiB |
    """
    names = {0: "DDP (stage 0)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3 / FSDP"}
    lines = [
        f"| {n_params / 1e6:.0f}M parameters, {world_size} ranks | weights | gradients | "
        "optimizer | total |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for stage, name in names.items():
        m = {k: v / 2**30 for k, v in memory_per_rank(n_params, world_size, stage).items()}
        lines.append(
            f"| {name} | {m['weights']:.2f} GiB | {m['gradients']:.2f} GiB | "
            f"{m['optimizer']:.2f} GiB | {m['total']:.2f} GiB |"
        )
    return "\n".join(lines)
