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
from trainopt.stability.checkpointing.loader import ResumableDataLoader, ResumableSampler
from trainopt.stability.checkpointing.rng import get_rng_state, set_rng_state
from trainopt.stability.clipping.norms import (
    AdaptiveGradientClipper,
    ZScoreClipper,
    clip_gradients,
    clip_grads_with_norm_,
    total_grad_norm,
)
from trainopt.stability.clipping.unitwise import adaptive_clip_grad_
from trainopt.stability.config import Detection, Rollback
from trainopt.stability.distributed import any_rank, broadcast_from_rank0, is_main_process
from trainopt.stability.logits import qk_norm, z_loss
from trainopt.stability.monitoring.checker import StabilityChecker
from trainopt.stability.monitoring.gradients import GradientMonitor, nonfinite_gradients
from trainopt.stability.monitoring.loss import LossSpikeDetector, LossStabilityMonitor
from trainopt.stability.monitoring.statistics import nanmax, nanmedian, robust_zscore, tail_score
from trainopt.stability.recovery.rates import (
    UnsupportedSchedulerError,
    check_scalable,
    lr_scale,
    scale_learning_rate,
)
from trainopt.stability.recovery.rollback import TrainingInstabilityError, TrainingRecovery
from trainopt.stability.scaling.scaler import DynamicLossScaler
from trainopt.stability.skipping.averaging import masked_update_parameters
from trainopt.stability.skipping.buffers import BufferSnapshot, nonfinite_buffers
from trainopt.stability.skipping.optimizers import (
    UnsupportedOptimizerError,
    check_no_step_hooks,
    check_skippable,
    skips_in_kernel,
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
    "LossSpikeDetector",
    "LossStabilityMonitor",
    "ResumableDataLoader",
    "ResumableSampler",
    "Rollback",
    "ScheduleWindow",
    "StabilityChecker",
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
    "check_no_step_hooks",
    "check_scalable",
    "check_skippable",
    "clip_gradients",
    "clip_grads_with_norm_",
    "fused_step",
    "get_rng_state",
    "is_main_process",
    "lr_scale",
    "masked_step",
    "masked_update_parameters",
    "nanmax",
    "nanmedian",
    "nonfinite_buffers",
    "nonfinite_gradients",
    "qk_norm",
    "robust_zscore",
    "scale_learning_rate",
    "tail_score",
    "set_rng_state",
    "skips_in_kernel",
    "total_grad_norm",
    "z_loss",
]
