"""The stabilizer inside other people's training loops: the Hugging Face ``Trainer``, Lightning,
Accelerate.

- :mod:`~trainopt.stability.integrations.guard`: :class:`GuardedOptimizer`, the stabilizer's
  update as an optimizer any framework can step, and the :class:`WindowScheduler` it hands the
  framework. It needs torch alone.
- :mod:`~trainopt.stability.integrations.hf`, :mod:`~trainopt.stability.integrations.lightning`
  and :mod:`~trainopt.stability.integrations.accelerate`: each framework's way in. Each imports its
  framework only when called, and nothing here imports them: ``import trainopt.stability`` needs
  none of ``transformers``, ``lightning`` or ``accelerate``.
- :mod:`~trainopt.stability.integrations.tiny`: the tiny Llama the trainer examples train (built
  from its config; ``transformers`` imported when called).
"""

from trainopt.stability.integrations.guard import GuardedOptimizer, WindowScheduler

__all__ = ["GuardedOptimizer", "WindowScheduler"]
