"""Learning-rate scheduling: the code of the Learning Rate Scheduling page.

- :mod:`~trainopt.schedules.functions`: schedules as pure functions ``step -> multiplier``
  (warm-up and decay, cosine, step, warm-up-stable-decay, cyclical, polynomial).
- :mod:`~trainopt.schedules.adapters`: the same schedules as ``torch.optim.lr_scheduler.LambdaLR``.
- :mod:`~trainopt.schedules.cyclical` and :mod:`~trainopt.schedules.adaptive`: schedulers
  that keep state (cyclical learning rates, a rate that follows the loss trend).
- :mod:`~trainopt.schedules.registry`: custom schedules and building a scheduler by name.
- :mod:`~trainopt.schedules.finder`: the learning-rate range test.
- :mod:`~trainopt.schedules.monitor` and :mod:`~trainopt.schedules.debug`: see the rate a run uses.
- :mod:`~trainopt.schedules.batch_size`: batch-size ramp-up over the samples consumed.
- :mod:`~trainopt.schedules.plots`: the page's figures (imports matplotlib when called).
"""

from trainopt.schedules.adapters import (
    cosine_annealing_schedule,
    linear_warmup_decay_schedule,
    step_decay_schedule,
    wsd_schedule,
)
from trainopt.schedules.adaptive import AdaptiveLearningRate
from trainopt.schedules.batch_size import batch_size_rampup, rampup_steps
from trainopt.schedules.cyclical import CyclicalLearningRate
from trainopt.schedules.debug import debug_lr_schedule
from trainopt.schedules.finder import LearningRateFinder
from trainopt.schedules.functions import (
    cosine_annealing,
    cyclical_scale,
    linear_warmup_decay,
    step_decay,
    warmup_stable_decay,
)
from trainopt.schedules.monitor import LRMonitor
from trainopt.schedules.registry import (
    PolynomialDecaySchedule,
    SchedulerInterface,
    build_scheduler,
    register_scheduler,
)

__all__ = [
    "AdaptiveLearningRate",
    "CyclicalLearningRate",
    "LRMonitor",
    "LearningRateFinder",
    "PolynomialDecaySchedule",
    "SchedulerInterface",
    "batch_size_rampup",
    "build_scheduler",
    "cosine_annealing",
    "cosine_annealing_schedule",
    "cyclical_scale",
    "debug_lr_schedule",
    "linear_warmup_decay",
    "linear_warmup_decay_schedule",
    "register_scheduler",
    "step_decay",
    "rampup_steps",
    "step_decay_schedule",
    "warmup_stable_decay",
    "wsd_schedule",
]
