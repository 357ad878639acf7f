"""The experiments behind the concepts page's claims, and its build-time figures."""

from __future__ import annotations

import matplotlib.figure

from trainopt.concepts import train_digits_adam
from trainopt_site.concepts.demos import bias_correction_figure, warmup_figure


def test_training_is_reproducible_for_a_seed() -> None:
    assert train_digits_adam(lr=1e-3, steps=10, seed=3) == train_digits_adam(
        lr=1e-3, steps=10, seed=3
    )


def test_warmup_removes_adams_early_loss_spike_for_two_seeds() -> None:
    for seed in (0, 1):
        no_warmup = train_digits_adam(lr=0.03, warmup_steps=0, steps=50, seed=seed)
        warmup = train_digits_adam(lr=0.03, warmup_steps=50, steps=50, seed=seed)
        assert max(no_warmup) > 1.25 * no_warmup[0]
        assert max(warmup) < 1.05 * warmup[0]


def test_figures_are_matplotlib_figures_with_two_panels() -> None:
    for fig in (bias_correction_figure(steps=30), warmup_figure(steps=5)):
        assert isinstance(fig, matplotlib.figure.Figure) and len(fig.axes) == 2
