"""Stochastic rounding to bf16: small updates to bf16 weights survive in expectation.

bf16 has 8 significant bits, so adding an update smaller than half the gap between two bf16
numbers (``2**-8`` of the weight or less) and rounding to nearest gives the weight back
unchanged: training with pure-bf16 weights stalls. Rounding up or down at random, with the
probability of rounding up equal to how far the value lies towards the upper neighbour, makes
the rounded value right on average, so the update is kept in expectation.
"""

from __future__ import annotations

import torch

_HIGH_HALF = -(1 << 16)  # int32 0xFFFF0000: the bits that bf16 keeps of an fp32 number


def stochastic_round_to_bf16(
    x: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Round ``x`` to bf16, up or down at random, so that ``E[result] = x``.

    A bf16 number is the high 16 bits of an fp32 one. Adding a uniform random integer in
    ``[0, 2**16)`` to the fp32 bits, then cutting the low 16 bits, rounds up exactly with the
    probability of the cut fraction. Infinities stay infinite and NaNs stay NaN.

    Args:
        x: Any floating tensor (computed in fp32).
        generator: A ``torch.Generator`` on ``x``'s device, for reproducible draws.

    Example:
        >>> import torch
        >>> from trainopt.perf import stochastic_round_to_bf16
        >>> x = torch.full((100_000,), 1.0 + 2**-9)  # a quarter of the way from 1 to the next bf16
        >>> x.bfloat16().unique().tolist()  # round to nearest: always down
        [1.0]
        >>> rounded = stochastic_round_to_bf16(x, torch.Generator().manual_seed(0))
        >>> up = round((rounded > 1).float().mean().item(), 2)  # a quarter
        >>> rounded.unique().tolist(), up
        ([1.0, 1.0078125], 0.25)
    """
    x = x.float().contiguous()
    noise = torch.randint(
        0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator
    )
    bits = (x.view(torch.int32) + noise) & _HIGH_HALF
    rounded = bits.view(torch.float32).to(torch.bfloat16)  # exact: the low 16 bits are zero
    return torch.where(torch.isnan(x), x.to(torch.bfloat16), rounded)
