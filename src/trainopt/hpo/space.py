"""Search spaces declared in YAML, validated early, turned into ``trial.suggest_*`` calls.

A search space maps each hyperparameter to a spec:

- ``{type: float, low: 1.0e-4, high: 1.0e-1, log: true}`` (optionally ``step``),
- ``{type: int, low: 32, high: 256, step: 32}`` (optionally ``log``),
- ``{type: categorical, choices: [adamw, sgd]}``.

Bad specs raise :class:`trainopt.config.training.ConfigError` naming the dotted field and what is
allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml

PARAM_TYPES = ("float", "int", "categorical")
ALLOWED_KEYS = {
    "float": {"type", "low", "high", "log", "step"},
    "int": {"type", "low", "high", "log", "step"},
    "categorical": {"type", "choices"},
}


def _config_error(field: str, message: str) -> Exception:
    """A :class:`trainopt.config.training.ConfigError` for the dotted ``field``."""
    from trainopt.config.training import (
        ConfigError,  # the package's one config error, shared by all configs
    )

    return ConfigError(field, message)


def _number(value: Any, field: str, kind: str) -> float | int:
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _config_error(field, f"must be an int, got {value!r}")
        return value
    if isinstance(value, str):
        # YAML 1.1 (PyYAML) reads 1e-4 as a string; the intent is plain, as in trainopt.config.
        try:
            value = float(value)
        except ValueError:
            raise _config_error(field, f"must be a number (write 1.0e-4), got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _config_error(field, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise _config_error(field, f"must be finite, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ParamSpec:
    """One hyperparameter of a search space.

    Attributes:
        name: Parameter name, as passed to ``trial.suggest_*``.
        type: ``"float"``, ``"int"`` or ``"categorical"``.
        low: Lower bound (numeric types), inclusive.
        high: Upper bound (numeric types), inclusive.
        log: Sample uniformly in log space.
        step: Grid spacing (numeric types), or ``None`` for a continuous float.
        choices: The values of a categorical parameter.

    Example:
        >>> from trainopt.hpo import ParamSpec
        >>> ParamSpec.from_dict("lr", {"type": "float", "low": 1e-4, "high": 1e-1,
        ...                            "log": True}).distribution()
        FloatDistribution(high=0.1, log=True, low=0.0001, step=None)
    """

    name: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    @classmethod
    def from_dict(cls, name: str, spec: Any, where: str = "search_space") -> ParamSpec:
        """Validate one YAML spec; errors name the field as ``<where>.<name>.<key>``."""
        field = f"{where}.{name}"
        if not isinstance(spec, Mapping):
            raise _config_error(field, f"must be a mapping with a 'type', got {spec!r}")
        kind = spec.get("type")
        if kind not in PARAM_TYPES:
            raise _config_error(
                f"{field}.type", f"must be one of {list(PARAM_TYPES)}, got {kind!r}"
            )
        unknown = sorted(set(spec) - ALLOWED_KEYS[kind])
        if unknown:
            raise _config_error(
                field, f"unknown keys {unknown}; a {kind} takes {sorted(ALLOWED_KEYS[kind])}"
            )
        if kind == "categorical":
            choices = spec.get("choices")
            if not isinstance(choices, (list, tuple)) or not choices:
                raise _config_error(
                    f"{field}.choices", f"must be a non-empty list, got {choices!r}"
                )
            for value in choices:
                if value is not None and not isinstance(value, (bool, int, float, str)):
                    raise _config_error(
                        f"{field}.choices", f"may hold None, bool, int, float or str, got {value!r}"
                    )
            return cls(name, kind, choices=tuple(choices))
        for key in ("low", "high"):
            if key not in spec:
                raise _config_error(f"{field}.{key}", f"is required for a {kind}")
        low = _number(spec["low"], f"{field}.low", kind)
        high = _number(spec["high"], f"{field}.high", kind)
        if not low < high:
            raise _config_error(field, f"needs low < high, got low={low!r}, high={high!r}")
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise _config_error(f"{field}.log", f"must be true or false, got {log!r}")
        step = spec.get("step")
        if step is not None:
            step = _number(step, f"{field}.step", kind)
            if step <= 0:
                raise _config_error(f"{field}.step", f"must be positive, got {step!r}")
            if step > high - low:
                raise _config_error(
                    f"{field}.step",
                    f"must be at most high - low = {high - low!r} (a larger "
                    f"step leaves only low to draw), got {step!r}",
                )
        if log and low <= 0:
            raise _config_error(f"{field}.low", f"must be > 0 when log is true, got {low!r}")
        if log and step not in (None, 1):
            raise _config_error(field, f"log and step can't be combined, got step={step!r}")
        if kind == "int" and step is None:
            step = 1
        return cls(name, kind, low, high, log, step if not log or kind == "int" else None)

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """The matching Optuna distribution."""
        if self.type == "categorical":
            return optuna.distributions.CategoricalDistribution(list(self.choices))
        if self.type == "int":
            return optuna.distributions.IntDistribution(
                self.low, self.high, log=self.log, step=self.step
            )
        return optuna.distributions.FloatDistribution(
            self.low, self.high, log=self.log, step=self.step
        )

    def suggest(self, trial: optuna.Trial) -> Any:
        """Ask ``trial`` for a value through the matching ``trial.suggest_*`` call."""
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.name, self.low, self.high, step=self.step, log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def grid(self) -> list[Any]:
        """Every value of this parameter, for a grid search (needs choices or a step)."""
        if self.type == "categorical":
            return list(self.choices)
        if self.step is None:
            raise _config_error(
                f"search_space.{self.name}",
                "a grid search needs 'choices' or a 'step' for every "
                f"parameter; {self.name} is a continuous float",
            )
        count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        values = [self.low + i * self.step for i in range(count)]
        return values if self.type == "int" else [round(v, 12) for v in values]


class SearchSpace(dict[str, ParamSpec]):
    """A validated search space: parameter name -> :class:`ParamSpec`, in declaration order.

    Example:
        >>> import optuna
        >>> from trainopt.hpo import SearchSpace
        >>> space = SearchSpace.from_dict({
        ...     "lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
        ...     "hidden": {"type": "int", "low": 32, "high": 128, "step": 32},
        ... })
        >>> study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        >>> params = space.suggest(study.ask())
        >>> sorted(params), 1e-4 <= params["lr"] <= 1e-1, params["hidden"] in (32, 64, 96, 128)
        (['hidden', 'lr'], True, True)
    """

    @classmethod
    def from_dict(cls, specs: Any, where: str = "search_space") -> SearchSpace:
        """Validate a mapping of parameter name -> spec (as read from YAML)."""
        if not isinstance(specs, Mapping) or not specs:
            raise _config_error(
                where, f"must be a non-empty mapping of name -> spec, got {specs!r}"
            )
        space = cls()
        for name, spec in specs.items():
            if not isinstance(name, str) or not name:
                raise _config_error(where, f"keys must be non-empty strings, got {name!r}")
            space[name] = ParamSpec.from_dict(name, spec, where)
        return space

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """One value per parameter, from the trial's sampler."""
        return {name: spec.suggest(trial) for name, spec in self.items()}

    def grid(self) -> dict[str, list[Any]]:
        """The search space of :class:`optuna.samplers.GridSampler`."""
        return {name: spec.grid() for name, spec in self.items()}

    def with_bounds(self, name: str, low: float, high: float) -> SearchSpace:
        """A copy with new bounds for one numeric parameter (validated like the YAML)."""
        if name not in self:
            raise _config_error("search_space", f"has no parameter {name!r}; it has {sorted(self)}")
        old = self[name]
        spec = {"type": old.type, "low": low, "high": high, "log": old.log}
        if old.step is not None and not old.log:
            spec["step"] = old.step
        new = SearchSpace(self)
        new[name] = ParamSpec.from_dict(name, spec)
        return new


