"""A token-level loss that is the mean over the whole global batch, however the batch is split.

Averaging per-micro-batch or per-rank *means* gives the mean over the global batch only when
every micro-batch holds the same number of counted (unmasked) targets. With padding, packing
or variable-length sequences the counts differ, and the short micro-batches get too much
weight. :func:`token_normalized_loss` divides each micro-batch's *sum* by the count of the
whole global batch instead, which :func:`global_token_count` all-reduces once per step.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.nn.functional as F

IGNORE_INDEX = -100


def global_token_count(
    targets: torch.Tensor | Iterable[torch.Tensor], ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """The counted targets of one optimizer step: every micro-batch of every rank.

    Pass the targets of all the micro-batches this rank accumulates into one step. The count
    stays a tensor on the targets' device (no host sync); in a process group it is summed over
    the ranks with one all-reduce, so every rank gets the same number.

    Args:
        targets: One tensor of target ids, or the target tensors of this rank's micro-batches.
        ignore_index: The target id that marks a position not to count (padding, prompt).

    Returns:
        A 0-d int64 tensor: the number of targets not equal to ``ignore_index``.

    Example:
        >>> import torch
        >>> from trainopt.perf.distributed import global_token_count
        >>> y = torch.tensor([[5, 7, -100], [1, -100, -100]])
        >>> int(global_token_count(y)), int(global_token_count(y.chunk(2)))
        (3, 3)
    """
    if isinstance(targets, torch.Tensor):
        targets = [targets]
    count = sum((t != ignore_index).sum() for t in targets)
    if not isinstance(count, torch.Tensor):
        raise ValueError("targets must hold at least one tensor")
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count)
    return count


def token_normalized_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    global_tokens: torch.Tensor | int,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Cross-entropy of one micro-batch, summed and divided by the global batch's token count.

    DDP and FSDP average gradients over the ranks, so the sum is also multiplied by the world
    size. Summed over the micro-batches of a step and averaged over the ranks, the gradients
    are then exactly those of the mean loss over every counted token of the global batch.
    The value returned is a share of that mean: add it up over micro-batches and all-reduce
    the sum with ``AVG`` to log the step's loss.

    Args:
        logits: ``(..., vocab)`` scores of this micro-batch.
        targets: Target ids with the shape of ``logits`` without its last dimension.
        global_tokens: :func:`global_token_count` of the step (a tensor or an int).
        ignore_index: The target id that is not counted.

    Returns:
        A 0-d loss tensor to call ``backward()`` on.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from trainopt.perf.distributed import global_token_count, token_normalized_loss
        >>> logits = torch.randn(2, 3, 10)
        >>> y = torch.tensor([[5, 7, -100], [1, -100, -100]])
        >>> tokens = global_token_count(y.chunk(2))
        >>> parts = [token_normalized_loss(l, t, tokens)
        ...          for l, t in zip(logits.chunk(2), y.chunk(2))]
        >>> mean = F.cross_entropy(logits.flatten(0, 1), y.flatten())  # the whole batch at once
        >>> torch.allclose(sum(parts), mean)
        True
    """
    total = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)),
        targets.reshape(-1),
        ignore_index=ignore_index,
        reduction="sum",
    )
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if isinstance(global_tokens, torch.Tensor):
        global_tokens = global_tokens.clamp_min(1)  # a step with no counted token has gradient 0
    else:
        global_tokens = max(int(global_tokens), 1)
    return total * world_size / global_tokens
