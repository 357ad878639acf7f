"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): each rank writes its shards.

``torch.save`` of an FSDP2 model would either gather every weight on one rank (slow, and it
may not fit) or write files tied to one world size. DCP writes each rank's shards in parallel
with a metadata file, and loading reshards: a checkpoint written by 8 ranks loads on 4, or
into a plain model in one process. ``get_state_dict`` / ``set_state_dict`` give the model and
optimizer states in the form DCP expects, for DDP, FSDP2 and plain modules alike.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save_sharded(
    directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Write the model's (and optimizer's) state to ``directory``, every rank its own shards.

    Call it on every rank at the same step. Outside a process group it writes from this one
    process.

    Example:
        >>> import tempfile
        >>> import torch
        >>> from trainopt.perf.distributed import load_sharded, save_sharded
        >>> model = torch.nn.Linear(4, 2)
        >>> directory = tempfile.mkdtemp()
        >>> save_sharded(directory, model)
        >>> copy = torch.nn.Linear(4, 2)
        >>> load_sharded(directory, copy)
        >>> torch.equal(copy.weight, model.weight)
        True
    """
    model_state, optimizer_state = get_state_dict(model, optimizer or [])
    state: dict[str, Any] = {"model": model_state}
    if optimizer is not None:
        state["optimizer"] = optimizer_state
    single_process = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():  # DCP warns that it assumes one process: that is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        dcp.save(state, checkpoint_id=directory, no_dist=single_process)


def load_sharded(
    directory: str | os.PathLike, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> None:
    """Load a checkpoint of :func:`save_sharded` in place, resharding to this model's layout.

    ``model`` (and ``optimizer``) must be built and sharded as they will train; their current
    states give the shapes and the placement that DCP fills in. The checkpoint may come from
    another world size, or from a sharded run into a plain model.

    Example:
        >>> import tempfile
        >>> import torch
        >>> from trainopt.perf.distributed import load_sharded, save_sharded
        >>> model = torch.nn.Linear(4, 2)
        >>> optimizer = torch.optim.AdamW(model.parameters())
        >>> model(torch.ones(1, 4)).sum().backward()
        >>> optimizer.step()
        >>> directory = tempfile.mkdtemp()
        >>> save_sharded(directory, model, optimizer)
        >>> copy = torch.nn.Linear(4, 2)
        >>> copy_optimizer = torch.optim.AdamW(copy.parameters())
        >>> load_sharded(directory, copy, copy_optimizer)
        >>> copy_optimizer.state_dict()["state"][0]["step"].item()
        1.0
    """
    model_state, optimizer_state = get_state_dict(model, optimizer or [])
    state: dict[str, Any] = {"model": model_state}
    if optimizer is not None:
        state["optimizer"] = optimizer_state
    single_process = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():  # DCP warns that it assumes one process: that is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        dcp.load(state, checkpoint_id=directory, no_dist=single_process)
    set_state_dict(
        model,
        optimizer or [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optimizer", {}),
    )
