"""The tuning task of the examples: AdamW on the digits MLP, reported to a trial as it trains."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import optuna
import torch
import torch.nn.functional as F

from trainopt.hpo.reporter import TrialReporter
from trainopt.models import digits_loaders, digits_mlp, evaluate
from trainopt.validation import check_int

OBJECTIVES = {"val_loss": "minimize", "val_accuracy": "maximize", "n_params": "minimize"}


def train_digits(
    lr: float = 1e-3,
    weight_decay: float = 1e-2,
    steps: int = 150,
    hidden: int = 128,
    depth: int = 2,
    batch_size: int = 64,
    reporter: TrialReporter | None = None,
    device: str | torch.device = "cpu",
    seed: int = 0,
    num_threads: int | None = 1,
) -> tuple[float, float]:
    """Train the digits MLP with AdamW for ``steps`` steps; return ``(val_loss, val_accuracy)``.

    With a ``reporter``, the validation loss is reported every ``reporter.report_every``
    steps, and the trial stops early when the pruner says so. The defaults are AdamW's own
    (``lr=1e-3``, ``weight_decay=1e-2``): the baseline a study has to beat.

    The MLP is too small to gain from intra-op threads, and on a busy machine extra threads
    only contend: it trains with ``num_threads`` CPU threads (restored afterwards; ``None``
    keeps torch's setting). Run more trials side by side instead.

    Example:
        >>> from trainopt.hpo.digits import train_digits
        >>> val_loss, val_accuracy = train_digits(steps=60)
        >>> val_accuracy > 0.8
        True
    """
    check_int("steps", steps, 1)
    threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        train, val = digits_loaders(batch_size=batch_size, seed=seed)
        model = digits_mlp(hidden=hidden, depth=depth, seed=seed).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
        batches = itertools.chain.from_iterable(itertools.repeat(train))
        for step, (xb, yb) in zip(range(steps), batches):
            loss = F.cross_entropy(model(xb.to(device)), yb.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if reporter is not None and reporter.due(step):
                reporter.report(evaluate(model, val, device)[0], step)
        return evaluate(model, val, device)
    finally:
        torch.set_num_threads(threads)


def digits_objective(
    trial: optuna.Trial,
    params: dict[str, Any],
    steps: int = 150,
    report_every: int = 25,
    objectives: Sequence[str] = ("val_loss",),
    device: str | torch.device = "cpu",
) -> float | list[float]:
    """Objective for :func:`trainopt.hpo.study.tune`: train with the trial's ``params``, return the
    objectives.

    ``params`` may set ``lr``, ``weight_decay``, ``hidden``, ``depth`` and ``batch_size``;
    the rest keep :func:`train_digits`' defaults. ``objectives`` picks from ``"val_loss"``,
    ``"val_accuracy"`` and ``"n_params"`` (directions in ``OBJECTIVES``); with more than
    one, the trial is not pruned (Optuna can't prune a multi-objective study).

    Example:
        >>> import optuna
        >>> from trainopt.hpo.digits import digits_objective
        >>> trial = optuna.create_study().ask()
        >>> loss = digits_objective(trial, {"lr": 3e-3}, steps=30, report_every=10)
        >>> sorted(trial.study.trials[0].intermediate_values), loss < 1.0
        ([9, 19, 29], True)
    """
    unknown = sorted(set(params) - {"lr", "weight_decay", "hidden", "depth", "batch_size"})
    if unknown:
        raise ValueError(
            f"digits_objective takes lr, weight_decay, hidden, depth, batch_size; got {unknown}"
        )
    bad = [name for name in objectives if name not in OBJECTIVES]
    if bad or not objectives:
        raise ValueError(
            f"objectives must be a non-empty list from {sorted(OBJECTIVES)}, got {list(objectives)}"
        )
    reporter = TrialReporter(
        trial, report_every, prune=len(objectives) == 1 and objectives[0] == "val_loss"
    )
    val_loss, val_accuracy = train_digits(steps=steps, reporter=reporter, device=device, **params)
    n_params = sum(
        p.numel()
        for p in digits_mlp(
            params.get("hidden", 128), params.get("depth", 2), seed=None
        ).parameters()
    )
    results = {"val_loss": val_loss, "val_accuracy": val_accuracy, "n_params": float(n_params)}
    values = [results[name] for name in objectives]
    return values[0] if len(values) == 1 else values
