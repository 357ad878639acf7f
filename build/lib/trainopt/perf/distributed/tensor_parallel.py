"""Tensor parallelism with DTensor: an MLP split across ranks computes what one process computes.

The distributed page's example: the first linear layer is split by output columns, the
second by input rows (Megatron-LM's MLP split), so the only communication in the forward
pass is one all-reduce of the output.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


def tensor_parallel_mlp_check(width: int = 16, seed: int = 0) -> dict[str, Any]:
    """On every rank: split an MLP with DTensor and compare it with the whole MLP on one process.

    Run it with :func:`trainopt.perf.distributed.launch` on ``n`` processes; ``width * 4`` must
    divide by ``n``. Returns the rank's shard shapes, and the largest differences of the
    output and of the gathered gradients from the unsplit MLP's.

    Example:
        >>> from trainopt.perf.distributed import launch
        >>> from trainopt.perf.distributed.tensor_parallel import tensor_parallel_mlp_check
        >>> results = launch(tensor_parallel_mlp_check, 2, backend="gloo", timeout=120)
        >>> results[0]["fc_shard"], results[1]["proj_shard"]  # 64 hidden units, 32 per rank
        ([32, 16], [16, 32])
        >>> max(r["max_output_diff"] + r["max_grad_diff"] for r in results) < 1e-5
        True
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    torch.manual_seed(seed)  # the same weights and batch on every rank
    whole = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)).to(
        device
    )
    split = parallelize_module(
        copy.deepcopy(whole), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()}
    )
    x = torch.randn(8, width, device=device)
    expected, out = whole(x), split(x)
    expected.square().sum().backward()
    out.square().sum().backward()
    grad_diff = max(
        (a.grad - b.grad.full_tensor()).abs().max().item()
        for a, b in zip(whole.parameters(), split.parameters())
    )
    return {
        "fc_shard": list(split[0].weight.to_local().shape),
        "proj_shard": list(split[2].weight.to_local().shape),
        "max_output_diff": (out - expected).abs().max().item(),
        "max_grad_diff": grad_diff,
    }
