"""Seeds per trial: a study resumed, topped up or shared by many workers never replays its points.

A sampler seeded once draws the same numbers in every process that builds it: a second run of
the same study (``--n-trials 4``, then ``--n-trials 8``), a second ``tune()``, a worker restarted
after ``SIGTERM``, or two workers that join with the same seed would all propose the points of
the trials before them again. :class:`TrialSeededSampler` seeds a fresh sampler for each trial
from the study's seed and the trial's number (:func:`trial_seed`): every trial gets its own
numbers, distinct from every other trial's, and the same ones whichever worker, in whichever
run, claims it. A study is then reproducible from its seed, however often it is resumed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number`` of a study seeded with ``seed`` (a 32-bit int).

    Example:
        >>> from trainopt.hpo.seeds import trial_seed
        >>> trial_seed(0, 4) == trial_seed(0, 4), trial_seed(0, 4) != trial_seed(0, 5)
        (True, True)
    """
    return int(np.random.SeedSequence((seed, number)).generate_state(1)[0])


class TrialSeededSampler(optuna.samplers.BaseSampler):
    """A sampler built afresh for each trial by ``build(trial_seed(seed, trial.number))``.

    Everything else is the built sampler's: it reads the study as it would (TPE still sees the
    finished and running trials, the grid its visited points). ``reseed_rng()`` does nothing:
    the seeds come from the trial numbers, which no two trials share.

    Args:
        build: Makes the sampler from a seed, e.g. ``lambda seed: RandomSampler(seed=seed)``.
        seed: The study's seed.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.seeds import TrialSeededSampler
        >>> def draws(n_trials):
        ...     random = optuna.samplers.RandomSampler
        ...     sampler = TrialSeededSampler(lambda s: random(seed=s), seed=0)
        ...     study = optuna.create_study(sampler=sampler)
        ...     study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=n_trials)
        ...     return [trial.params["x"] for trial in study.trials]
        >>> first, again = draws(4), draws(4)
        >>> first == again, len(set(first)) == 4  # reproducible, and no trial repeats another
        (True, True)
    """

    def __init__(self, build: Callable[[int], optuna.samplers.BaseSampler], seed: int) -> None:
        self._build, self._seed = build, seed
        self.base = build(seed)
        """The sampler built from the study's seed, used outside a trial."""
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"TrialSeededSampler({type(self.base).__name__}, seed={self._seed})"

    def _current(self) -> optuna.samplers.BaseSampler:
        return getattr(self._local, "sampler", self.base)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._local.sampler = self._build(trial_seed(self._seed, trial.number))
        self._local.sampler.before_trial(study, trial)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._current().infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self._current().sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._current().sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        try:
            self._current().after_trial(study, trial, state, values)
        finally:
            self._local.__dict__.pop("sampler", None)

    def reseed_rng(self) -> None:
        pass
