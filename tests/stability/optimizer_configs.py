"""Every optimizer configuration of the installed torch.optim that the stability tests cover.

Classes are found by walking ``torch.optim``; each gets the hyperparameter variants below (a
class without an entry, e.g. one a later torch adds, gets its defaults) in each implementation
it offers on the CPU: ``foreach=False``, ``foreach=True``, ``fused=True`` (tried, kept where
construction and a first step succeed).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

VARIANTS: dict[str, list[dict[str, Any]]] = {
    "SGD": [
        {},
        {"momentum": 0.9},
        {"momentum": 0.9, "nesterov": True},
        {"momentum": 0.9, "weight_decay": 0.01, "maximize": True},
        {"momentum": 0.9, "dampening": 0.1},
    ],
    "Adam": [{}, {"amsgrad": True, "weight_decay": 0.01}],
    "AdamW": [{}, {"amsgrad": True}],
    "Adagrad": [{}, {"lr_decay": 0.01, "initial_accumulator_value": 0.1}],
    "RMSprop": [{}, {"centered": True}, {"momentum": 0.9}, {"centered": True, "momentum": 0.9}],
    "NAdam": [{}, {"decoupled_weight_decay": True, "weight_decay": 0.01}],
    "RAdam": [{}, {"decoupled_weight_decay": True, "weight_decay": 0.01}],
    "ASGD": [{}, {"t0": 1.0}],
}

# What the stabilizer refuses, and why (the error must say so): the rest must be held exactly.
REFUSED = {
    "LBFGS": "closure",
    "SparseAdam": "sparse",
    "SGD(momentum=0.9, dampening=0.1)": "dampening",
}

# Muon only takes matrices; every other class trains a model with biases too.
MATRICES_ONLY = {"Muon"}


def optimizer_classes() -> list[type]:
    return sorted(
        (
            cls
            for cls in vars(torch.optim).values()
            if isinstance(cls, type)
            and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer
        ),
        key=lambda cls: cls.__name__,
    )


@dataclass(frozen=True)
class OptimizerConfig:
    cls: type
    settings: dict[str, Any]
    implementation: dict[str, Any]

    @property
    def name(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        impl = ", ".join(f"{k}={v}" for k, v in self.implementation.items())
        return f"{self.cls.__name__}({inner})" + (f" [{impl}]" if impl else "")

    @property
    def variant(self) -> str:
        return f"{self.cls.__name__}({', '.join(f'{k}={v}' for k, v in self.settings.items())})"

    def build(self, params: Any) -> torch.optim.Optimizer:
        lr = {"lr": 0.01} if "lr" in inspect.signature(self.cls.__init__).parameters else {}
        return self.cls(params, **lr, **self.settings, **self.implementation)

    def model(self, seed: int = 0) -> torch.nn.Module:
        torch.manual_seed(seed)
        bias = self.cls.__name__ not in MATRICES_ONLY
        if self.cls is torch.optim.SparseAdam:
            return torch.nn.Sequential(
                torch.nn.Embedding(8, 6, sparse=True), torch.nn.Linear(6, 3, bias=bias)
            )
        return torch.nn.Sequential(
            torch.nn.Linear(6, 5, bias=bias), torch.nn.Tanh(), torch.nn.Linear(5, 3, bias=bias)
        )


def _offered(cls: type, settings: dict[str, Any], implementation: dict[str, Any]) -> bool:
    config = OptimizerConfig(cls, settings, implementation)
    model = config.model()
    try:
        opt = config.build(model.parameters())
        x = torch.randint(0, 8, (4,)) if cls is torch.optim.SparseAdam else torch.randn(4, 6)
        model(x).sum().backward()
        opt.step(*((lambda: model(x).sum()),) if cls is torch.optim.LBFGS else ())
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def optimizer_configs() -> list[OptimizerConfig]:
    configs = []
    for cls in optimizer_classes():
        names = inspect.signature(cls.__init__).parameters
        implementations: list[dict[str, Any]] = [{}]
        if "foreach" in names:
            implementations = [{"foreach": False}, {"foreach": True}]
        if "fused" in names:
            implementations.append({"fused": True})
        for settings in VARIANTS.get(cls.__name__, [{}]):
            for implementation in implementations:
                if _offered(cls, settings, implementation) or cls.__name__ in (
                    "LBFGS",
                    "SparseAdam",
                ):
                    configs.append(OptimizerConfig(cls, settings, implementation))
                    if cls.__name__ in ("LBFGS", "SparseAdam"):
                        break
    return configs


CONFIGS = optimizer_configs()
HELD = [c for c in CONFIGS if c.cls.__name__ not in REFUSED and c.variant not in REFUSED]
REFUSED_CONFIGS = [c for c in CONFIGS if c.cls.__name__ in REFUSED or c.variant in REFUSED]


def ids(configs: list[OptimizerConfig]) -> list[str]:
    return [c.name for c in configs]


def nan_allocator(shapes: list[torch.Size], copies: int = 64) -> None:
    """Leave NaN in freed memory: a large block, and many blocks of the parameters' sizes."""
    big = torch.full((1 << 22,), float("nan"))
    small = [torch.full(shape, float("nan")) for shape in shapes for _ in range(copies)]
    del big, small


def optimizer_state(opt: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
    return {i: dict(s) for i, s in opt.state_dict()["state"].items()}


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Bitwise equal tensors (NaN where NaN), equal everything else."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.shape == b.shape, where
        assert torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all()), (
            f"{where}: max difference {(a.double() - b.double()).abs().max().item()}"
        )
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


Builder = Callable[[Any], torch.optim.Optimizer]
