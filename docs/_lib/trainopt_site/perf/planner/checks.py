"""The layout planner's checks against a trace on fake tensors and against a measured step.

- :func:`traced_fsdp_peak`: one process plays one rank of ``world_size``: a fake process group
  (``torch.testing._internal.distributed.fake_pg``) and fake tensors (``FakeTensorMode``) run
  two steps of FSDP2 on :class:`trainopt.models.GPT`, and torch's ``FSDPMemTracker`` returns
  the rank's peak, by kind, as torchtitan's memory estimation does.
- :func:`traced_tensor_parallel_peak`: the same with attention and feed-forward split by
  ``parallelize_module`` (``ColwiseParallel``/``RowwiseParallel``), measured by torch's
  ``MemTracker``.
- :func:`measured_peaks`: run with :func:`~trainopt.perf.distributed.launch` on two gloo
  processes, a real step of DDP and of FSDP2 on the CPU, its per-rank peak counted by
  :class:`~trainopt.perf.peak.LiveStorageTracker`.

Each returns the planner's figure beside its own, in bytes.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainopt.models import GPT, gpt_config
from trainopt.perf.distributed import launch
from trainopt.perf.distributed.ddp import wrap_ddp
from trainopt.perf.distributed.fsdp import shard_model
from trainopt.perf.peak import LiveStorageTracker
from trainopt.perf.planner import Layout, ModelShape, Training, memory_per_gpu


def _planned(model: nn.Module, config: Any, batch: int, seq_len: int, layout: Layout) -> int:
    shape = ModelShape.from_module(model, seq_len=seq_len, heads=config.n_head)
    return memory_per_gpu(shape, Training(micro_batch=batch, precision="fp32"), layout).peak


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Any) -> None:
    idx, targets = batch
    model(idx, targets).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def traced_fsdp_peak(
    world_size: int = 4, batch: int = 8, seq_len: int = 256, preset: str = "small"
) -> dict[str, int]:
    """One FSDP2 rank's peak on fake tensors and a fake process group, and the planner's.

    Example:
        >>> from trainopt_site.perf.planner.checks import traced_fsdp_peak
        >>> result = traced_fsdp_peak(world_size=2, batch=4, seq_len=64, preset="tiny")
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
            _step(model, optimizer, data)  # the optimizer state appears: not the steady state
            tracker = FSDPMemTracker(model, optimizer)
            tracker.track_inputs(data)
            with tracker:
                _step(model, optimizer, data)
            traced = max(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
        planned = _planned(model, config, batch, seq_len, Layout(dp=world_size, zero=3))
    finally:
        dist.destroy_process_group()
    return {"traced": int(traced), "planned": int(planned)}


class _SplitHeadsBlock(nn.Module):
    """A pre-norm GPT block whose q, k, v are separate matmuls, each of heads of 64: what
    tensor parallelism splits by heads (``trainopt.models.GPT`` fuses them into one)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm_1, self.norm_2 = nn.LayerNorm(width, bias=False), nn.LayerNorm(width, bias=False)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.fc = nn.Linear(width, 4 * width, bias=False)
        self.proj = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        h = self.norm_1(x)
        q, k, v = (m(h).view(batch, seq, -1, 64).transpose(1, 2) for m in (self.q, self.k, self.v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(batch, seq, -1))
        gelu = torch.nn.functional.gelu(self.fc(self.norm_2(x)), approximate="tanh")
        return x + self.proj(gelu)


class _SplitHeadsLM(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(_SplitHeadsBlock(width) for _ in range(layers))
        self.norm = nn.LayerNorm(width, bias=False)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embedding(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def traced_tensor_parallel_peak(
    world_size: int = 4, batch: int = 8, seq_len: int = 256, width: int = 256, layers: int = 4
) -> dict[str, int]:
    """One tensor-parallel rank's peak on fake tensors and a fake process group, and the
    planner's (no sequence parallelism: the norms and block inputs stay whole).

    Each block's q, k, v and first feed-forward matmul are split by columns
    (``ColwiseParallel``), its output projections by rows (``RowwiseParallel``); the small
    vocabulary (64) keeps the embedding and the loss, which stay whole, under 1 % of the peak.
    torch's ``MemTracker`` counts the step.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    vocab = 64
    plan_of_block = {
        **{name: ColwiseParallel() for name in ("q", "k", "v", "fc")},
        **{name: RowwiseParallel() for name in ("o", "proj")},
    }
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        with FakeTensorMode():
            model = _SplitHeadsLM(vocab, width, layers)
            for block in model.blocks:
                parallelize_module(block, mesh, plan_of_block)
            # foreach kernels refuse a mix of DTensors and plain tensors: one tensor at a time
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
            data = tuple(torch.randint(0, vocab, (batch, seq_len)) for _ in "xy")
            _step(model, optimizer, data)
            tracker = MemTracker()
            tracker.track_external(model, optimizer, *data)
            with tracker:
                _step(model, optimizer, data)
            traced = max(snap["Total"] for snap in tracker.get_tracker_snapshot("peak").values())
        shape = ModelShape.from_module(model, seq_len=seq_len, heads=width // 64)
        training = Training(micro_batch=batch, precision="fp32", optimizer_kernels="fused")
        layout = Layout(tp=world_size, sequence_parallel=False)
        planned = memory_per_gpu(shape, training, layout).peak
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


TRACED_CASES: tuple[dict[str, Any], ...] = (
    {"world_size": 4, "batch": 8, "seq_len": 256, "preset": "small"},
    {"world_size": 4, "batch": 1, "seq_len": 256, "preset": "small"},
    {"world_size": 8, "batch": 2, "seq_len": 128, "preset": "small"},
)
"""The FSDP2 traces: activations most of the peak, the model states most of it, more ranks."""

TP_CASES: tuple[dict[str, Any], ...] = (
    {"world_size": 4, "batch": 8, "seq_len": 256},
    {"world_size": 2, "batch": 2, "seq_len": 128},
)
"""The tensor-parallel traces (a 4-block model of width 256 and vocabulary 64)."""


def record(path: str | Path) -> dict[str, Any]:
    """Run every check and write the results, with the machine they ran on, as JSON."""
    traced = [{**case, **traced_fsdp_peak(**case)} for case in TRACED_CASES]
    tensor_parallel = [{**case, **traced_tensor_parallel_peak(**case)} for case in TP_CASES]
    measured = launch(measured_peaks, 2, backend="gloo", timeout=300)
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
        f"torch {torch.__version__}",
        "traced_fsdp2": traced,
        "traced_tensor_parallel": tensor_parallel,
        "measured_gloo_2_ranks": [
            {"rank": rank, "wrap": wrap, **values}
            for rank, per_rank in enumerate(measured)
            for wrap, values in per_rank.items()
        ],
    }
    Path(path).write_text(json.dumps(result, indent=1) + "\n")
    return result


def checks_table(path: str | Path) -> str:
    """The recorded checks as one Markdown table, in MiB, with the error of each."""
    data = json.loads(Path(path).read_text())
    lines = [
        "| check | case | reference | planner | error |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for row in data["traced_fsdp2"]:
        case = f"FSDP2, {row['world_size']} ranks, batch {row['batch']} × {row['seq_len']}"
        lines.append(_row("traced (fake PG)", case, row["traced"], row["planned"]))
    for row in data["traced_tensor_parallel"]:
        case = f"TP, {row['world_size']} ranks, batch {row['batch']} × {row['seq_len']}"
        lines.append(_row("traced (fake PG)", case, row["traced"], row["planned"]))
    for row in data["measured_gloo_2_ranks"]:
        case = f"{row['wrap'].upper()}, gloo rank {row['rank']} of 2, batch 4 × 128"
        lines.append(_row("measured (CPU)", case, row["measured"], row["planned"]))
    return (
        "\n".join(lines)
        + f"\n\nRecorded on {data['machine']}, in fp32: GPT `small` for FSDP2 and the \
measured steps, a 4-block model of width 256 with separate q, k, v for TP.\n"
    )


def _row(check: str, case: str, reference: int, planned: int) -> str:
    return (
        f"| {check} | {case} | {reference / 2**20:,.2f} MiB | {planned / 2**20:,.2f} MiB | "
        f"{planned / reference - 1:+.2%} |"
    )
