"""Training stability: the code of the Training Stability page, a subpackage per concern.

- :mod:`~trainopt.stability.clipping`: gradient clipping by global norm, by history
  (:mod:`~trainopt.stability.clipping.norms`), unit-wise
  (:mod:`~trainopt.stability.clipping.unitwise`).
- :mod:`~trainopt.stability.scaling`: dynamic loss scaling
  (:mod:`~trainopt.stability.scaling.scaler`, :mod:`~trainopt.stability.scaling.kernels`).
- :mod:`~trainopt.stability.skipping`: skipping a step on the device
  (:mod:`~trainopt.stability.skipping.step`); which optimizers a step can be skipped for
  exactly (:mod:`~trainopt.stability.skipping.optimizers`); the buffers (BatchNorm's
  statistics) a skip puts back (:mod:`~trainopt.stability.skipping.buffers`); a schedule that
  skipped steps do not advance (:mod:`~trainopt.stability.skipping.schedule`); an EMA that
  skips them too (:mod:`~trainopt.stability.skipping.averaging`).
- :mod:`~trainopt.stability.monitoring`: loss and gradient monitors
  (:mod:`~trainopt.stability.monitoring.loss`, :mod:`~trainopt.stability.monitoring.gradients`)
  on robust statistics (:mod:`~trainopt.stability.monitoring.statistics`), both in one pass
  (:mod:`~trainopt.stability.monitoring.checker`).
- :mod:`~trainopt.stability.checkpointing`: crash-safe, all-or-nothing checkpoints of
  everything a run depends on (:mod:`~trainopt.stability.checkpointing.checkpoint`,
  :mod:`~trainopt.stability.checkpointing.files`, :mod:`~trainopt.stability.checkpointing.fit`),
  the random generators (:mod:`~trainopt.stability.checkpointing.rng`), the position in the
  data (:mod:`~trainopt.stability.checkpointing.loader`) and each rank's part of the
  stabilizer's state (:mod:`~trainopt.stability.checkpointing.rank_state`).
- :mod:`~trainopt.stability.recovery`: roll back and lower the learning rate
  (:mod:`~trainopt.stability.recovery.rollback`), a cut the schedule keeps
  (:mod:`~trainopt.stability.recovery.rates`).
- :mod:`~trainopt.stability.config`: the settings, grouped (:class:`Detection`,
  :class:`Rollback`).
- :mod:`~trainopt.stability.core` and :mod:`~trainopt.stability.stabilizer`: all of the above
  in one training step, with no host sync; :mod:`~trainopt.stability.distributed`: every
  decision agreed over the ranks.
- :mod:`~trainopt.stability.recipe`: the page's complete recipe as a command that resumes.
- :mod:`~trainopt.stability.logits`: z-loss and QK-norm, which keep a large model's logits small.
- :mod:`~trainopt.stability.syncs`: count host-device synchronisations.
- :mod:`~trainopt.stability.integrations`: Hugging Face ``Trainer``, Lightning and Accelerate.
"""

from trainopt.stability.checkpointing.checkpoint import CheckpointError, CheckpointManager
from trainopt.stability.checkpointing.loader import ResumableDataLoader
from trainopt.stability.clipping.norms import (
    AdaptiveGradientClipper,
    ZScoreClipper,
    clip_gradients,
    total_grad_norm,
)
from trainopt.stability.clipping.unitwise import adaptive_clip_grad_
from trainopt.stability.config import Detection, Rollback
from trainopt.stability.distributed import any_rank, broadcast_from_rank0
from trainopt.stability.logits import qk_norm, z_loss
from trainopt.stability.monitoring.gradients import GradientMonitor, nonfinite_gradients
from trainopt.stability.monitoring.loss import LossStabilityMonitor
from trainopt.stability.monitoring.statistics import tail_score
from trainopt.stability.recovery.rates import (
    UnsupportedSchedulerError,
    lr_scale,
    scale_learning_rate,
)
from trainopt.stability.recovery.rollback import TrainingInstabilityError, TrainingRecovery
from trainopt.stability.scaling.scaler import DynamicLossScaler
from trainopt.stability.skipping.buffers import BufferSnapshot
from trainopt.stability.skipping.optimizers import (
    UnsupportedOptimizerError,
)
from trainopt.stability.skipping.schedule import ScheduleWindow, UnsupportedScheduleError
from trainopt.stability.skipping.step import fused_step, masked_step
from trainopt.stability.stabilizer import TrainingStabilizer
from trainopt.stability.syncs import HostSyncCounter

__all__ = [
    "AdaptiveGradientClipper",
    "BufferSnapshot",
    "CheckpointError",
    "CheckpointManager",
    "Detection",
    "DynamicLossScaler",
    "GradientMonitor",
    "HostSyncCounter",
    "LossStabilityMonitor",
    "ResumableDataLoader",
    "Rollback",
    "ScheduleWindow",
    "TrainingInstabilityError",
    "TrainingRecovery",
    "TrainingStabilizer",
    "UnsupportedOptimizerError",
    "UnsupportedScheduleError",
    "UnsupportedSchedulerError",
    "ZScoreClipper",
    "adaptive_clip_grad_",
    "any_rank",
    "broadcast_from_rank0",
    "clip_gradients",
    "fused_step",
    "lr_scale",
    "masked_step",
    "nonfinite_gradients",
    "qk_norm",
    "scale_learning_rate",
    "tail_score",
    "total_grad_norm",
    "z_loss",
]
