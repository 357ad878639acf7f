"""Report a training loop's validation metric to an Optuna trial, and stop bad trials early."""

from __future__ import annotations

import math

import optuna

from trainopt.validation import check_int


class TrialDiverged(Exception):
    """The trial's metric became NaN or infinite: the study records the trial as failed.

    Example:
        >>> import optuna
        >>> from trainopt.hpo import TrialDiverged
        >>> from trainopt.hpo import TrialReporter
        >>> reporter = TrialReporter(optuna.create_study().ask(), report_every=1)
        >>> try:
        ...     reporter.report(float("nan"), step=3)
        ... except TrialDiverged as error:
        ...     print(error)
        diverged at step 3: the metric is nan
    """


class TrialReporter:
    """Reports a validation metric every ``report_every`` steps and prunes through the pruner.

    The training loop asks :meth:`due` after each step (a cheap integer test: no host-device
    sync) and only then evaluates and calls :meth:`report`. :meth:`report` raises
    :class:`optuna.TrialPruned` when the study's pruner says stop, and :class:`TrialDiverged`
    when the metric is not finite; :func:`trainopt.hpo.study.run_worker` records either as the
    trial's state with the message as its ``reason`` user attribute.

    Args:
        trial: The running trial.
        report_every: Report on steps ``report_every - 1``, ``2 * report_every - 1``, ...
        prune: Whether to consult the pruner (off for multi-objective studies, which Optuna
            can't prune).

    Example:
        >>> import optuna
        >>> from trainopt.hpo import TrialReporter
        >>> study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=1.0))
        >>> reporter = TrialReporter(study.ask(), report_every=10)
        >>> [step for step in range(30) if reporter.due(step)]
        [9, 19, 29]
        >>> reporter.report(0.5, step=9)
        >>> reporter.report(2.0, step=19)
        Traceback (most recent call last):
        ...
        optuna.exceptions.TrialPruned: pruned at step 19: value 2
    """

    def __init__(self, trial: optuna.Trial, report_every: int = 50, prune: bool = True) -> None:
        check_int("report_every", report_every, 1)
        self.trial = trial
        self.report_every = report_every
        self.prune = prune
        self.reports = 0

    def due(self, step: int) -> bool:
        """Whether the loop should evaluate and report after ``step`` (0-based)."""
        return (step + 1) % self.report_every == 0

    def report(self, value: float, step: int) -> None:
        """Record ``value`` at ``step``; raise if the trial diverged or should be pruned."""
        value = float(value)
        if not math.isfinite(value):
            raise TrialDiverged(f"diverged at step {step}: the metric is {value}")
        self.reports += 1
        if not self.prune:
            return
        self.trial.report(value, step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step}: value {value:.4g}")
