"""Step time of a layout: compute at an assumed share of the peak, communication at the link's
bandwidth, the pipeline bubble, and what overlaps.

The assumptions, each a parameter:

- **Compute** runs at ``compute_efficiency`` of the dense peak of the precision (the model's
  FLOPs, :meth:`ModelShape.flops_per_token`, plus one more forward under full checkpointing).
  0.5 by default: the achieved model FLOPs utilisation of well-tuned large runs on H100s is
  38-43 % (Llama 3 paper, table 4) with communication and the bubble included.
- **Bandwidth**: a group that fits in a node (ranks laid out tensor-parallel innermost, then
  context, pipeline and data) runs at the node's link (NVLink, Infinity Fabric); any other at
  the network's, per GPU.
- **Overlap**: data-parallel collectives (DDP's bucketed all-reduce, FSDP's prefetched
  all-gathers) hide behind compute up to the compute time; tensor-, context- and pipeline-
  parallel transfers sit on the critical path.
- **Bubble**: the 1F1B schedule idles ``(pp - 1) / m`` of the pipeline's busy time
  (Narayanan et al. 2021, section 2.2.1), with ``m`` micro-batches per step.
- Model FLOPs utilisation is :func:`trainopt.perf.bench.mfu.mfu`, the one definition.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainopt.perf.bench.mfu import mfu
from trainopt.perf.planner.collectives import Collective, communication_per_step
from trainopt.perf.planner.layout import Cluster, Layout, Training
from trainopt.perf.planner.memory import micro_batches
from trainopt.perf.planner.shape import ModelShape

COMPUTE_EFFICIENCY = 0.5
"""The share of the dense peak that the matmuls of a step reach, by default."""


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step, split, with its throughput and the assumptions behind it.

    Example:
        >>> from trainopt.perf.planner import Cluster, Layout, Training, step_time
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> t = step_time(PRESETS["llama3-8b"], Training(global_batch=64), Layout(pp=8),
        ...               Cluster.of("H100 SXM", 8))
        >>> t.seconds == t.compute + t.exposed_communication + t.bubble
        True
    """

    seconds: float
    compute: float
    exposed_communication: float
    bubble: float
    tokens_per_second_per_gpu: float
    mfu: float
    assumptions: dict[str, object] = field(default_factory=dict)


def group_bandwidth(dimension: str, layout: Layout, cluster: Cluster) -> float:
    """Bytes/s per GPU of a ``dimension``'s group: the node's link if the group fits in a node.

    Example:
        >>> from trainopt.perf.planner import Cluster, Layout
        >>> from trainopt.perf.planner.step_time import group_bandwidth
        >>> cluster = Cluster.of("H100 SXM", gpus=64)
        >>> layout = Layout(dp=8, tp=8)
        >>> [group_bandwidth(dim, layout, cluster) / 1e9 for dim in ("tp", "dp")]
        [450.0, 50.0]
    """
    span = {"tp": layout.tp, "cp": layout.tp * layout.cp}
    span["pp"] = span["cp"] * layout.pp
    span["dp"] = span["pp"] * layout.dp
    fits = span[dimension] <= cluster.gpus_per_node
    return (cluster.intra_node_gb_per_s if fits else cluster.inter_node_gb_per_s) * 1e9


def step_time(
    shape: ModelShape,
    training: Training,
    layout: Layout,
    cluster: Cluster,
    compute_efficiency: float = COMPUTE_EFFICIENCY,
    collectives: list[Collective] | None = None,
) -> StepTime:
    """Seconds per optimizer step of ``layout`` on ``cluster`` under the stated assumptions.

    Example:
        >>> from trainopt.perf.planner import Cluster, Layout, Training, step_time
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> cluster = Cluster.of("H100 SXM", gpus=8)
        >>> t = step_time(PRESETS["llama3-8b"], Training(micro_batch=1, global_batch=64),
        ...               Layout(dp=8, zero=3), cluster)
        >>> round(t.mfu, 2)  # compute-bound: the assumed efficiency
        0.5
    """
    if not 0 < compute_efficiency <= 1:
        raise ValueError(f"compute_efficiency must be in (0, 1], got {compute_efficiency!r}")
    m = micro_batches(training, layout)
    tokens = m * training.micro_batch * shape.seq_len * layout.dp  # per step, all GPUs
    model_flops = shape.flops_per_token() * tokens / layout.gpus
    recompute = 8 / 6 if training.checkpointing == "full" else 1.0
    peak = cluster.peak_flops(training.precision)
    compute = model_flops * recompute / (peak * compute_efficiency)
    collectives = (
        communication_per_step(shape, training, layout) if collectives is None else collectives
    )
    hidden_dp = 0.0
    critical = 0.0
    for c in collectives:
        seconds = c.bytes_per_gpu / group_bandwidth(c.dimension, layout, cluster)
        if c.overlapped:
            hidden_dp += seconds
        else:
            critical += seconds
    busy = compute + critical
    bubble = busy * (layout.pp - 1) / m
    exposed = critical + max(0.0, hidden_dp - compute)
    seconds = compute + exposed + bubble
    per_gpu = tokens / layout.gpus / seconds
    return StepTime(
        seconds=seconds,
        compute=compute,
        exposed_communication=exposed,
        bubble=bubble,
        tokens_per_second_per_gpu=per_gpu,
        mfu=mfu(shape.flops_per_token(), per_gpu, peak),
        assumptions={
            "compute_efficiency": compute_efficiency,
            "peak_tflops": peak / 1e12,
            "intra_node_gb_per_s": cluster.intra_node_gb_per_s,
            "inter_node_gb_per_s": cluster.inter_node_gb_per_s,
            "overlap": "data-parallel collectives hidden behind compute; TP, CP, PP exposed",
            "schedule": "1F1B" if layout.pp > 1 else "no pipeline",
        },
    )
