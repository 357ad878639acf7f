"""Training stability: the code of the Training Stability page.

- :mod:`~trainopt.stability.clipping` and :mod:`~trainopt.stability.unitwise`: gradient clipping by
  global norm, by history, unit-wise.
- :mod:`~trainopt.stability.scaling` and :mod:`~trainopt.stability.skip`: dynamic loss scaling
  and skipping a step on the device; :mod:`~trainopt.stability.optimizers`: which optimizers a
  step can be skipped for exactly; :mod:`~trainopt.stability.averaging`: an EMA that skips it too;
  :mod:`~trainopt.stability.buffers`: the buffers (BatchNorm's statistics) a skip puts back.
- :mod:`~trainopt.stability.monitors`, :mod:`~trainopt.stability.gradients` and
  :mod:`~trainopt.stability.statistics`: loss and gradient monitors on robust statistics.
- :mod:`~trainopt.stability.checkpoint`, :mod:`~trainopt.stability.fit`, :mod:`~trainopt.stability.rng`
  and :mod:`~trainopt.stability.data`: crash-safe, all-or-nothing checkpoints of everything a
  run depends on, the position in the data included.
- :mod:`~trainopt.stability.rates` and :mod:`~trainopt.stability.recovery`: a learning-rate cut
  the schedule keeps; roll back and lower the learning rate.
- :mod:`~trainopt.stability.config`: the settings, grouped (:class:`Detection`,
  :class:`Rollback`).
- :mod:`~trainopt.stability.checker` and :mod:`~trainopt.stability.stabilizer`: all of the above
  in one training step, with no host sync; :mod:`~trainopt.stability.distributed`: every
  decision agreed over the ranks.
- :mod:`~trainopt.stability.recipe`: the page's complete recipe as a command that resumes.
- :mod:`~trainopt.stability.logits`: z-loss and QK-norm, which keep a large model's logits small.
- :mod:`~trainopt.stability.syncs`: count host-device synchronisations.
"""

from trainopt.stability.averaging import masked_update_parameters
from trainopt.stability.buffers import BufferSnapshot, nonfinite_buffers
from trainopt.stability.checker import StabilityChecker
from trainopt.stability.checkpoint import CheckpointError, CheckpointManager
from trainopt.stability.clipping import (
    AdaptiveGradientClipper,
    ZScoreClipper,
    clip_gradients,
    clip_grads_with_norm_,
    total_grad_norm,
)
from trainopt.stability.config import Detection, Rollback
from trainopt.stability.data import ResumableDataLoader, ResumableSampler
from trainopt.stability.distributed import any_rank, broadcast_from_rank0, is_main_process
from trainopt.stability.gradients import GradientMonitor, nonfinite_gradients
from trainopt.stability.logits import qk_norm, z_loss
from trainopt.stability.monitors import LossSpikeDetector, LossStabilityMonitor
from trainopt.stability.optimizers import (
    UnsupportedOptimizerError,
    check_no_step_hooks,
    check_skippable,
    skips_in_kernel,
)
from trainopt.stability.rates import (
    UnsupportedSchedulerError,
    check_scalable,
    lr_scale,
    scale_learning_rate,
)
from trainopt.stability.recovery import TrainingInstabilityError, TrainingRecovery
from trainopt.stability.rng import get_rng_state, set_rng_state
from trainopt.stability.scaling import DynamicLossScaler
from trainopt.stability.schedule_window import ScheduleWindow, UnsupportedScheduleError
from trainopt.stability.skip import fused_step, masked_step
from trainopt.stability.stabilizer import TrainingStabilizer
from trainopt.stability.statistics import nanmax, nanmedian, robust_zscore, tail_score
from trainopt.stability.syncs import HostSyncCounter
from trainopt.stability.unitwise import adaptive_clip_grad_

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
