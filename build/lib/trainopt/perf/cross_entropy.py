"""A language-model head and its loss over chunks of tokens: never the full logits.

``F.cross_entropy(hidden @ weight.T, targets)`` materialises an ``N × V`` logits tensor, keeps
its fp32 log-softmax for backward, and briefly holds two more ``N × V`` fp32 buffers in the
backward pass. For a 50k vocabulary that is the largest part of a small model's peak.
:func:`chunked_linear_cross_entropy` computes the same loss a chunk of tokens at a time, and
computes the gradients with respect to ``hidden`` and ``weight`` in the same pass, so only one
``chunk_size × V`` block of logits is alive at once and nothing of size ``N × V`` is saved
(the idea of Liger Kernel's fused linear cross-entropy and of Cut Cross-Entropy, in plain
PyTorch).
"""

from __future__ import annotations

from typing import Any

import torch

from trainopt.validation import check_int


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        ignore_index: int,
        chunk_size: int,
        reduction: str,
    ) -> torch.Tensor:
        counted = targets != ignore_index
        count = counted.sum() if reduction == "mean" else torch.ones((), device=targets.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if hidden.requires_grad else None
        grad_weight = (
            torch.zeros_like(weight, dtype=torch.float32) if weight.requires_grad else None
        )
        for start in range(0, hidden.shape[0], chunk_size):
            h, t, keep = (v[start : start + chunk_size] for v in (hidden, targets, counted))
            logits = (h @ weight.T).float()  # matmul in the input's dtype, loss in fp32
            safe_t = torch.where(keep, t, 0).unsqueeze(1)
            log_z = torch.logsumexp(logits, dim=1)
            total += ((log_z - logits.gather(1, safe_t).squeeze(1)) * keep).sum()
            # d loss / d logits = softmax - one_hot, zero on ignored tokens, over the count
            grad_logits = logits.sub_(log_z.unsqueeze(1)).exp_()
            grad_logits.scatter_add_(
                1, safe_t, torch.full_like(safe_t, -1, dtype=grad_logits.dtype)
            )
            grad_logits.mul_((keep / count).unsqueeze(1))
            if grad_hidden is not None:
                grad_hidden[start : start + chunk_size] = grad_logits.to(weight.dtype) @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.T, h.float())
            del logits, grad_logits
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_loss.to(grad_hidden.dtype)
        if grad_weight is not None:
            grad_weight = (grad_weight * grad_loss).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int = 1024,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T, targets)`` a chunk of tokens at a time.

    The forward pass computes the loss and both gradients chunk by chunk (logits, their
    log-sum-exp in fp32, ``softmax − one_hot``) and saves only the gradients, of the sizes of
    ``hidden`` and ``weight``; backward scales them by the incoming gradient. At most one
    ``chunk_size × V`` fp32 block of logits is alive at a time, instead of several ``N × V``
    ones. The weight's gradient is accumulated in fp32 over the chunks.

    Args:
        hidden: Final hidden states, ``(..., d)`` (after the last LayerNorm).
        weight: The head's weight, ``(V, d)`` (no bias).
        targets: Class indices of shape ``hidden.shape[:-1]``.
        chunk_size: Tokens per chunk; need not divide the number of tokens.
        ignore_index: Targets with this value add nothing to the loss nor to the count.
        reduction: ``"mean"`` over counted tokens (as ``F.cross_entropy``) or ``"sum"``.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from trainopt.perf import chunked_linear_cross_entropy
        >>> hidden = torch.randn(10, 8, requires_grad=True)
        >>> weight = torch.randn(32, 8, requires_grad=True)
        >>> targets = torch.randint(0, 32, (10,))
        >>> loss = chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=3)
        >>> reference = F.cross_entropy(hidden @ weight.T, targets)
        >>> torch.allclose(loss, reference)
        True
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    check_int("chunk_size", chunk_size, 1)
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(
            f"targets must have shape {tuple(hidden.shape[:-1])}, got {tuple(targets.shape)}"
        )
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    return _ChunkedLinearCrossEntropy.apply(
        flat_hidden, weight, targets.reshape(-1), ignore_index, chunk_size, reduction
    )