def load_search_space(
    source: str | Path | Mapping[str, Any], key: str | None = "search_space"
) -> SearchSpace:
    """Load and validate a search space from a YAML file (or an already parsed mapping).

    Args:
        source: Path of a YAML file, or a mapping.
        key: Top-level key that holds the space (``None``: the whole document is the space).

    Example:
        >>> from trainopt.hpo.space import load_search_space
        >>> space = load_search_space({"search_space": {"wd": {"type": "float", "low": 1e-5,
        ...                                                    "high": 1e-1, "log": True}}})
        >>> space["wd"].log, space["wd"].high
        (True, 0.1)
    """
    data = source
    if not isinstance(source, Mapping):
        data = yaml.safe_load(Path(source).read_text())
    if key is not None:
        if not isinstance(data, Mapping) or key not in data:
            raise _config_error(key, "is required: the mapping of hyperparameter -> spec")
        data = data[key]
    return SearchSpace.from_dict(data, where=key or "search_space")


def check_space_unchanged(
    space: SearchSpace,
    trials: Sequence[optuna.trial.FrozenTrial],
    study_name: str,
    *,
    allow_change: bool = False,
    opt_in: str = "pass allow_space_change=True",
) -> None:
    """Refuse ``space`` if it differs from the one a stored study's ``trials`` were drawn from.

    The study's space is the distributions of its latest COMPLETE, PRUNED or WAITING trial (a
    RUNNING one may have drawn part of its point only; without any of those, the RUNNING trial
    with the most parameters). A changed range, step, log scale or type, and an added or dropped
    parameter, raise :class:`~trainopt.config.errors.ConfigError` for ``search_space.<name>``,
    naming both distributions: the study would compare points drawn from two spaces. With
    ``allow_change`` it goes on, except for a change Optuna refuses in one study (another type,
    log scale or set of choices, see ``optuna.distributions.check_distribution_compatibility``),
    which would fail every trial.

    Example:
        >>> import optuna
        >>> from trainopt.hpo.space import SearchSpace, check_space_unchanged
        >>> study = optuna.create_study()
        >>> study.add_trial(optuna.trial.create_trial(params={"x": 0.5}, value=1.0,
        ...     distributions={"x": optuna.distributions.FloatDistribution(0.0, 1.0)}))
        >>> wider = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 2.0}})
        >>> try:
        ...     check_space_unchanged(wider, study.trials, "demo")
        ... except ValueError as error:
        ...     print(error)
        search_space.x: the study 'demo' has FloatDistribution(high=1.0, log=False, low=0.0,
            step=None), this config FloatDistribution(high=2.0, log=False, low=0.0, step=None);
            start a new study, or pass allow_space_change=True to go on
        >>> check_space_unchanged(wider, study.trials, "demo", allow_change=True) is None  # goes on
        True
    """
    drawn = [t for t in trials if t.distributions]
    settled = [t for t in drawn if t.state in _SETTLED]
    running = [t for t in drawn if t.state == optuna.trial.TrialState.RUNNING]
    if settled:
        stored = max(settled, key=lambda t: t.number).distributions
    elif running:
        stored = max(running, key=lambda t: len(t.distributions)).distributions
    else:
        return
    config = {name: spec.distribution() for name, spec in space.items()}
    changed = [
        name
        for name in [*config, *(n for n in stored if n not in config)]
        if stored.get(name) != config.get(name)
    ]
    if not changed:
        return
    incompatible = {}
    for name in changed:
        if name not in config:
            continue
        for trial in drawn:  # Optuna checks a new trial's parameter against the earlier ones
            if name in trial.distributions:
                try:
                    optuna.distributions.check_distribution_compatibility(
                        trial.distributions[name], config[name]
                    )
                except ValueError as exc:
                    incompatible[name] = (trial.distributions[name], str(exc))
                    break
    if allow_change and not incompatible:
        return
    name = next(iter(incompatible)) if incompatible else changed[0]
    old = incompatible[name][0] if name in incompatible else stored.get(name)
    was = "no parameter " + repr(name) if old is None else repr(old)
    now = "drops it" if name not in config else repr(config[name])
    others = [n for n in changed if n != name]
    more = f" (also changed: {', '.join(others)})" if others else ""
    if name in incompatible:
        advice = (
            f"Optuna can't hold both in one study ({incompatible[name][1].rstrip('.')}): "
            "start a new study"
        )
    else:
        advice = f"start a new study, or {opt_in} to go on"
    raise _config_error(
        f"search_space.{name}",
        f"the study {study_name!r} has {was}, this config {now}{more}; {advice}",
    )


