"""Performance: the code of the Advanced Performance pages.

- :mod:`~trainopt.perf.precision`: fp32, tf32, bf16 or fp16 by one name (mixed precision page).
- :mod:`~trainopt.perf.memory` and :mod:`~trainopt.perf.estimate`: activation checkpointing,
  memory per phase, snapshots, and the memory estimate (memory page).
- :mod:`~trainopt.perf.profiling`: torch.profiler and step timing (profiling page).
- :mod:`~trainopt.perf.throughput`: tokens/s, step-time percentiles, MFU and alerts (monitoring page).
- :mod:`trainopt.perf.distributed`: DDP, FSDP2, rank agreement and the distributed page's checks.
- :mod:`trainopt.perf.bench`: the benchmark harness, its results files and its command line
  (benchmarking page).
"""

from trainopt.perf.estimate import (
    MemoryEstimate,
    bytes_per_parameter,
    estimate_training_memory,
    gpt_activation_bytes,
)
from trainopt.perf.memory import (
    MemoryTracker,
    PhaseMemory,
    allocator_settings,
    apply_activation_checkpointing,
    expandable_segments_in_use,
    record_memory_history,
    remove_activation_checkpointing,
    saved_activation_bytes,
)
from trainopt.perf.precision import (
    PRECISIONS,
    MatmulSettings,
    Precision,
    PrecisionNotSupportedError,
    check_supported,
    make_scaler,
    supported_precisions,
)
from trainopt.perf.profiling import (
    StepProfiler,
    StepTimer,
    percentile,
    profile_steps,
    summarize,
)
from trainopt.perf.throughput import (
    MemoryNearLimitAlert,
    ThroughputDropAlert,
    ThroughputMonitor,
    mfu,
    read_jsonl,
)

__all__ = [
    "PRECISIONS", "MatmulSettings", "MemoryEstimate", "MemoryNearLimitAlert", "MemoryTracker",
    "PhaseMemory", "Precision", "PrecisionNotSupportedError", "StepProfiler", "StepTimer",
    "ThroughputDropAlert", "ThroughputMonitor", "allocator_settings", "apply_activation_checkpointing",
    "bytes_per_parameter", "check_supported", "estimate_training_memory", "expandable_segments_in_use",
    "gpt_activation_bytes", "make_scaler", "mfu", "percentile", "profile_steps", "read_jsonl",
    "record_memory_history", "remove_activation_checkpointing", "saved_activation_bytes",
    "summarize", "supported_precisions",
]
