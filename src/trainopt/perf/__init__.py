"""Performance tools: precision, memory, profiling, monitoring, benchmarks and distributed training.

Each submodule holds one concept:

- :mod:`trainopt.perf.precision` sets up fp32, tf32, bf16 or fp16 (autocast, TF32 matmul
  settings, a loss scaler only for fp16).
- :mod:`trainopt.perf.memory` applies activation checkpointing, reports memory per phase of a
  step, estimates training memory and records CUDA memory snapshots.
- :mod:`trainopt.perf.profiling` wraps :mod:`torch.profiler` and times steps with CUDA events.
- :mod:`trainopt.perf.throughput` tracks tokens/s, step-time percentiles, MFU and memory.
- :mod:`trainopt.perf.experiments` measures all of the above on the reference GPT.
- :mod:`trainopt.perf.bench` runs benchmark matrices (``python -m trainopt.bench``);
  :mod:`trainopt.perf.bench_report` renders their results; :mod:`trainopt.perf.stability_bench`
  measures the cost of the stability stack.
- :mod:`trainopt.perf.distributed` wraps DDP and FSDP2 and launches local process groups;
  :mod:`trainopt.perf.distributed_consistency` keeps decisions the same on every rank.
"""