_SETTLED = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
    optuna.trial.TrialState.WAITING,
)


def params_at_edge(
    params: Mapping[str, Any], space: SearchSpace, margin: float = 0.05
) -> dict[str, str]:
    """Which numeric parameters sit near an edge of their range: ``{name: "low" | "high"}``.

    A best trial near a boundary means the optimum may lie outside the space: widen that
    range and search again. Distance is measured as a fraction of the range, in log space
    where the parameter is log-scaled.

    Example:
        >>> from trainopt.hpo import SearchSpace
        >>> from trainopt.hpo import params_at_edge
        >>> space = SearchSpace.from_dict({"lr": {"type": "float", "low": 1e-4, "high": 1e-1,
        ...                                       "log": True}})
        >>> params_at_edge({"lr": 0.09}, space), params_at_edge({"lr": 3e-3}, space)
        ({'lr': 'high'}, {})
    """
    if not 0.0 <= margin < 0.5:
        raise ValueError(f"margin must be in [0, 0.5), got {margin=}")
    flagged: dict[str, str] = {}
    for name, spec in space.items():
        if spec.type == "categorical" or name not in params:
            continue
        scale = math.log if spec.log else float
        low, high, value = scale(spec.low), scale(spec.high), scale(params[name])
        position = (value - low) / (high - low)
        if position <= margin:
            flagged[name] = "low"
        elif position >= 1.0 - margin:
            flagged[name] = "high"
    return flagged


