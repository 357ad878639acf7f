"""The layout planner's checks against a trace on fake tensors and against a measured step.

- :func:`traced_fsdp_peak`: one process plays one rank of ``world_size``: a fake process group
  (``torch.testing._internal.distributed.fake_pg``) and fake tensors (``FakeTensorMode``) run
  two steps of FSDP2 on :class:`trainopt.models.GPT`, and torch's ``FSDPMemTracker`` returns
  the rank's peak, by kind, as torchtitan's memory estimation does.
- :func:`traced_tensor_parallel_peak`: the same with the feed-forward layers split by
  ``parallelize_module`` (``ColwiseParallel``/``RowwiseParallel``), measured by torch's
  ``MemTracker``.
- :func:`measured_peaks`: run with :func:`~trainopt.perf.distributed.launch` on two gloo
  processes, a real step of DDP and of FSDP2 on the CPU, its per-rank peak counted by
  :class:`~trainopt.perf.peak.LiveStorageTracker`.

Each returns the planner's figure beside its own, in bytes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainopt.models import GPT, gpt_config
from trainopt.perf.distributed.ddp import wrap_ddp
from trainopt.perf.distributed.fsdp import shard_model
from trainopt.perf.peak import LiveStorageTracker
from trainopt.perf.planner import Layout, ModelShape, Training, memory_per_gpu


def _planned(model: nn.Module, config: Any, batch: int, seq_len: int, layout: Layout) -> int:
    shape = ModelShape.from_module(model, seq_len=seq_len, heads=config.n_head)
    return memory_per_gpu(shape, Training(micro_batch=batch, precision="fp32"), layout).peak


def _two_steps(
    model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any, tracker: Any
) -> None:
    """A step that creates the optimizer state, then the steady-state step, tracked."""
    idx, targets = batch
    for step in range(2):
        if step == 1:
            tracker.reset_mod_stats()
        model(idx, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def traced_fsdp_peak(
    world_size: int = 4, batch: int = 8, seq_len: int = 256, preset: str = "small"
) -> dict[str, int]:
    """One FSDP2 rank's peak on fake tensors and a fake process group, and the planner's.

    Example:
        >>> from trainopt_site.perf.planner.checks import traced_fsdp_peak
        >>> result = traced_fsdp_peak(world_size=2, batch=1, seq_len=32, preset="tiny")
        >>> abs(result["planned"] / result["traced"] - 1) < 0.1
        True
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    config = gpt_config(preset)
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        with FakeTensorMode():
            model = GPT(config)
            shard_model(model, model.blocks, mesh=mesh)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
            data = tuple(torch.randint(0, config.vocab_size, (batch, seq_len)) for _ in "xy")
            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs(data)
            with tracker:
                _two_steps(model, optimizer, data, tracker)
            traced = max(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
        planned = _planned(model, config, batch, seq_len, Layout(dp=world_size, zero=3))
    finally:
        dist.destroy_process_group()
    return {"traced": int(traced), "planned": int(planned)}


def _local_tensors(tensors: Any) -> list[torch.Tensor]:
    return [t.to_local() if hasattr(t, "to_local") else t for t in tensors]


def _rank_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [p for p in model.parameters()] + [b for b in model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    for state in optimizer.state.values():
        tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return _local_tensors(tensors)


def _measure(wrap: str, batch: int, seq_len: int, preset: str) -> dict[str, int]:
    rank, world = dist.get_rank(), dist.get_world_size()
    config = gpt_config(preset)
    torch.manual_seed(0)
    model = GPT(config)
    planned_model = model
    if wrap == "ddp":
        wrapped: nn.Module = wrap_ddp(model)
        layout = Layout(dp=world, zero=0)
    else:
        wrapped = shard_model(model, model.blocks)
        layout = Layout(dp=world, zero=3)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3, foreach=True)
    generator = torch.Generator().manual_seed(rank)
    idx, targets = (
        torch.randint(0, config.vocab_size, (batch, seq_len), generator=generator) for _ in "xy"
    )

    def step() -> None:
        wrapped(idx, targets).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # the optimizer state appears
    tracker = LiveStorageTracker("cpu")
    tracker.count(_rank_state(wrapped, optimizer))
    tracker.count([idx, targets])
    with tracker:
        step()
    planned = _planned(planned_model, config, batch, seq_len, layout)
    return {"measured": tracker.peak, "planned": planned}


def measured_peaks(batch: int = 4, seq_len: int = 128, preset: str = "small") -> dict[str, Any]:
    """This rank's measured peak of a DDP step and of an FSDP2 step, and the planner's figures.

    Run it on every rank: ``launch(measured_peaks, 2, backend="gloo")``.
    """
    return {wrap: _measure(wrap, batch, seq_len, preset) for wrap in ("ddp", "fsdp")}
