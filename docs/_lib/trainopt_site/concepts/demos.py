"""Build-time figures of the concepts page (docs/concepts/optimization.md).

The page's training runs are :func:`trainopt.concepts.train_digits_adam` (in the library: the
page's examples call it).

- :func:`bias_correction_figure` — how far uncorrected Adam's steps are from corrected ones.
- :func:`warmup_figure` — the schedule, and the early losses of Adam with and without warm-up.
"""

from __future__ import annotations

from typing import Any

import torch

from trainopt.concepts.rules import (
    AdamState,
    adam_step_size_factor,
    adam_update,
    warmup_cosine_lr,
)
from trainopt.concepts.training import train_digits_adam


def bias_correction_figure(steps: int = 200, seed: int = 0) -> Any:
    """Left: the factor by which uncorrected Adam mis-sizes step ``t``, for three ``β`` pairs.
    Right: step sizes of Adam with and without bias correction on a noisy gradient.

    Example:
        >>> from trainopt_site.concepts.demos import bias_correction_figure
        >>> len(bias_correction_figure(steps=20).axes)
        2
    """
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    t = torch.arange(1, steps + 1, dtype=torch.float64)
    for betas in [(0.9, 0.999), (0.9, 0.99), (0.9, 0.9)]:
        left.plot(t, adam_step_size_factor(t, betas), label=f"β1={betas[0]}, β2={betas[1]}")
    left.axhline(1.0, color="grey", lw=0.8, ls="--")
    left.set(
        xscale="log",
        xlabel="step t",
        ylabel="uncorrected / corrected step",
        title="(1-β1^t) / sqrt(1-β2^t)",
    )
    left.legend(fontsize=8)

    generator = torch.Generator().manual_seed(seed)
    grads = 1.0 + 0.5 * torch.randn(steps, generator=generator, dtype=torch.float64)
    for correct, label in [(True, "with bias correction"), (False, "without bias correction")]:
        param = torch.zeros(1, dtype=torch.float64)
        state, sizes = AdamState.zeros_like(param), []
        for g in grads:
            new, state = adam_update(param, g.reshape(1), state, lr=1e-3, bias_correction=correct)
            sizes.append(float((param - new).abs()) / 1e-3)
            param = new
        right.plot(range(1, steps + 1), sizes, label=label)
    right.set(
        xscale="log",
        xlabel="step t",
        ylabel="|step| / lr",
        title="Adam on a noisy gradient (mean 1)",
    )
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def warmup_figure(
    lr: float = 0.03, warmup_steps: int = 50, steps: int = 60, total_steps: int = 200
) -> Any:
    """Left: the learning rate with and without warm-up. Right: Adam's losses in the first steps.

    Example:
        >>> from trainopt_site.concepts.demos import warmup_figure
        >>> len(warmup_figure(steps=5).axes)
        2
    """
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    for warm, label in [(0, "no warm-up"), (warmup_steps, f"{warmup_steps} warm-up steps")]:
        left.plot(
            [
                warmup_cosine_lr(t, max_lr=lr, warmup_steps=warm, total_steps=total_steps)
                for t in range(total_steps + 20)
            ],
            label=label,
        )
        right.plot(train_digits_adam(lr, warm, steps=steps, total_steps=total_steps), label=label)
    left.set(xlabel="step", ylabel="learning rate", title="warm-up, then cosine decay")
    right.set(
        yscale="log",
        xlabel="step",
        ylabel="training loss",
        title=f"Adam, peak lr {lr}, 6-layer MLP",
    )
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
