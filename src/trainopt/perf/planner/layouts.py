"""Plan one layout, or every layout of a cluster, ranked: the planner's front door.

:func:`plan` puts the three estimates of one layout together (memory by part, communication by
collective, step time) and says whether it fits. :func:`rank_layouts` tries every combination
of data parallelism (DDP, ZeRO-1/2/3), tensor, pipeline and context parallelism that uses the
cluster's GPUs, with and without activation checkpointing, and returns the plans that fit,
fastest first.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from trainopt.perf.planner.collectives import Collective, communication_per_step
from trainopt.perf.planner.layout import Cluster, Layout, Training
from trainopt.perf.planner.memory import MemoryPerGPU, memory_per_gpu
from trainopt.perf.planner.shape import ModelShape
from trainopt.perf.planner.step_time import COMPUTE_EFFICIENCY, StepTime, step_time

USABLE_MEMORY = 0.9
"""The share of a GPU's memory a plan may fill: the CUDA context, the allocator's caching and
fragmentation, and the libraries' workspaces take the rest."""


@dataclass(frozen=True)
class Plan:
    """One layout's estimates: memory per GPU, communication, step time, and whether it fits.

    Example:
        >>> from trainopt.perf.planner import Cluster, Layout, Training, plan
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> p = plan(PRESETS["llama3-1b"], Training(checkpointing="full"), Layout(),
        ...          Cluster.of("H100 SXM", 1))
        >>> p.name, p.fits
        ('1 GPU + checkpointing', True)
    """

    layout: Layout
    training: Training
    memory: MemoryPerGPU
    communication: list[Collective]
    time: StepTime
    fits: bool

    @property
    def name(self) -> str:
        """The layout's name, with ``+ checkpointing`` when it recomputes."""
        suffix = " + checkpointing" if self.training.checkpointing == "full" else ""
        return self.layout.name + suffix


def plan(
    shape: ModelShape,
    training: Training,
    layout: Layout,
    cluster: Cluster,
    compute_efficiency: float = COMPUTE_EFFICIENCY,
    usable_memory: float = USABLE_MEMORY,
) -> Plan:
    """Memory, communication and step time of ``shape`` trained as ``training`` under ``layout``.

    Example:
        >>> from trainopt.perf.planner import Cluster, Layout, Training, plan
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> one = plan(PRESETS["llama3-8b"], Training(micro_batch=1), Layout(),
        ...            Cluster.of("H100 SXM", 1))
        >>> one.fits, round(one.memory.parts["optimizer_states"] / 1e9)  # 12 bytes × 8.03B
        (False, 96)
    """
    if layout.gpus > cluster.gpus:
        raise ValueError(f"layout needs {layout.gpus} GPUs, the cluster has {cluster.gpus}")
    memory = memory_per_gpu(shape, training, layout)
    collectives = communication_per_step(shape, training, layout)
    time = step_time(shape, training, layout, cluster, compute_efficiency, collectives)
    fits = memory.peak <= usable_memory * cluster.memory_bytes
    return Plan(layout, training, memory, collectives, time, fits)


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def candidate_layouts(shape: ModelShape, gpus: int, gpus_per_node: int) -> list[Layout]:
    """Every layout of ``gpus`` GPUs: TP up to a node and dividing the heads, PP up to the
    layers, CP dividing the sequence, and ZeRO stages 0-3 where there is data parallelism.

    Example:
        >>> from trainopt.perf.planner.layouts import candidate_layouts
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> sorted({l.name for l in candidate_layouts(PRESETS["llama3-8b"], 2, 8)})
        ['CP 2', 'DDP 2', 'FSDP 2', 'PP 2', 'TP 2', 'ZeRO-1 2', 'ZeRO-2 2']
    """
    out = []
    for tp, pp, cp in itertools.product(
        _powers_of_two(min(gpus_per_node, shape.heads)),
        _powers_of_two(min(shape.layers, 64)),
        _powers_of_two(min(16, shape.seq_len)),
    ):
        if gpus % (tp * pp * cp) or shape.heads % tp or shape.seq_len % cp:
            continue
        dp = gpus // (tp * pp * cp)
        for zero in (0, 1, 2, 3) if dp > 1 else (0,):
            out.append(Layout(dp=dp, zero=zero, tp=tp, pp=pp, cp=cp))
    return out


def rank_layouts(
    shape: ModelShape,
    training: Training,
    cluster: Cluster,
    *,
    checkpointing: tuple[str, ...] = ("none", "full"),
    compute_efficiency: float = COMPUTE_EFFICIENCY,
    usable_memory: float = USABLE_MEMORY,
) -> list[Plan]:
    """The layouts of all the cluster's GPUs that fit, fastest first.

    ``training.global_batch`` (default: one micro-batch per GPU) stays fixed: a layout whose
    data-parallel ranks can't split it into whole micro-batches is left out.

    Example:
        >>> from trainopt.perf.planner import Cluster, Training, rank_layouts
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> plans = rank_layouts(PRESETS["llama3-8b"], Training(micro_batch=1, global_batch=512),
        ...                      Cluster.of("H100 SXM", gpus=64))
        >>> plans[0].fits and plans[0].time.seconds <= plans[-1].time.seconds
        True
    """
    global_batch = training.global_batch or training.micro_batch * cluster.gpus
    plans = []
    for layout in candidate_layouts(shape, cluster.gpus, cluster.gpus_per_node):
        if global_batch % (training.micro_batch * layout.dp):
            continue
        for recompute in checkpointing:
            run = replace(training, global_batch=global_batch, checkpointing=recompute)
            candidate = plan(shape, run, layout, cluster, compute_efficiency, usable_memory)
            if candidate.fits:
                plans.append(candidate)
    return sorted(plans, key=_rank_key)


def _rank_key(candidate: Plan) -> tuple[float, int, int]:
    """Fastest first; between equally fast plans, the one with fewer parallel dimensions and
    the lower ZeRO stage (less to set up and to debug), then the one with less memory."""
    layout = candidate.layout
    dimensions = (layout.tp > 1) + (layout.pp > 1) + (layout.cp > 1)
    recompute = candidate.training.checkpointing == "full"
    return (
        round(candidate.time.seconds, 9),
        4 * dimensions + layout.zero + recompute,
        candidate.memory.peak,
    )
