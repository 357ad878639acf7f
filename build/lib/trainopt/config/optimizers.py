"""The one vocabulary of optimizers: the names every trainopt function takes, and what each is.

A YAML config (``training.optimizer.type``), the memory estimates and the traced estimate name an
optimizer the same way; each entry says which ``torch.optim`` class it builds, with what, which
settings a config may give it, and how many bytes of fp32 state it keeps per parameter element.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["OPTIMIZERS", "OptimizerKind", "optimizer_kind"]


@dataclass(frozen=True)
class OptimizerKind:
    """One named optimizer: its ``torch.optim`` class and what the project knows of it.

    Example:
        >>> from trainopt.config.optimizers import OPTIMIZERS
        >>> kind = OPTIMIZERS["adamw"]
        >>> kind.cls.__name__, kind.state_bytes, "betas" in kind.settings
        ('AdamW', 8, True)
    """

    name: str
    cls: type[torch.optim.Optimizer]
    settings: tuple[str, ...]
    """The keyword arguments a config may give it (``lr`` among them)."""
    state_bytes: int
    """Bytes of fp32 optimizer state per parameter element (0 for plain SGD, 8 for Adam's two)."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """What the name implies beyond torch's defaults (``sgd_momentum``: ``momentum=0.9``)."""

    def build(self, params: Iterable[torch.Tensor], **settings: Any) -> torch.optim.Optimizer:
        """``cls(params, **defaults, **settings)``.

        Example:
            >>> import torch
            >>> from trainopt.config.optimizers import OPTIMIZERS
            >>> opt = OPTIMIZERS["sgd_momentum"].build([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
            >>> type(opt).__name__, opt.param_groups[0]["momentum"]
            ('SGD', 0.9)
        """
        return self.cls(params, **{**self.defaults, **settings})


_SGD = ("lr", "weight_decay", "momentum", "nesterov")
_ADAM = ("lr", "weight_decay", "betas", "eps")
OPTIMIZERS: dict[str, OptimizerKind] = {
    kind.name: kind
    for kind in (
        OptimizerKind("sgd", torch.optim.SGD, _SGD, 0),
        OptimizerKind("sgd_momentum", torch.optim.SGD, _SGD, 4, {"momentum": 0.9}),
        OptimizerKind("adam", torch.optim.Adam, _ADAM, 8),
        OptimizerKind("adamw", torch.optim.AdamW, _ADAM, 8),
    )
}


def optimizer_kind(
    name: str, field_name: str = "optimizer", allowed: Iterable[str] | None = None
) -> OptimizerKind:
    """The entry of ``name``, refusing any other name with an error that names the field.

    Example:
        >>> from trainopt.config.optimizers import optimizer_kind
        >>> optimizer_kind("adamw").state_bytes
        8
        >>> try:
        ...     optimizer_kind("lion")
        ... except ValueError as error:
        ...     print(error)
        optimizer must be one of ['sgd', 'sgd_momentum', 'adam', 'adamw'], got 'lion'
    """
    names = list(OPTIMIZERS) if allowed is None else list(allowed)
    if name not in names:
        raise ValueError(f"{field_name} must be one of {names}, got {name!r}")
    return OPTIMIZERS[name]
