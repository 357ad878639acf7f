"""The optimization concepts page: reference update rules, written to be read.

- :mod:`~trainopt.concepts.rules`: SGD, RMSProp, Adam and AdamW steps, global-norm clipping,
  loss scaling and a warm-up cosine schedule, each checked against ``torch.optim`` in the tests.
- :mod:`~trainopt.concepts.demos`: the page's experiments and figures (a demonstration).
- :mod:`~trainopt.concepts.mup`: μP for the project's GPT.
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
    scale_loss,
    sgd_update,
    unscale_gradients,
    warmup_cosine_lr,
)

__all__ = [
    "AdamState", "RMSPropState", "SGDState", "adam_step_size_factor", "adam_update", "adamw_update",
    "clip_by_global_norm", "next_loss_scale", "rmsprop_update", "scale_loss", "sgd_update",
    "unscale_gradients", "warmup_cosine_lr",
]
