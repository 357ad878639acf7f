"""The optimization concepts page: reference update rules, written to be read.

- :mod:`~trainopt.concepts.rules`: SGD, RMSProp, Adam and AdamW steps, global-norm clipping,
  loss scaling and a warm-up cosine schedule, each checked against ``torch.optim`` in the tests.
- :mod:`~trainopt.concepts.training`: Adam on the digits MLP under warm-up and cosine decay, the
  page's training runs (:func:`~trainopt.concepts.training.train_digits_adam`).
- :mod:`~trainopt.concepts.mup`: μP for the project's GPT (its width sweep is the site's workshop).
"""

from trainopt.concepts.rules import (
    AdamState,
    RMSPropState,
    SGDState,
    adam_step_size_factor,
    adam_update,
    adamw_update,
    clip_by_global_norm,
    next_loss_scale,
    rmsprop_update,
    sgd_update,
    unscale_gradients,
    warmup_cosine_lr,
)
from trainopt.concepts.training import train_digits_adam

__all__ = [
    "AdamState",
    "RMSPropState",
    "SGDState",
    "adam_step_size_factor",
    "adam_update",
    "adamw_update",
    "clip_by_global_norm",
    "next_loss_scale",
    "rmsprop_update",
    "sgd_update",
    "train_digits_adam",
    "unscale_gradients",
    "warmup_cosine_lr",
]
