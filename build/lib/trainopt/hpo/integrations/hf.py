"""Tune a Hugging Face ``Trainer`` run with ``python -m trainopt.hpo``: a pruning callback, an
example objective.

The ``Trainer`` owns the loop, so the trial hears from it through a ``TrainerCallback``: at each
evaluation, :func:`pruning_callback`'s callback reports ``eval_loss`` at ``state.global_step``
through a :class:`~trainopt.hpo.reporter.TrialReporter`, which raises ``optuna.TrialPruned`` when
the study's pruner says stop (and :class:`~trainopt.hpo.reporter.TrialDiverged` on a NaN). The
exception leaves ``trainer.train()``, and the worker records the trial as PRUNED (or FAIL) with
its reason. :func:`trainer_objective` is the page's objective: the tiny Llama
(:func:`~trainopt.stability.integrations.tiny.tiny_causal_lm`, built from its config, no
download) learns a fixed next-token rule, with the trial's
``TrainingArguments``. ``transformers`` is imported when these functions are called, not before.
"""

from __future__ import annotations

import functools
import tempfile
from typing import Any

import optuna
import torch

from trainopt.hpo.reporter import TrialReporter
from trainopt.stability.integrations.tiny import VOCAB

__all__ = ["pruning_callback", "rule_data", "trainer_objective"]


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback

    class TrialPruningCallback(TrainerCallback):
        """Reports each evaluation's ``metric`` to a trial, and prunes it when the pruner says
        so."""

        def __init__(self, trial: optuna.Trial, metric: str, prune: bool) -> None:
            self.reporter = TrialReporter(trial, report_every=1, prune=prune)
            self.metric = metric
            self.value: float | None = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step >= state.max_steps:
                control.should_evaluate = (
                    True  # the last step is evaluated too: it is the trial's value
                )

        def on_evaluate(
            self, args: Any, state: Any, control: Any, metrics: dict | None = None, **kwargs: Any
        ) -> None:
            if not metrics or self.metric not in metrics:
                raise KeyError(
                    f"metric {self.metric!r} is not among the evaluation's metrics "
                    f"{sorted(metrics or ())}; give the Trainer an eval_dataset"
                )
            self.value = float(metrics[self.metric])
            self.reporter.report(self.value, state.global_step)

    return TrialPruningCallback


def pruning_callback(
    trial: optuna.Trial, metric: str = "eval_loss", prune: bool | None = None
) -> Any:
    """A ``transformers.TrainerCallback`` that reports ``metric`` to ``trial`` at each evaluation.

    It raises ``optuna.TrialPruned`` out of ``trainer.train()`` when the study's pruner says stop,
    and asks for an evaluation after the last step, so that its ``value`` is the run's final
    ``metric``.

    Args:
        trial: The running trial.
        metric: The key of the evaluation's metrics to report (``eval_loss``: lower is better).
        prune: Whether to consult the pruner; default: for a single-objective study only (Optuna
            can't prune several objectives).

    Returns:
        A ``TrialPruningCallback`` for ``Trainer(callbacks=[...])``; its ``value`` is the last
        reported metric.

    Example:
        >>> import optuna
        >>> from transformers import TrainerCallback
        >>> from trainopt.hpo.integrations.hf import pruning_callback
        >>> callback = pruning_callback(optuna.create_study().ask())
        >>> isinstance(callback, TrainerCallback), callback.metric, callback.value
        (True, 'eval_loss', None)
    """
    if prune is None:
        prune = len(trial.study.directions) == 1
    return _callback_class()(trial, metric, prune)


def rule_data(n: int, seed: int = 0, length: int = 8) -> list[dict[str, torch.Tensor]]:
    """``n`` token sequences that follow one rule, ``next = (5 * token + 3) % 32``, from a random
    start.

    Example:
        >>> from trainopt.hpo.integrations.hf import rule_data
        >>> row = rule_data(1)[0]["input_ids"].tolist()
        >>> len(row), all(b == (5 * a + 3) % 32 for a, b in zip(row, row[1:]))
        (8, True)
    """
    tokens = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))]
    for _ in range(length - 1):
        tokens.append((5 * tokens[-1] + 3) % VOCAB)
    ids = torch.stack(tokens, dim=1)
    return [{"input_ids": row, "labels": row} for row in ids]


def trainer_objective(trial: optuna.Trial, params: dict[str, Any]) -> float:
    """Train the tiny Llama with the ``Trainer`` at the trial's ``TrainingArguments``; return the
    last eval loss.

    ``params`` holds ``TrainingArguments`` fields: the tuned ones (``learning_rate``,
    ``weight_decay``, ``lr_scheduler_type``, ...) and the config's ``fixed`` ones (``max_steps``,
    ``eval_steps``, ...).

    Example:
        >>> import optuna
        >>> from trainopt.hpo.integrations.hf import trainer_objective
        >>> trial = optuna.create_study().ask()
        >>> params = {"learning_rate": 1e-1, "max_steps": 20, "eval_steps": 10}
        >>> loss = trainer_objective(trial, params)
        >>> sorted(trial.study.trials[0].intermediate_values), loss < 0.5
        ([10, 20], True)
    """
    from transformers import PrinterCallback, Trainer, TrainingArguments

    from trainopt.stability.integrations.tiny import tiny_causal_lm

    callback = pruning_callback(trial)
    with tempfile.TemporaryDirectory() as out_dir:
        args = TrainingArguments(
            out_dir,
            eval_strategy="steps",
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
            **params,
        )
        trainer = Trainer(
            model=tiny_causal_lm(),
            args=args,
            train_dataset=rule_data(256, seed=0),
            eval_dataset=rule_data(32, seed=1),
            callbacks=[callback],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    assert callback.value is not None
    return callback.value
