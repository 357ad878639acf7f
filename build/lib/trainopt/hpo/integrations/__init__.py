"""Tuning runs that other people's frameworks train: the Hugging Face ``Trainer``.

- :mod:`~trainopt.hpo.integrations.hf`: a ``TrainerCallback`` that reports each evaluation's
  loss to the trial and prunes through the study's pruner
  (:func:`~trainopt.hpo.integrations.hf.pruning_callback`), and the example objective that
  ``python -m trainopt.hpo`` tunes through
  ``objective: trainopt.hpo.integrations.hf:trainer_objective``.
  It imports ``transformers`` only when called; ``import trainopt.hpo`` does not import it.
"""
