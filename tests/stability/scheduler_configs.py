"""Every scheduler the stability tests cover: each class of torch.optim.lr_scheduler and of
trainopt.schedules (the registry's included), built on an optimizer of two param groups."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim import lr_scheduler as ls

from trainopt.schedules import AdaptiveLearningRate, PolynomialDecaySchedule, build_scheduler
from trainopt.schedules.registry import registered_schedulers

STEPS = 60

TORCH: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "LambdaLR": lambda o: ls.LambdaLR(o, lambda e: 0.95**e),
    "MultiplicativeLR": lambda o: ls.MultiplicativeLR(o, lambda e: 0.97),
    "StepLR": lambda o: ls.StepLR(o, step_size=5, gamma=0.5),
    "MultiStepLR": lambda o: ls.MultiStepLR(o, milestones=[5, 15, 30], gamma=0.3),
    "ConstantLR": lambda o: ls.ConstantLR(o, factor=0.5, total_iters=8),
    "LinearLR": lambda o: ls.LinearLR(o, start_factor=0.2, total_iters=10),
    "ExponentialLR": lambda o: ls.ExponentialLR(o, gamma=0.9),
    "SequentialLR": lambda o: ls.SequentialLR(
        o,
        [
            ls.LinearLR(o, start_factor=0.1, total_iters=5),
            ls.CosineAnnealingLR(o, T_max=20, eta_min=0.02),
            ls.ExponentialLR(o, gamma=0.9),
        ],
        milestones=[5, 30],
    ),
    "PolynomialLR": lambda o: ls.PolynomialLR(o, total_iters=40, power=2.0),
    "CosineAnnealingLR": lambda o: ls.CosineAnnealingLR(o, T_max=15, eta_min=0.01),
    "ChainedScheduler": lambda o: ls.ChainedScheduler(
        [
            ls.ConstantLR(o, factor=0.5, total_iters=6),
            ls.CosineAnnealingLR(o, T_max=25, eta_min=0.005),
        ]
    ),
    "ReduceLROnPlateau": lambda o: ls.ReduceLROnPlateau(o, factor=0.5, patience=1, min_lr=0.004),
    "CyclicLR": lambda o: ls.CyclicLR(
        o, base_lr=[0.01, 0.005], max_lr=[0.1, 0.05], step_size_up=4, mode="triangular2"
    ),
    "OneCycleLR": lambda o: ls.OneCycleLR(o, max_lr=[0.1, 0.05], total_steps=STEPS),
    "CosineAnnealingWarmRestarts": lambda o: ls.CosineAnnealingWarmRestarts(
        o, T_0=5, T_mult=2, eta_min=0.01
    ),
}

REGISTERED = {
    "linear_warmup_decay": {"total_steps": 40, "warmup_steps": 5},
    "cosine_annealing": {"total_steps": 40, "warmup_steps": 5, "min_lr": 0.01},
    "step_decay": {"decay_steps": 10, "decay_rate": 0.5},
    "wsd": {"total_steps": 40, "warmup_steps": 5, "decay_steps": 10, "min_lr": 0.01},
    "cyclical": {"base_lr": 0.01, "max_lr": 0.1, "step_size": 4, "mode": "triangular2"},
}


def _adaptive(optimizer: torch.optim.Optimizer) -> AdaptiveLearningRate:
    """Half-way down from its rate: a falling loss moves it up, a rising one down."""
    scheduler = AdaptiveLearningRate(optimizer, initial_lr=0.1, min_lr=0.02, window=2)
    scheduler.scale = 0.5
    scheduler._apply()
    return scheduler


PROJECT: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    **{
        f"registry: {name}": (lambda o, n=name: build_scheduler(o, {"type": n, **REGISTERED[n]}))
        for name in registered_schedulers()
    },
    "PolynomialDecaySchedule": lambda o: PolynomialDecaySchedule(
        0.1, total_steps=40, warmup_steps=5, min_lr=0.01
    ).as_lr_scheduler(o),
    "AdaptiveLearningRate": lambda o: _adaptive(o),
}
SCHEDULERS = {**TORCH, **PROJECT}


def two_groups() -> torch.optim.Optimizer:
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    return torch.optim.SGD(
        [{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.05}], lr=0.1, momentum=0.9
    )
