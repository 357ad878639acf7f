"""Performance: the code of the Advanced Performance pages.

- :mod:`~trainopt.perf.precision` and :mod:`~trainopt.perf.rounding`: fp32, tf32, bf16 or fp16 by
  one name, and stochastic rounding to bf16 (mixed precision page).
- :mod:`~trainopt.perf.memory`, :mod:`~trainopt.perf.estimate`, :mod:`~trainopt.perf.peak` and
  :mod:`~trainopt.perf.cross_entropy`: activation checkpointing, memory per phase, snapshots, the
  memory estimate, the peak of a step measured on any device, and the chunked cross-entropy
  (memory page); :mod:`~trainopt.perf.traced_estimate`: the estimate of any model, traced on fake
  tensors.
- :mod:`~trainopt.perf.profiling`: torch.profiler and step timing (profiling page).
- :mod:`~trainopt.perf.throughput` and :mod:`~trainopt.perf.updates`: tokens/s, step-time
  percentiles, MFU and alerts; update-to-weight ratios per layer (monitoring page).
- :mod:`~trainopt.perf.compilation`: graph breaks, recompiles, regional compilation and
  compile time against step time (compilation page).
- :mod:`trainopt.perf.distributed`: DDP, FSDP2, rank agreement and the distributed page's checks.
- :mod:`trainopt.perf.bench`: the benchmark harness, its timer, MFU definition and GPU table,
  results files and their plain summary, and its command line (benchmarking page).
- :mod:`trainopt.perf.planner`: the layout planner, memory per GPU, communication and step time
  of parallel layouts, and its command line (layout planner page).
"""

from trainopt.perf.bench.mfu import mfu
from trainopt.perf.cross_entropy import chunked_linear_cross_entropy
from trainopt.perf.estimate import (
    MemoryEstimate,
    estimate_training_memory,
    gpt_activation_bytes,
    optimizer_state_bytes,
)
from trainopt.perf.memory import (
    MemoryTracker,
    PhaseMemory,
    allocator_settings,
    apply_activation_checkpointing,
    expandable_segments_in_use,
    record_memory_history,
    saved_activation_bytes,
)
from trainopt.perf.peak import LiveStorageTracker, measure_peak_memory
from trainopt.perf.planner import (
    Cluster,
    Layout,
    ModelShape,
    Training,
    communication_per_step,
    memory_per_gpu,
    plan,
    rank_layouts,
    step_time,
)
from trainopt.perf.precision import (
    MatmulSettings,
    Precision,
    PrecisionNotSupportedError,
    check_supported,
    make_scaler,
    native_bf16_supported,
    supported_precisions,
)
from trainopt.perf.profiling import (
    LoaderWait,
    StepProfiler,
    StepTimer,
    percentile,
    profile_steps,
)
from trainopt.perf.rounding import stochastic_round_to_bf16
from trainopt.perf.throughput import (
    MemoryNearLimitAlert,
    ThroughputDropAlert,
    ThroughputMonitor,
    read_jsonl,
)
from trainopt.perf.traced_estimate import DataDependentShapeError, estimate_step_memory
from trainopt.perf.updates import UpdateRatioMonitor

__all__ = [
    "Cluster",  # planner: the GPUs
    "DataDependentShapeError",
    "Layout",  # planner: a parallel layout
    "LoaderWait",  # profiling: the data-loader wait
    "LiveStorageTracker",
    "MatmulSettings",
    "MemoryEstimate",
    "MemoryNearLimitAlert",
    "MemoryTracker",
    "ModelShape",  # planner: a transformer's shape
    "PhaseMemory",
    "Precision",
    "PrecisionNotSupportedError",
    "StepProfiler",
    "StepTimer",
    "ThroughputDropAlert",
    "ThroughputMonitor",
    "Training",  # planner: the training step
    "UpdateRatioMonitor",
    "allocator_settings",
    "apply_activation_checkpointing",
    "check_supported",
    "chunked_linear_cross_entropy",
    "communication_per_step",
    "estimate_step_memory",
    "estimate_training_memory",
    "expandable_segments_in_use",
    "gpt_activation_bytes",
    "make_scaler",
    "measure_peak_memory",
    "memory_per_gpu",
    "mfu",
    "native_bf16_supported",
    "optimizer_state_bytes",
    "percentile",
    "plan",
    "profile_steps",
    "rank_layouts",
    "read_jsonl",
    "record_memory_history",
    "saved_activation_bytes",
    "step_time",
    "stochastic_round_to_bf16",
    "supported_precisions",
]
