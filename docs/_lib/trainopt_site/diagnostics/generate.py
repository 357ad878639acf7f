"""The grid of fresh runs with a known cause that :func:`trainopt.diagnostics.diagnose` is
proven on.

The troubleshooting page's recorded runs (:mod:`trainopt_site.diagnostics.runs`) were there while
``diagnose`` was written. The runs of this grid are generated on demand by
:func:`trainopt.diagnostics.generate_run`, with other seeds, model widths and optimizers, and with
faults as they happen in practice; :data:`FITTING` says which findings fit each cause. The tests
(``tests/diagnostics/test_generated.py``) score ``diagnose`` on them.
"""

from __future__ import annotations

from typing import NamedTuple

from trainopt.diagnostics.known_causes import SETTINGS

FITTING: dict[str, frozenset[str]] = {
    "healthy": frozenset(),
    "lr_too_high": frozenset({"loss_explosion", "gradient_explosion", "diverging", "nan_inf"}),
    "lr_too_low": frozenset({"plateau", "slow_convergence"}),
    "gradient_spike": frozenset({"gradient_explosion", "loss_explosion"}),
    "nan_sample": frozenset({"nan_inf"}),
    "high_momentum": frozenset(
        {"oscillating", "diverging", "loss_explosion", "gradient_explosion"}
    ),
}
"""For each cause, the symptoms whose advice fits it: the first finding should be one of them."""


class RunSpec(NamedTuple):
    """One generated run: its cause, optimizer, hidden width and seed.

    Example:
        >>> from trainopt_site.diagnostics.generate import RunSpec
        >>> RunSpec("lr_too_high", "sgd", 128, 0).cause
        'lr_too_high'
    """

    cause: str
    optimizer: str
    hidden: int
    seed: int


def run_grid(
    seeds: tuple[int, ...] = (0, 1, 2), widths: tuple[int, ...] = (32, 128)
) -> list[RunSpec]:
    """Every cause with every optimizer it applies to, on each seed and hidden width.

    Example:
        >>> from trainopt_site.diagnostics.generate import run_grid
        >>> grid = run_grid()
        >>> len(grid), sum(spec.cause == "healthy" for spec in grid)
        (66, 12)
    """
    return [
        RunSpec(cause, opt, hidden, seed)
        for (cause, opt) in SETTINGS
        for hidden in widths
        for seed in seeds
    ]
