"""Training configs from YAML: load, validate every field, build the optimizer and scheduler.

A config file holds one ``training`` section with an ``optimizer`` and a ``scheduler``:

.. code-block:: yaml

    training:
      optimizer: {type: adamw, lr: 3.0e-4, weight_decay: 0.01}
      scheduler: {type: cosine_annealing, warmup_steps: 100, total_steps: 2000, min_lr: 1.0e-5}

:func:`load_config` reads it with ``yaml.safe_load`` and checks every field before anything
trains. Errors are :class:`ConfigError` and name the dotted field and the allowed values.

YAML 1.1 (PyYAML) reads a float with an exponent only when it has a dot *and* a signed
exponent: ``1.0e-4`` and ``1.0e+5`` are floats, while ``1e-4`` and ``1.0e5`` are the *strings*
``"1e-4"`` and ``"1.0e5"``. Float fields accept such strings and convert them, since the intent is
plain, with a warning that names the field and the spelling YAML reads (``1.0e+5``); integer
fields (steps) must be written as integers.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from trainopt.config.errors import ConfigError
from trainopt.config.optimizers import OPTIMIZERS
from trainopt.schedules.registry import (
    build_scheduler,
    registered_schedulers,
    scheduler_parameters,
)

# the types a config names: the one vocabulary's plain optimizers (a config sets momentum itself)
OPTIMIZER_SETTINGS = {name: OPTIMIZERS[name].settings for name in ("sgd", "adam", "adamw")}
FLOAT_STRING = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


@dataclass(frozen=True)
class OptimizerConfig:
    """The validated ``training.optimizer`` section.

    Example:
        >>> import torch
        >>> from trainopt.config import OptimizerConfig
        >>> from trainopt.config import build_optimizer
        >>> cfg = OptimizerConfig("adamw", 3e-4, {"weight_decay": 0.01})
        >>> opt = build_optimizer(torch.nn.Linear(2, 1).parameters(), cfg)
        >>> type(opt).__name__, opt.param_groups[0]["weight_decay"]
        ('AdamW', 0.01)
    """

    type: str
    lr: float
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SchedulerConfig:
    """The validated ``training.scheduler`` section: a registered ``type`` and its settings.

    Example:
        >>> from trainopt.config import SchedulerConfig
        >>> from trainopt.schedules.registry import registered_schedulers
        >>> cfg = SchedulerConfig("step_decay", {"decay_steps": 100})
        >>> cfg.type in registered_schedulers(), cfg.params["decay_steps"]
        (True, 100)
    """

    type: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    """A validated training config (the ``training`` section of the file).

    Example:
        >>> import torch
        >>> from trainopt.config import Config
        >>> from trainopt.config import OptimizerConfig
        >>> from trainopt.config import SchedulerConfig
        >>> from trainopt.config import build_optimizer
        >>> scheduler = SchedulerConfig("step_decay", {"decay_steps": 10})
        >>> cfg = Config(OptimizerConfig("sgd", 0.1), scheduler)
        >>> optimizer = build_optimizer(torch.nn.Linear(2, 1).parameters(), cfg)
        >>> type(optimizer).__name__, cfg.scheduler.type
        ('SGD', 'step_decay')
    """

    optimizer: OptimizerConfig
    scheduler: SchedulerConfig


# ---------------------------------------------------------------------------------------------
# Field checks
# ---------------------------------------------------------------------------------------------


def _section(data: Any, path: str, required: Iterable[str], allowed: Iterable[str]) -> dict:
    if not isinstance(data, Mapping):
        raise ConfigError(
            path or "<file>", f"must be a mapping, got {type(data).__name__} {data!r}"
        )
    allowed = sorted(allowed)
    for key in required:
        if key not in data:
            raise ConfigError(
                _join(path, key), f"missing required field (allowed fields: {allowed})"
            )
    for key in data:
        if key not in allowed:
            raise ConfigError(_join(path, key), f"unknown field; allowed fields: {allowed}")
    return dict(data)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def yaml_float_spelling(text: str) -> str:
    """How to write ``text`` so that YAML 1.1 reads a float: a dot and a signed exponent.

    Example:
        >>> from trainopt.config.training import yaml_float_spelling
        >>> yaml_float_spelling("1e-4"), yaml_float_spelling("1.0e5"), yaml_float_spelling("2E3")
        ('1.0e-4', '1.0e+5', '2.0e+3')
    """
    mantissa, _, exponent = text.strip().lower().partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    elif mantissa.endswith("."):
        mantissa += "0"
    if mantissa.lstrip("+-").startswith("."):
        mantissa = mantissa.replace(".", "0.", 1)
    if not exponent:
        return mantissa
    if exponent[0] not in "+-":
        exponent = "+" + exponent
    return f"{mantissa}e{exponent}"


def _number_from_string(value: str, path: str) -> float:
    """A float field that YAML handed over as a string: convert it, and say how to spell it."""
    spelling = yaml_float_spelling(value)
    if "e" in value.lower():
        why = "a YAML 1.1 float with an exponent needs a dot and a signed exponent"
    else:
        why = "it was quoted"
    warnings.warn(
        f"{path}: YAML read {value} as the string {value!r} ({why}); using "
        f"{float(value)!r}; write {spelling}",
        UserWarning,
        stacklevel=4,
    )
    return float(value)


def _float(value: Any, path: str, low: float = 0.0, high: float = math.inf) -> float:
    if isinstance(value, str) and FLOAT_STRING.match(value.strip()):
        value = _number_from_string(value, path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(path, f"must be a number in [{low}, {high}], got {value!r}")
    if not low <= value <= high:
        raise ConfigError(path, f"must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def _int(value: Any, path: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        hint = ""
        if (
            isinstance(value, float)
            and value.is_integer()
            or isinstance(value, str)
            and FLOAT_STRING.match(value)
        ):
            hint = f"; write it as a plain integer such as {int(float(value))}"
        raise ConfigError(path, f"must be an integer >= {minimum}, got {value!r}{hint}")
    if value < minimum:
        raise ConfigError(path, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _choice(value: Any, path: str, allowed: Iterable[str]) -> str:
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(path, f"must be one of {allowed}, got {value!r}")
    return value


def _optimizer(data: Any, path: str) -> OptimizerConfig:
    raw = _section(
        data, path, ("type", "lr"), ("type", *{k for v in OPTIMIZER_SETTINGS.values() for k in v})
    )
    kind = _choice(raw.pop("type"), f"{path}.type", OPTIMIZER_SETTINGS)
    _section(raw, path, (), OPTIMIZER_SETTINGS[kind])  # settings of another optimizer type
    lr = _float(raw.pop("lr"), f"{path}.lr")
    if lr <= 0:
        raise ConfigError(f"{path}.lr", f"must be a positive number, got {lr!r}")
    settings: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{path}.{key}"
        if key == "betas":
            if not isinstance(value, (list, tuple)) or len(value) != 2:
                raise ConfigError(where, f"must be a list of two numbers in [0, 1), got {value!r}")
            settings[key] = tuple(_beta(b, f"{where}[{i}]") for i, b in enumerate(value))
        elif key == "nesterov":
            if not isinstance(value, bool):
                raise ConfigError(where, f"must be true or false, got {value!r}")
            settings[key] = value
        elif key == "momentum":
            settings[key] = _float(value, where, 0.0, 1.0)
        else:
            settings[key] = _float(value, where)
    if settings.get("nesterov") and not settings.get("momentum"):
        raise ConfigError(
            f"{path}.nesterov",
            "needs a momentum above 0: Nesterov momentum without momentum "
            f"is plain SGD (momentum={settings.get('momentum', 0.0)!r})",
        )
    return OptimizerConfig(kind, lr, settings)


def _beta(value: Any, path: str) -> float:
    """A decay rate: a number in [0, 1) (torch refuses 1.0, where the average never moves)."""
    if isinstance(value, str) and FLOAT_STRING.match(value.strip()):
        value = _number_from_string(value, path)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(path, f"must be a number in [0, 1), got {value!r}")
    return float(value)


def _scheduler(data: Any, path: str, lr: float) -> SchedulerConfig:
    names = registered_schedulers()
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"must be a mapping, got {type(data).__name__} {data!r}")
    if "type" not in data:
        raise ConfigError(f"{path}.type", f"missing required field; one of {names}")
    kind = _choice(data["type"], f"{path}.type", names)
    spec = scheduler_parameters(kind)
    required = [k for k, p in spec.items() if p.default is p.empty]
    raw = _section(data, path, ("type", *required), ("type", *spec))
    raw.pop("type")
    params: dict[str, Any] = {}
    for key, value in raw.items():
        where, default = f"{path}.{key}", spec[key].default
        if (
            key.endswith("steps")
            or key.endswith("_size")
            or isinstance(default, int)
            and not isinstance(default, bool)
        ):
            params[key] = _int(value, where)
        elif isinstance(default, str):
            params[key] = value if isinstance(value, str) else str(value)
        else:
            params[key] = _float(value, where)
    if (
        "warmup_steps" in params
        and "total_steps" in params
        and params["warmup_steps"] >= params["total_steps"]
    ):
        raise ConfigError(
            f"{path}.warmup_steps",
            f"warm-up ({params['warmup_steps']} steps) must be shorter than the run "
            f"(total_steps={params['total_steps']})",
        )
    if params.get("min_lr", 0.0) > lr:
        raise ConfigError(
            f"{path}.min_lr", f"must not exceed the optimizer lr ({lr}), got {params['min_lr']}"
        )
    config = SchedulerConfig(kind, params)
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    try:  # the scheduler's own checks (allowed values, step relations) on a throwaway optimizer
        build_scheduler(probe, config)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        name = message.split(" ", 1)[0]
        raise ConfigError(f"{path}.{name}" if name in spec else path, message) from exc
    return config


def validate_config(data: Any) -> Config:
    """Validate a config already parsed into Python objects (the file's top-level mapping).

    Example:
        >>> from trainopt.config import ConfigError
        >>> from trainopt.config import validate_config
        >>> cfg = validate_config({"training": {
        ...     "optimizer": {"type": "adamw", "lr": "1e-3"},
        ...     "scheduler": {"type": "step_decay", "decay_steps": 100}}})
        >>> cfg.optimizer.lr, cfg.scheduler.params
        (0.001, {'decay_steps': 100})
        >>> try:
        ...     validate_config({"training": {
        ...         "optimizer": {"type": "adamw", "lr": 1e-3},
        ...         "scheduler": {"type": "step_decay", "decay_steps": -5}}})
        ... except ConfigError as error:
        ...     print(error)
        training.scheduler.decay_steps: must be an integer >= 0, got -5
    """
    root = _section(data, "", ("training",), ("training",))
    training = _section(
        root["training"], "training", ("optimizer", "scheduler"), ("optimizer", "scheduler")
    )
    optimizer = _optimizer(training["optimizer"], "training.optimizer")
    scheduler = _scheduler(training["scheduler"], "training.scheduler", optimizer.lr)
    return Config(optimizer, scheduler)


def load_config(path: str | Path) -> Config:
    """Read a YAML training config with ``yaml.safe_load`` and validate every field.

    Raises:
        ConfigError: a field is missing, unknown or invalid (the message names it).
        FileNotFoundError: ``path`` does not exist.

    Example:
        >>> from trainopt.config import load_config
        >>> from trainopt.data import path
        >>> cfg = load_config(path("scheduler_cosine.yaml"))
        >>> cfg.optimizer.type, cfg.optimizer.lr, cfg.scheduler.type
        ('adamw', 0.0003, 'cosine_annealing')
        >>> cfg.scheduler.params["warmup_steps"], cfg.scheduler.params["total_steps"]
        (50, 1000)
    """
    path = Path(path)
    with path.open() as handle:
        try:
            data = yaml.safe_load(handle)
        except yaml.YAMLError as exc:
            raise ConfigError(str(path), f"not valid YAML: {exc}") from exc
    return validate_config(data)


def build_optimizer(params: Any, config: Config | OptimizerConfig) -> torch.optim.Optimizer:
    """Build the configured ``torch.optim`` optimizer over ``params``.

    A config from :func:`validate_config` always builds; one made by hand that torch refuses
    raises :class:`ConfigError` (never torch's own ``ValueError``).

    Example:
        >>> import torch
        >>> from trainopt.config import OptimizerConfig
        >>> from trainopt.config import build_optimizer
        >>> cfg = OptimizerConfig("sgd", 0.1, {"momentum": 0.9})
        >>> build_optimizer(torch.nn.Linear(2, 1).parameters(), cfg).param_groups[0]["momentum"]
        0.9
    """
    config = getattr(config, "optimizer", config)
    classes = {name: OPTIMIZERS[name].cls for name in OPTIMIZER_SETTINGS}
    if config.type not in classes:
        raise ConfigError(
            "training.optimizer.type", f"must be one of {list(classes)}, got {config.type!r}"
        )
    try:
        return classes[config.type](params, lr=config.lr, **config.settings)
    except (ValueError, TypeError) as exc:  # a config built by hand, not by validate_config
        raise ConfigError(
            "training.optimizer", f"torch.optim.{classes[config.type].__name__} refuses it: {exc}"
        ) from exc
