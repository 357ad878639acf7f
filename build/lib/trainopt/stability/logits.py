"""Keep logits small in large language models: z-loss on the output, QK-norm in attention.

Two instabilities of large Transformers show up as growing logits (Wortsman et al. 2023,
arXiv:2309.14322). The output logits drift: cross-entropy is blind to adding a constant to every
logit, so their log-normaliser :math:`\\log Z` can wander until the softmax loses precision.
PaLM's z-loss (Chowdhery et al. 2022, arXiv:2204.02311) adds :math:`10^{-4} \\log^2 Z` to pull it
back to 0. The attention logits grow with the norms of the queries and keys until the softmax is
one-hot; QK-norm (Dehghani et al. 2023, arXiv:2302.05442) normalises queries and keys, which
bounds every logit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["qk_norm", "z_loss"]


def z_loss(logits: torch.Tensor, weight: float = 1e-4) -> torch.Tensor:
    """PaLM's auxiliary loss: ``weight`` times the mean squared log-normaliser of the softmax.

    With :math:`\\log Z = \\operatorname{logsumexp}(\\text{logits})` over the last dimension, it
    is :math:`w \\cdot \\operatorname{mean}(\\log^2 Z)`. Add it to the cross-entropy; it is zero
    when the logits are already log-probabilities.

    Args:
        logits: Unnormalised scores, classes in the last dimension.
        weight: The coefficient :math:`w` (PaLM uses ``1e-4``).

    Example:
        >>> import torch
        >>> from trainopt.stability import z_loss
        >>> logits = torch.full((2, 4), 10.0)  # log Z = 10 + log 4
        >>> round(z_loss(logits).item(), 6)
        0.012965
        >>> float(z_loss(logits.log_softmax(-1)))  # log Z = 0: nothing to pull back
        0.0
    """
    if weight < 0:
        raise ValueError(f"weight must be >= 0, got {weight=}")
    return weight * torch.logsumexp(logits.float(), dim=-1).square().mean()


def qk_norm(
    q: torch.Tensor, k: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMS-normalise queries and keys over the head dimension, before the attention logits.

    Each vector then has norm :math:`\\sqrt{d}`, so every logit :math:`q \\cdot k / \\sqrt{d}` lies
    in :math:`[-\\sqrt{d}, \\sqrt{d}]` whatever the weights do. Models give each normalisation a
    learnable gain (a ``torch.nn.RMSNorm`` or ``LayerNorm`` per head); this is the bare operation.

    Args:
        q: Queries, ``(..., seq, d)``.
        k: Keys, ``(..., seq, d)``.
        eps: Added to the mean square before the square root.

    Example:
        >>> import torch
        >>> from trainopt.stability import qk_norm
        >>> q, k = qk_norm(torch.randn(5, 16) * 100, torch.randn(5, 16) * 100)
        >>> bool(((q @ k.T) / 16**0.5).abs().max() <= 4.0 + 1e-4)
        True
    """
    return F.rms_norm(q, (q.shape[-1],), eps=eps), F.rms_norm(k, (k.shape[-1],), eps=eps)
