"""Data-parallel training on ``torch.distributed``: the code of the Distributed Training page.

Everything here calls torch's own machinery; nothing sends bytes by itself.

- :mod:`~trainopt.perf.distributed.processes`: start local process groups (gloo on a CPU, NCCL
  on GPUs) the way ``torchrun`` would.
- :mod:`~trainopt.perf.distributed.ddp`: ``DistributedDataParallel`` with its buckets and
  communication hooks, and gradient sync on/off for accumulation.
- :mod:`~trainopt.perf.distributed.fsdp`: FSDP2 sharding and the ZeRO memory formula.
- :mod:`~trainopt.perf.distributed.loss`: a token loss normalised by the global token count,
  exact under accumulation and across ranks whatever the padding.
- :mod:`~trainopt.perf.distributed.checkpoint`: sharded checkpoints
  (``torch.distributed.checkpoint``).
- :mod:`~trainopt.perf.distributed.agreement`: decisions that must be the same on every rank.
- :mod:`~trainopt.perf.distributed.checks` and :mod:`~trainopt.perf.distributed.compression`:
  the page's multi-process checks, which train one way on several ranks and one way in one
  process and return the differences (``launch(ddp_check, 2)``).
"""

from trainopt.perf.distributed.agreement import (
    GradientScaleError,
    any_rank,
    broadcast_from_rank0,
    check_gradient_scale,
    step_unless_any_rank_nonfinite,
)
from trainopt.perf.distributed.checkpoint import load_sharded, save_sharded
from trainopt.perf.distributed.ddp import (
    gradient_sync,
    register_comm_hook,
    wrap_ddp,
)
from trainopt.perf.distributed.fsdp import fsdp2_available, memory_per_rank, shard_model
from trainopt.perf.distributed.loss import global_token_count, token_normalized_loss
from trainopt.perf.distributed.processes import (
    WorkerError,
    init_from_env,
    launch,
    rank_and_world_size,
    single_process_group,
)

__all__ = [
    "GradientScaleError",
    "WorkerError",
    "any_rank",
    "broadcast_from_rank0",
    "check_gradient_scale",
    "fsdp2_available",
    "global_token_count",
    "gradient_sync",
    "init_from_env",
    "launch",
    "load_sharded",
    "memory_per_rank",
    "rank_and_world_size",
    "register_comm_hook",
    "save_sharded",
    "shard_model",
    "single_process_group",
    "step_unless_any_rank_nonfinite",
    "token_normalized_loss",
    "wrap_ddp",
]
