"""Load a checkpoint all or nothing: check that every piece fits, and put everything back if one does not.

:func:`load_all_or_nothing` is what :class:`~trainopt.stability.checkpoint.CheckpointManager`
loads with. A checkpoint that does not fit one piece raises
:class:`~trainopt.stability.checkpoint.CheckpointError` naming that piece and what does not fit,
and every object is left as it was:

- the model is checked before anything is loaded (missing and unexpected keys, shapes), and
  loaded last, once everything else went in;
- the optimizer must have as many groups, of the same sizes, with no hyperparameter of another
  optimizer class, and state tensors of its parameters' shapes; it is put back by reference
  (``load_state_dict`` builds new state, so the old one is intact);
- a scheduler's state must have the same keys and as many per-group entries;
- the scaler and the extra objects check themselves in ``load_state_dict``;
- every piece loaded before the one that failed is put back from a copy of its state.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["load_all_or_nothing"]


def _hyperparameters(cls: type) -> set[str]:
    return {name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "params")}


_ALL_HYPERPARAMETERS = set().union(*(
    _hyperparameters(cls) for cls in vars(torch.optim).values()
    if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer))


def _model_misfit(model: torch.nn.Module, loaded: dict[str, Any]) -> str | None:
    current = model.state_dict()
    missing = sorted(set(current) - set(loaded))
    unexpected = sorted(set(loaded) - set(current))
    shapes = [f"{k}: {tuple(loaded[k].shape)} in the file, {tuple(current[k].shape)} in the model"
              for k in current if k in loaded and torch.is_tensor(current[k]) and torch.is_tensor(loaded[k])
              and current[k].shape != loaded[k].shape]
    problems = ([f"missing keys {missing[:5]}"] if missing else []) + \
        ([f"unexpected keys {unexpected[:5]}"] if unexpected else []) + shapes[:5]
    return "; ".join(problems) or None


def _optimizer_misfit(optimizer: torch.optim.Optimizer, loaded: dict[str, Any]) -> str | None:
    groups = loaded.get("param_groups")
    if not isinstance(groups, list) or "state" not in loaded:
        return "no param_groups or state"
    if len(groups) != len(optimizer.param_groups):
        return f"{len(groups)} param groups in the file, {len(optimizer.param_groups)} in the optimizer"
    for index, (group, ours) in enumerate(zip(groups, optimizer.param_groups)):
        if len(group["params"]) != len(ours["params"]):
            return (f"param_groups[{index}] has {len(group['params'])} parameters in the file, "
                    f"{len(ours['params'])} in the optimizer")
        own = _hyperparameters(type(optimizer)) | set(optimizer.defaults) | set(ours)
        foreign = sorted((set(group) & _ALL_HYPERPARAMETERS) - own)
        if foreign:
            return (f"param_groups[{index}] has {foreign}, settings that {type(optimizer).__name__} does not "
                    "have: a checkpoint of another optimizer")
    return None


def _optimizer_state_misfit(optimizer: torch.optim.Optimizer) -> str | None:
    """After loading: state tensors shaped like their parameter (same rank) must match it."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if torch.is_tensor(value) and value.ndim == p.ndim and value.ndim > 0 and value.shape != p.shape:
                    return f"state {key!r} of shape {tuple(value.shape)} for a parameter of shape {tuple(p.shape)}"
    return None


_PER_GROUP = ("base_lrs", "_last_lr", "lr_lambdas", "max_lrs", "min_lrs", "base_momentums", "max_momentums",
              "cycle_base_lrs", "cycle_max_lrs", "ratios", "_schedulers")


def _structure_misfit(current: dict[str, Any], loaded: Any) -> str | None:
    """Same keys, and as many entries per group (a scheduler's load_state_dict checks nothing)."""
    if not isinstance(loaded, dict):
        return f"a {type(loaded).__name__}, not a state dict"
    if set(current) != set(loaded):
        return f"keys {sorted(set(loaded) ^ set(current))} differ: the state of another scheduler"
    for key, value in current.items():
        if key in _PER_GROUP and isinstance(value, list) and isinstance(loaded[key], list) \
                and len(value) != len(loaded[key]):
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


def load_all_or_nothing(model: torch.nn.Module, model_state: dict[str, Any],
                        pieces: list[tuple[str, Any, Any]], fail: Callable[[str, str], Exception]) -> None:
    """Load ``model_state`` and each piece's state, or nothing at all.

    Args:
        model: The model (checked first, loaded last).
        model_state: Its state from the checkpoint.
        pieces: ``(name, object, state)`` for the optimizer, the scheduler, the scaler and the
            extra objects (a ``None`` object is skipped; the name ``"scheduler"`` gets the
            scheduler checks).
        fail: Builds the error to raise from a piece name and what does not fit.

    Example:
        >>> import torch
        >>> from trainopt.stability.fit import load_all_or_nothing
        >>> model = torch.nn.Linear(2, 1); opt = torch.optim.AdamW(model.parameters())
        >>> other = torch.nn.Linear(3, 1).state_dict()
        >>> try:
        ...     load_all_or_nothing(model, other, [("optimizer", opt, opt.state_dict())],
        ...                         lambda piece, why: ValueError(f"{piece}: {why}"))
        ... except ValueError as error:
        ...     print(error)
        model: weight: (1, 3) in the file, (1, 2) in the model
    """
    misfit = _model_misfit(model, model_state)
    if misfit:
        raise fail("model", misfit)
    undo: list[Callable[[], None]] = []
    try:
        for name, obj, state in pieces:
            if obj is None:
                continue
            if isinstance(obj, torch.optim.Optimizer):
                misfit = _optimizer_misfit(obj, state)
                if misfit:
                    raise fail(name, misfit)
                undo.append(_put_back_optimizer(obj))
            else:
                if name == "scheduler":
                    misfit = _structure_misfit(obj.state_dict(), state)
                    if misfit:
                        raise fail(name, misfit)
                undo.append(_put_back(obj))
            try:
                obj.load_state_dict(state)
            except Exception as exc:
                raise fail(name, f"{type(exc).__name__}: {exc}") from exc
            if isinstance(obj, torch.optim.Optimizer) and (misfit := _optimizer_state_misfit(obj)):
                raise fail(name, misfit)
        model.load_state_dict(model_state)
    except BaseException:
        for put_back in reversed(undo):
            put_back()
        raise
