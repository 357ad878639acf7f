"""What the planner is asked about: the training run, the parallel layout and the cluster.

- :class:`Training`: micro-batch, global batch, precision, optimizer and activation
  checkpointing.
- :class:`Layout`: the degrees of data (with a ZeRO stage), tensor, pipeline and context
  parallelism. Ranks are laid out tensor-parallel innermost, then context, then pipeline, then
  data, as Megatron-LM and torchtitan place them, so that the most talkative group shares a node.
- :class:`Cluster`: GPU memory, peak FLOP/s, bandwidth inside and between nodes, GPUs per node.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainopt.perf.bench.mfu import gpu_table
from trainopt.perf.estimate import OPTIMIZER_STATE_BYTES
from trainopt.validation import check_int


@dataclass(frozen=True)
class PrecisionBytes:
    """Bytes per parameter and per activation value of one training precision.

    Example:
        >>> from trainopt.perf.planner.layout import PRECISIONS
        >>> bf16 = PRECISIONS["bf16"]
        >>> bf16.weights + bf16.gradients + bf16.master_weights  # + 8 bytes of AdamW state: 16
        8
    """

    weights: int
    gradients: int
    master_weights: int
    activations: int
    peak: str  # the row of the GPU table's peaks that its matmuls run at


PRECISIONS: dict[str, PrecisionBytes] = {
    "fp32": PrecisionBytes(weights=4, gradients=4, master_weights=0, activations=4, peak="fp32"),
    # mixed precision as ZeRO counts it: 16-bit weights and gradients, fp32 master weights
    "bf16": PrecisionBytes(weights=2, gradients=2, master_weights=4, activations=2, peak="bf16"),
    # fp8 matmuls (Transformer Engine, torchao's float8): the same state as bf16
    "fp8": PrecisionBytes(weights=2, gradients=2, master_weights=4, activations=2, peak="fp8"),
}
"""The precisions the planner knows, with their bytes per parameter and per activation."""

CHECKPOINTING: tuple[str, ...] = ("none", "full")


def _choice(owner: str, field: str, value: str, allowed: list[str] | tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{owner}.{field} must be one of {list(allowed)}, got {value!r}")


@dataclass(frozen=True)
class Training:
    """The training step: batch, precision, optimizer, checkpointing.

    Args:
        micro_batch: Sequences per GPU per forward-backward pass.
        global_batch: Sequences per optimizer step over all GPUs (default: one micro-batch
            per data-parallel rank); the rest is gradient accumulation or pipeline micro-batches.
        precision: ``"fp32"``, ``"bf16"`` (mixed: 16-bit weights and gradients, fp32 master
            weights and optimizer state) or ``"fp8"`` (bf16's state, fp8 matmuls).
        optimizer: An optimizer of :data:`~trainopt.perf.estimate.OPTIMIZER_STATE_BYTES`.
        checkpointing: ``"none"`` or ``"full"`` (each block keeps only its input and is
            recomputed in backward).
        optimizer_kernels: ``"foreach"`` (torch's default on a GPU: one temporary copy of the
            parameters in the step) or ``"fused"`` (none).

    Example:
        >>> from trainopt.perf.planner import Training
        >>> Training(micro_batch=2, precision="bf16").precision_bytes.master_weights
        4
    """

    micro_batch: int = 1
    global_batch: int | None = None
    precision: str = "bf16"
    optimizer: str = "adamw"
    checkpointing: str = "none"
    optimizer_kernels: str = "foreach"

    def __post_init__(self) -> None:
        check_int("micro_batch", self.micro_batch, 1, owner="Training")
        check_int("global_batch", self.global_batch, 1, none_ok=True, owner="Training")
        _choice("Training", "precision", self.precision, list(PRECISIONS))
        _choice("Training", "optimizer", self.optimizer, sorted(OPTIMIZER_STATE_BYTES))
        _choice("Training", "checkpointing", self.checkpointing, CHECKPOINTING)
        _choice("Training", "optimizer_kernels", self.optimizer_kernels, ("foreach", "fused"))

    @property
    def precision_bytes(self) -> PrecisionBytes:
        """Bytes per parameter and activation of :attr:`precision`."""
        return PRECISIONS[self.precision]


@dataclass(frozen=True)
class Layout:
    """A parallel layout: ``dp × tp × pp × cp`` GPUs.

    Args:
        dp: Data-parallel degree (replicas, or shards under ZeRO).
        zero: 0 (DDP: everything replicated), 1 (optimizer state sharded over ``dp``),
            2 (also gradients), 3 (also weights: FSDP's full sharding).
        tp: Tensor-parallel degree (Megatron's column/row split, with sequence parallelism).
        pp: Pipeline stages (1F1B schedule).
        cp: Context-parallel degree (the sequence split, keys and values all-gathered).
        sequence_parallel: With ``tp``, the norms and residual stream are split over the
            sequence too (Megatron-LM's sequence parallelism); without it they are whole on
            every tensor-parallel rank.

    Example:
        >>> from trainopt.perf.planner import Layout
        >>> layout = Layout(dp=8, zero=3, tp=8)
        >>> layout.gpus, layout.name
        (64, 'FSDP 8 × TP 8')
    """

    dp: int = 1
    zero: int = 0
    tp: int = 1
    pp: int = 1
    cp: int = 1
    sequence_parallel: bool = True

    def __post_init__(self) -> None:
        for field in ("dp", "tp", "pp", "cp"):
            check_int(field, getattr(self, field), 1, owner="Layout")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"Layout.zero must be one of [0, 1, 2, 3], got {self.zero!r}")

    @property
    def gpus(self) -> int:
        """GPUs the layout uses."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def name(self) -> str:
        """A short name: ``"1 GPU"``, ``"DDP 8"``, ``"FSDP 8 × TP 8 × PP 2"``."""
        if self.gpus == 1:
            return "1 GPU"
        data = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "FSDP"}[self.zero]
        parts = [f"{data} {self.dp}"] if self.dp > 1 else []
        parts += [
            f"{k} {v}" for k, v in (("TP", self.tp), ("PP", self.pp), ("CP", self.cp)) if v > 1
        ]
        return " × ".join(parts)


INTER_NODE_GB_PER_S = 50.0
"""Bandwidth between nodes per GPU and direction, by default: one 400 Gb/s InfiniBand or
RoCE port per GPU, as in NVIDIA's DGX H100 and DGX B200 (eight ConnectX-7 ports)."""


@dataclass(frozen=True)
class Cluster:
    """The GPUs: memory, peak FLOP/s per precision, bandwidth inside and between nodes.

    Args:
        gpus: GPUs in all.
        memory_gb: Memory per GPU, in GB (10⁹ bytes, as data sheets count).
        peak_tflops: Dense peak TFLOP/s by precision (``"fp32"``, ``"bf16"``, ``"fp8"``).
        intra_node_gb_per_s: Bandwidth per GPU and direction inside a node (NVLink).
        inter_node_gb_per_s: Bandwidth per GPU and direction between nodes.
        gpus_per_node: GPUs that share the fast link.
        name: What to call it.

    Example:
        >>> from trainopt.perf.planner import Cluster
        >>> cluster = Cluster.of("H100 SXM", gpus=64)
        >>> cluster.memory_gb, cluster.peak_tflops["bf16"], cluster.gpus_per_node
        (80, 989.4, 8)
    """

    gpus: int
    memory_gb: float
    peak_tflops: dict[str, float]
    intra_node_gb_per_s: float
    inter_node_gb_per_s: float = INTER_NODE_GB_PER_S
    gpus_per_node: int = 8
    name: str = "custom"

    def __post_init__(self) -> None:
        check_int("gpus", self.gpus, 1, owner="Cluster")
        check_int("gpus_per_node", self.gpus_per_node, 1, owner="Cluster")
        for field in ("memory_gb", "intra_node_gb_per_s", "inter_node_gb_per_s"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"Cluster.{field} must be a positive number, got {value!r}")

    @classmethod
    def of(cls, gpu: str, gpus: int, **overrides: object) -> Cluster:
        """A cluster of ``gpus`` GPUs of one row of the GPU table (``gpus.json``)."""
        rows = {row["name"]: row for row in gpu_table()}
        if gpu not in rows:
            raise ValueError(f"gpu must be one of {list(rows)}, got {gpu!r}")
        row = rows[gpu]
        settings: dict[str, object] = dict(
            gpus=gpus,
            memory_gb=row["memory_gb"],
            peak_tflops=dict(row["peak_tflops"]),
            intra_node_gb_per_s=row["scale_up_gb_per_s"],
            gpus_per_node=row["gpus_per_node"],
            name=gpu,
        )
        return cls(**{**settings, **overrides})

    @property
    def memory_bytes(self) -> float:
        """Memory per GPU in bytes."""
        return self.memory_gb * 1e9

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s of ``precision``'s matmuls on one GPU."""
        key = PRECISIONS[precision].peak
        if key not in self.peak_tflops:
            raise ValueError(
                f"{self.name} has no {key} peak (it has {sorted(self.peak_tflops)}); "
                f"choose another precision"
            )
        return self.peak_tflops[key] * 1e12
