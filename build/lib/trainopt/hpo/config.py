"""The tuning config: what to tune (your objective or the digits example), how, and over which
space.

A config is a YAML file with these sections (all but ``search_space`` optional):

.. code-block:: yaml

    objective: my_train:objective     # module:function; leave out for the digits example
    study:     {name, sampler, pruner, prune_after, seed, heartbeat, directions | objectives}
    training:  {steps, report_every}  # the digits example only
    fixed:     {...}                  # held fixed, passed to the objective with the tuned ones
    search_space: {...}               # see trainopt.hpo.space

Every mistake raises :class:`~trainopt.config.ConfigError` naming the dotted field (or the file)
and what is allowed; ``python -m trainopt.hpo`` prints it as one line.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import optuna
import torch
import yaml

from trainopt.hpo.digits import OBJECTIVES, digits_objective
from trainopt.hpo.space import SearchSpace, _config_error
from trainopt.hpo.study import PRUNERS, SAMPLERS, make_pruner, make_sampler
from trainopt.hpo.workers import Objective

SECTIONS = ("objective", "study", "training", "fixed", "search_space")
STUDY_KEYS = (
    "name",
    "objectives",
    "directions",
    "sampler",
    "pruner",
    "prune_after",
    "seed",
    "heartbeat",
)
TRAINING_KEYS = ("steps", "report_every")
DIGITS_FIXED_KEYS = ("lr", "weight_decay", "hidden", "depth", "batch_size")
MAX_OBJECTIVES = 3
"""The most objectives a study may have: the Pareto-front plot draws 2 or 3 of them."""
MAX_SEED = 2**32 - 1
"""The largest seed NumPy's generators (and with them Optuna's samplers) accept."""


@dataclass(frozen=True)
class HPOConfig:
    """A validated tuning config (see ``trainopt.data.path("hpo_digits.yaml")``).

    Attributes:
        name: Study name.
        space: The search space.
        objective: ``"module:function"`` of your objective ``(trial, params) -> value or values``,
            or ``None`` for the digits example.
        directions: The study's directions, ``"minimize"`` or ``"maximize"`` per value the
            objective returns (default: those of ``objectives`` for the digits example, else
            ``("minimize",)``).
        objectives: The digits example's metrics, from ``val_loss``, ``val_accuracy``, ``n_params``.
        sampler: One of ``trainopt.hpo.study.SAMPLERS``.
        pruner: One of ``trainopt.hpo.study.PRUNERS``, or ``None`` (the only choice for several
            objectives: Optuna can't prune a multi-objective study).
        prune_after: No trial is pruned before this step.
        seed: Seed of the sampler.
        heartbeat: Seconds between a running trial's heartbeats (``None``: off).
        steps: Training steps per trial (the digits example).
        report_every: Steps between reports of the validation loss (the digits example).
        fixed: Hyperparameters held fixed for the whole study, passed with the tuned ones.

    Example:
        >>> from trainopt.hpo import HPOConfig, SearchSpace
        >>> config = HPOConfig("demo", SearchSpace.from_dict({"hidden": {"type": "int", "low": 16,
        ...                                                              "high": 64}}),
        ...                    objectives=("val_loss", "n_params"), pruner=None)
        >>> config.directions, type(config.make_pruner()).__name__
        (('minimize', 'minimize'), 'NopPruner')
    """

    name: str
    space: SearchSpace
    objective: str | None = None
    directions: tuple[str, ...] | None = None
    objectives: tuple[str, ...] = ("val_loss",)
    sampler: str = "tpe"
    pruner: str | None = "median"
    prune_after: int = 0
    seed: int | None = 0
    heartbeat: int | None = 60
    steps: int = 150
    report_every: int = 25
    fixed: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.directions is None:
            derived = (
                tuple(OBJECTIVES[name] for name in self.objectives)
                if self.objective is None
                else ("minimize",)
            )
            object.__setattr__(self, "directions", derived)
        assert self.directions is not None
        field_name = "study.directions" if self.objective is not None else "study.objectives"
        if len(self.directions) > MAX_OBJECTIVES:
            raise _config_error(
                field_name,
                f"at most {MAX_OBJECTIVES} objectives (the Pareto-front plot draws "
                f"2 or 3), got {len(self.directions)}",
            )
        if len(self.directions) > 1 and self.pruner not in (None, "none"):
            raise _config_error(
                "study.pruner",
                f"must be null for a multi-objective study (Optuna can't prune "
                f"one), got {self.pruner!r}",
            )

    def make_pruner(self) -> optuna.pruners.BasePruner:
        """The pruner this config describes."""
        return make_pruner(self.pruner, n_warmup_steps=self.prune_after)

    def make_objective(self, device: Any = None) -> Objective:
        """The objective ``(trial, params) -> value(s)``; ``params`` holds the fixed and the tuned
        values.

        ``device`` is where the digits example trains (default: CUDA if available, else CPU);
        your own objective picks its device itself.
        """
        if self.objective is not None:
            return partial(_with_fixed, objective=load_objective(self.objective), fixed=self.fixed)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        digits = partial(
            digits_objective,
            steps=self.steps,
            report_every=self.report_every,
            objectives=self.objectives,
            device=device,
        )
        return partial(_with_fixed, objective=digits, fixed=self.fixed)


def _with_fixed(
    trial: optuna.Trial, params: dict[str, Any], objective: Objective, fixed: dict[str, Any]
) -> Any:
    return objective(trial, {**fixed, **params})


def load_objective(reference: str, field_name: str = "objective") -> Callable[..., Any]:
    """Import the function that ``"package.module:function"`` names.

    The module is imported as Python would from where the command runs: the current folder
    first, then ``PYTHONPATH`` and the installed packages.

    Example:
        >>> import textwrap
        >>> from trainopt.hpo.config import load_objective
        >>> load_objective("trainopt.hpo.digits:digits_objective").__name__
        'digits_objective'
        >>> try:
        ...     load_objective("os:system")
        ... except Exception as error:
        ...     print(textwrap.fill(str(error), 80))
        objective: must be a function objective(trial, params) -> value or values;
        'os:system' is system(command...)
    """
    module_name, colon, name = str(reference).partition(":")
    if not colon or not module_name or not name:
        raise _config_error(
            field_name, f"must be 'module:function', e.g. 'my_train:objective', got {reference!r}"
        )
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise _config_error(
            field_name,
            f"cannot import {module_name!r} ({exc}); run from the folder that "
            "holds it, or add that folder to PYTHONPATH",
        ) from None
    for part in name.split("."):
        if not hasattr(target, part):
            raise _config_error(field_name, f"module {module_name!r} has no {name!r}")
        target = getattr(target, part)
    return _check_signature(target, reference, field_name)


def _check_signature(target: Any, reference: str, field_name: str) -> Callable[..., Any]:
    """``target`` if it can be called as ``target(trial, params)`` and is not a class."""
    wanted = f"must be a function objective(trial, params) -> value or values; {reference!r} is"
    if inspect.isclass(target) or not callable(target):
        kind = "a class" if inspect.isclass(target) else f"a {type(target).__name__}"
        raise _config_error(field_name, f"{wanted} {kind}")
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a builtin without a signature: can't tell what it takes
        raise _config_error(
            field_name, f"{wanted} a builtin whose arguments can't be checked"
        ) from None
    try:
        signature.bind(object(), {})
    except TypeError:
        raise _config_error(
            field_name, f"{wanted} {getattr(target, '__name__', 'callable')}{signature}"
        ) from None
    return target


def _read(path: str | Path) -> dict[str, Any]:
    """The parsed YAML mapping of ``path``; a file that isn't one is named in the error."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _config_error(str(path), "is not a text (UTF-8) file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise _config_error(str(path), f"is not valid YAML ({where}{problem})") from None
    if data is None:
        raise _config_error(
            str(path),
            f"is empty; a tuning config has the sections {list(SECTIONS)}, search_space at least",
        )
    if not isinstance(data, Mapping):
        raise _config_error(
            str(path), f"must be a mapping of sections {list(SECTIONS)}, got {type(data).__name__}"
        )
    return dict(data)


def _unknown(keys: Any, allowed: tuple[str, ...], where: str, what: str) -> None:
    for key in sorted(map(str, keys)):
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise _config_error(f"{where}{key}", f"unknown {what}; {hint}allowed: {list(allowed)}")


def _section(data: Mapping[str, Any], name: str, allowed: tuple[str, ...] | None) -> dict[str, Any]:
    section = data.get(name) or {}
    if not isinstance(section, Mapping):
        raise _config_error(name, f"must be a mapping, got {section!r}")
    if allowed is not None:
        _unknown(section, allowed, f"{name}.", "key")
    return dict(section)


def _int(value: Any, field_name: str, minimum: int, or_null: bool = False) -> Any:
    if value is None and or_null:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a positive int" if minimum == 1 else "a non-negative int"
        raise _config_error(
            field_name, f"must be {kind}{' or null' if or_null else ''}, got {value!r}"
        )
    return value


def _names(
    value: Any, field_name: str, allowed: Mapping[str, Any] | tuple[str, ...], unique: bool = False
) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or not value
        or any(not isinstance(v, str) or v not in allowed for v in value)
    ):
        raise _config_error(
            field_name, f"must be a non-empty list from {sorted(allowed)}, got {value!r}"
        )
    if unique and len(set(value)) < len(value):
        raise _config_error(field_name, f"names each metric once, got {value!r}")
    return tuple(value)


