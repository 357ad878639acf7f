"""Load a checkpoint all or nothing: check that every piece fits, and put everything back if
one does not.

:func:`load_all_or_nothing` is what
:class:`~trainopt.stability.checkpointing.checkpoint.CheckpointManager` loads with. A checkpoint
that does not fit one piece raises :class:`~trainopt.stability.checkpointing.files.CheckpointError`
naming that piece and what does not fit, and every object is left as it was:

- the model is checked before anything is loaded (missing and unexpected keys, an entry that is
  not a tensor where the model holds one, shapes), and loaded last, once everything else went in;
- the optimizer must have as many groups, of the same sizes, with no hyperparameter of another
  optimizer class, and every state tensor must have the shape its parameter's state has: the
  parameter's own shape for per-parameter state (``exp_avg``, ``momentum_buffer``, ...), the
  shape of the optimizer's current state where it has some. A misfit names the group, the
  position, the model's name of the parameter and its index in the file. The optimizer is put
  back by reference (``load_state_dict`` builds new state, so the old one is intact);
- a scheduler's state must have the same keys, values of the same kinds, and as many per-group
  entries;
- the scaler, the extra objects and the random number generators check themselves in
  ``load_state_dict``;
- any exception of a piece's ``load_state_dict`` becomes the error ``fail`` builds, and every
  piece loaded before the one that failed is put back from a copy of its state.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from numbers import Real
from typing import Any

import torch

__all__ = ["load_all_or_nothing"]


def _hyperparameters(cls: type) -> set[str]:
    return {
        name
        for name in inspect.signature(cls.__init__).parameters
        if name not in ("self", "params")
    }


_ALL_HYPERPARAMETERS = set().union(
    *(
        _hyperparameters(cls)
        for cls in vars(torch.optim).values()
        if isinstance(cls, type)
        and issubclass(cls, torch.optim.Optimizer)
        and cls is not torch.optim.Optimizer
    )
)

# State that torch.optim keeps in the shape of its parameter (Adafactor's row_var and col_var,
# LBFGS's flat vectors are not; they are checked against the optimizer's own state where it
# has some).
_PER_PARAMETER = frozenset(
    {
        "exp_avg",
        "exp_avg_sq",
        "max_exp_avg_sq",
        "momentum_buffer",
        "square_avg",
        "acc_delta",
        "sum",
        "exp_inf",
        "ax",
        "prev",
        "step_size",
        "grad_avg",
        "variance",
    }
)


def _model_misfit(model: torch.nn.Module, loaded: Any) -> str | None:
    if not isinstance(loaded, dict):
        return f"a {type(loaded).__name__}, not a state dict"
    current = model.state_dict()
    missing = sorted(set(current) - set(loaded), key=str)
    unexpected = sorted(set(loaded) - set(current), key=str)
    wrong = []
    for key, ours in current.items():
        if key not in loaded or not torch.is_tensor(ours):
            continue
        if not torch.is_tensor(loaded[key]):
            wrong.append(
                f"{key}: a {type(loaded[key]).__name__} in the file, a tensor in the model"
            )
        elif loaded[key].shape != ours.shape:
            wrong.append(
                f"{key}: {tuple(loaded[key].shape)} in the file, {tuple(ours.shape)} in the model"
            )
    problems = (
        ([f"missing keys {missing[:5]}"] if missing else [])
        + ([f"unexpected keys {unexpected[:5]}"] if unexpected else [])
        + wrong[:5]
    )
    return "; ".join(problems) or None


def _optimizer_misfit(
    optimizer: torch.optim.Optimizer, loaded: Any, names: dict[int, str]
) -> str | None:
    if (
        not isinstance(loaded, dict)
        or not isinstance(loaded.get("param_groups"), list)
        or not isinstance(loaded.get("state"), dict)
    ):
        return "not an optimizer state dict: it needs a list 'param_groups' and a dict 'state'"
    groups = loaded["param_groups"]
    if len(groups) != len(optimizer.param_groups):
        return (
            f"{len(groups)} param groups in the file, "
            f"{len(optimizer.param_groups)} in the optimizer"
        )
    for index, (group, ours) in enumerate(zip(groups, optimizer.param_groups)):
        if not isinstance(group, dict) or not isinstance(group.get("params"), list):
            return f"param_groups[{index}] is not a dict with a list 'params'"
        if len(group["params"]) != len(ours["params"]):
            return (
                f"param_groups[{index}] has {len(group['params'])} parameters in the file, "
                f"{len(ours['params'])} in the optimizer"
            )
        own = _hyperparameters(type(optimizer)) | set(optimizer.defaults) | set(ours)
        foreign = sorted((set(group) & _ALL_HYPERPARAMETERS) - own)
        if foreign:
            return (
                f"param_groups[{index}] has {foreign}, settings that "
                f"{type(optimizer).__name__} does not have: a checkpoint of another optimizer"
            )
    return _optimizer_state_misfit(optimizer, groups, loaded["state"], names)


def _expected_shape(
    key: str, value: torch.Tensor, param: torch.Tensor, current: Any
) -> torch.Size | None:
    """The shape a state tensor must have: its current state's, its parameter's, or free
    (``None``)."""
    if torch.is_tensor(current):
        return current.shape
    if key in _PER_PARAMETER or (value.ndim == param.ndim and value.numel() == param.numel()):
        return param.shape  # the second: a transposed or reshaped copy of another parameter's state
    return None


def _optimizer_state_misfit(
    optimizer: torch.optim.Optimizer,
    groups: list[dict[str, Any]],
    state: dict[Any, Any],
    names: dict[int, str],
) -> str | None:
    """Before loading: each parameter's saved state has the shapes its parameter's state has."""
    for g, (group, ours) in enumerate(zip(groups, optimizer.param_groups)):
        for position, (index, param) in enumerate(zip(group["params"], ours["params"])):
            entry = state.get(index)
            if entry is None:
                continue
            name = f"{names[id(param)]!r}, " if id(param) in names else ""
            where = f"param_groups[{g}] parameter {position} ({name}index {index})"
            if not isinstance(entry, dict):
                return f"{where}: its state is a {type(entry).__name__}, not a dict"
            current = optimizer.state.get(param, {})
            for key, value in entry.items():
                if not torch.is_tensor(value):
                    if key in _PER_PARAMETER and value is not None:
                        return f"{where}: state {key!r} is a {type(value).__name__}, not a tensor"
                    continue
                expected = _expected_shape(key, value, param, current.get(key))
                if expected is not None and value.shape != expected:
                    return (
                        f"{where}: state {key!r} has shape {tuple(value.shape)} in the file, "
                        f"{tuple(expected)} in the optimizer: saved for another model or "
                        "parameter order"
                    )
    return None


_PER_GROUP = (
    "base_lrs",
    "_last_lr",
    "lr_lambdas",
    "max_lrs",
    "min_lrs",
    "base_momentums",
    "max_momentums",
    "cycle_base_lrs",
    "cycle_max_lrs",
    "ratios",
    "_schedulers",
)


def _kind(value: Any) -> str | None:
    """The kind a scheduler's value must keep: a number, a string, a list (or ``None``: any)."""
    if isinstance(value, Real) and not isinstance(value, bool):
        return "a number"
    return {str: "a string", list: "a list"}.get(type(value))