def lr_bounds_from_finder(
    finder_or_lr: Any, below: float = 10.0, above: float = 3.0
) -> tuple[float, float]:
    """Learning-rate bounds around an LR range test's suggestion ``s``: ``(s / below, s * above)``.

    The default range ``[s / 10, 3 s]`` is not centred on ``s``: on a log scale its centre is
    ``s * sqrt(above / below)``, about ``0.55 s``. It leans low on purpose, because the range
    test's steepest point is already close to where training diverges. ``below == above``
    centres it on ``s``.

    Args:
        finder_or_lr: A :class:`trainopt.schedules.finder.LearningRateFinder` after ``find_lr`` (its
            ``suggest_lr()`` is used), or the suggested learning rate itself.
        below: How far under the suggestion the range starts.
        above: How far over it the range ends.

    Example:
        >>> import math
        >>> from trainopt.hpo import lr_bounds_from_finder
        >>> low, high = lr_bounds_from_finder(3e-3)
        >>> f"{low:.1e} {high:.1e}", f"{math.sqrt(low * high) / 3e-3:.3f}"
        ('3.0e-04 9.0e-03', '0.548')
    """
    lr = finder_or_lr.suggest_lr() if hasattr(finder_or_lr, "suggest_lr") else finder_or_lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(
            f"the suggested learning rate must be a positive finite number, got {lr!r}"
        )
    if below < 1.0 or above < 1.0:
        raise ValueError(f"below and above must be >= 1, got {below=}, {above=}")
    return float(lr) / below, float(lr) * above


def with_lr_range_from_finder(
    space: SearchSpace, finder_or_lr: Any, name: str = "lr", below: float = 10.0, above: float = 3.0
) -> SearchSpace:
    """A copy of ``space`` whose learning-rate range comes from an LR range test.

    The range is :func:`lr_bounds_from_finder`'s, ``[s / below, s * above]``, log-scaled.

    Example:
        >>> from trainopt.hpo import SearchSpace
        >>> from trainopt.hpo import with_lr_range_from_finder
        >>> lr = {"type": "float", "low": 1e-5, "high": 1.0, "log": True}
        >>> space = SearchSpace.from_dict({"lr": lr})
        >>> narrowed = with_lr_range_from_finder(space, 3e-3)
        >>> f'{narrowed["lr"].low:.1e} {narrowed["lr"].high:.1e}', narrowed["lr"].log
        ('3.0e-04 9.0e-03', True)
    """
    low, high = lr_bounds_from_finder(finder_or_lr, below, above)
    return space.with_bounds(name, low, high)