def load_hpo_config(path: str | Path) -> HPOConfig:
    """Load and validate a tuning config; errors name the dotted field and what is allowed.

    Your objective's module is imported here, so a wrong name fails before anything trains.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt.hpo import load_hpo_config
        >>> path = Path(tempfile.mkdtemp()) / "tune.yaml"
        >>> _ = path.write_text("search_space:\\n"
        ...                     "  lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}\\n")
        >>> config = load_hpo_config(path)
        >>> config.name, sorted(config.space), config.directions, config.heartbeat
        ('tune', ['lr'], ('minimize',), 60)
    """
    data = _read(path)
    _unknown(data, SECTIONS, "", "section")
    objective = data.get("objective")
    if objective is not None:
        load_objective(objective)
    study = _section(data, "study", STUDY_KEYS)
    training = _section(data, "training", TRAINING_KEYS)
    fixed = _section(data, "fixed", DIGITS_FIXED_KEYS if objective is None else None)
    space = SearchSpace.from_dict(data.get("search_space"), where="search_space")
    name = study.get("name", Path(path).stem)
    if not isinstance(name, str) or not name:
        raise _config_error("study.name", f"must be a non-empty string, got {name!r}")
    if objective is None and "directions" in study:
        raise _config_error(
            "study.directions",
            "is for your own objective; the digits example takes its "
            "directions from study.objectives",
        )
    if objective is not None and "objectives" in study:
        raise _config_error(
            "study.objectives",
            "names the digits example's metrics; for your own objective give study.directions",
        )
    if objective is not None and training:
        raise _config_error(
            "training", "configures the digits example; pass your objective's settings in fixed"
        )
    sampler = study.get("sampler", "tpe")
    if sampler not in SAMPLERS:
        raise _config_error("study.sampler", f"must be one of {list(SAMPLERS)}, got {sampler!r}")
    directions = study.get("directions")
    directions = (
        None
        if directions is None
        else _names(directions, "study.directions", ("minimize", "maximize"))
    )
    objectives = _names(
        study.get("objectives", ["val_loss"]), "study.objectives", OBJECTIVES, unique=True
    )
    several = len(directions or ()) > 1 if objective is not None else len(objectives) > 1
    pruner = study.get(
        "pruner", None if several else "median"
    )  # Optuna can't prune several objectives
    if pruner not in (*PRUNERS, None):
        raise _config_error(
            "study.pruner", f"must be one of {list(PRUNERS)} or null, got {pruner!r}"
        )
    seed = study.get("seed", 0)
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED
    ):
        raise _config_error(
            "study.seed", f"must be an int from 0 to 2**32 - 1, or null, got {seed!r}"
        )
    overlap = sorted(set(fixed) & set(space))
    if overlap:
        raise _config_error(
            f"fixed.{overlap[0]}",
            "is also in search_space: a hyperparameter is either fixed or tuned",
        )
    if sampler in ("grid", "gp"):
        make_sampler(sampler, seed, space)  # a grid needs steps or choices; gp needs scipy
    return HPOConfig(
        name=name,
        space=space,
        objective=objective,
        directions=directions,
        objectives=objectives,
        sampler=sampler,
        pruner=pruner,
        seed=seed,
        prune_after=_int(study.get("prune_after", 0), "study.prune_after", 0),
        heartbeat=_int(study.get("heartbeat", 60), "study.heartbeat", 1, or_null=True),
        steps=_int(training.get("steps", 150), "training.steps", 1),
        report_every=_int(training.get("report_every", 25), "training.report_every", 1),
        fixed=fixed,
    )