def _structure_misfit(current: dict[str, Any], loaded: Any) -> str | None:
    """Same keys, values of the same kind, and as many entries per group (a scheduler's
    load_state_dict checks nothing)."""
    if not isinstance(loaded, dict):
        return f"a {type(loaded).__name__}, not a state dict"
    if set(current) != set(loaded):
        return f"keys {sorted(set(loaded) ^ set(current))} differ: the state of another scheduler"
    for key, value in current.items():
        kind = _kind(value)
        if kind is not None and _kind(loaded[key]) != kind:
            return f"{key} is a {type(loaded[key]).__name__} in the file, {kind} here"
        if key in _PER_GROUP and isinstance(value, list) and len(value) != len(loaded[key]):
            return f"{key} has {len(loaded[key])} entries in the file, {len(value)} here"
    return None


def _put_back_optimizer(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    state, groups = optimizer.state, optimizer.param_groups

    def put_back() -> None:
        optimizer.state, optimizer.param_groups = state, groups

    return put_back


def _put_back(obj: Any) -> Callable[[], None]:
    saved = copy.deepcopy(obj.state_dict())
    return lambda: obj.load_state_dict(saved)


def load_all_or_nothing(
    model: torch.nn.Module,
    model_state: dict[str, Any],
    pieces: list[tuple[str, Any, Any]],
    fail: Callable[[str, str], Exception],
) -> None:
    """Load ``model_state`` and each piece's state, or nothing at all.

    Args:
        model: The model (checked first, loaded last; its parameter names name the optimizer's).
        model_state: Its state from the checkpoint.
        pieces: ``(name, object, state)`` for the optimizer, the scheduler, the scaler and the
            extra objects (a ``None`` object is skipped; the name ``"scheduler"`` gets the
            scheduler checks).
        fail: Builds the error to raise from a piece name and what does not fit; every failure
            of a piece's checks or of its ``load_state_dict`` is raised as this error.

    Example:
        >>> import torch
        >>> from trainopt.stability.checkpointing.fit import load_all_or_nothing
        >>> model = torch.nn.Linear(2, 1); opt = torch.optim.AdamW(model.parameters())
        >>> other = torch.nn.Linear(3, 1).state_dict()
        >>> try:
        ...     load_all_or_nothing(model, other, [("optimizer", opt, opt.state_dict())],
        ...                         lambda piece, why: ValueError(f"{piece}: {why}"))
        ... except ValueError as error:
        ...     print(error)
        model: weight: (1, 3) in the file, (1, 2) in the model
    """
    names = {id(p): name for name, p in model.named_parameters()}
    refusals: list[BaseException] = []

    def refuse(piece: str, why: str) -> Exception:
        refusals.append(error := fail(piece, why))
        return error

    undo: list[Callable[[], None]] = []
    piece = "model"
    try:
        if misfit := _model_misfit(model, model_state):
            raise refuse("model", misfit)
        for piece, obj, state in pieces:
            if obj is None:
                continue
            if isinstance(obj, torch.optim.Optimizer):
                if misfit := _optimizer_misfit(obj, state, names):
                    raise refuse(piece, misfit)
                undo.append(_put_back_optimizer(obj))
            else:
                if piece == "scheduler" and (misfit := _structure_misfit(obj.state_dict(), state)):
                    raise refuse(piece, misfit)
                undo.append(_put_back(obj))
            obj.load_state_dict(state)
        piece = "model"
        model.load_state_dict(model_state)
    except BaseException as exc:
        for put_back in reversed(undo):
            put_back()
        if not isinstance(exc, Exception) or any(exc is r for r in refusals):
            raise
        raise refuse(piece, f"{type(exc).__name__}: {exc}") from exc
