"""Estimate training memory before a run: weights, gradients, optimizer state and activations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

OPTIMIZER_STATE_BYTES: dict[str, int] = {"sgd": 0, "sgd_momentum": 4, "adam": 8, "adamw": 8}


def bytes_per_parameter(optimizer: str = "adamw", weights_dtype: torch.dtype = torch.float32,
                        master_weights: bool = False) -> dict[str, int]:
    """Bytes each parameter costs in training, by kind.

    Autocast (``bf16``/``fp16`` precision here) keeps fp32 weights, so it changes nothing in
    this table; storing the weights in bf16 does, and then an fp32 master copy is usual.

    Args:
        optimizer: One of :data:`OPTIMIZER_STATE_BYTES` (fp32 states).
        weights_dtype: Dtype of the weights and gradients.
        master_weights: Whether an fp32 master copy of low-precision weights is kept.

    Example:
        >>> import torch
        >>> from trainopt.perf import bytes_per_parameter
        >>> bytes_per_parameter("adamw")
        {'weights': 4, 'gradients': 4, 'optimizer_states': 8, 'master_weights': 0}
        >>> sum(bytes_per_parameter("adamw", torch.bfloat16, master_weights=True).values())
        16
    """
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATE_BYTES)}, got {optimizer!r}")
    size = torch.empty((), dtype=weights_dtype).element_size()
    return {"weights": size, "gradients": size, "optimizer_states": OPTIMIZER_STATE_BYTES[optimizer],
            "master_weights": 4 if master_weights else 0}


def gpt_activation_bytes(config: Any, batch_size: int, seq_len: int, precision: str = "bf16",
                         checkpointed_layers: int = 0) -> dict[str, int]:
    """Bytes autograd saves in the forward of :class:`trainopt.models.GPT`, by part.

    With ``n = batch_size · seq_len`` tokens, width ``h``, ``H`` heads, vocabulary ``V`` and
    ``a`` bytes per activation (2 under bf16/fp16 autocast, 4 otherwise), a block saves
    ``n·h·(8 + 14·a) + n·(16 + 4·H)`` bytes: two fp32 LayerNorm inputs (8), the inputs of the
    four matmuls (1 + 1 + 1 + 4 widths), q, k, v (3), the GELU input (4) and, from
    flash/memory-efficient attention, the output (1) and an fp32 log-sum-exp per head — never
    the ``T × T`` scores. A checkpointed block keeps only its fp32 input, ``4·n·h``.
    The head keeps the final LayerNorm input (``4·n·h``), the LM-head input (``a·n·h``),
    the fp32 log-softmax (``4·n·V``) and the int64 token ids, targets and positions. Under autocast, the bf16 copies of matmul weights that
    backward needs are counted too (``weight_casts``).

    Example:
        >>> from trainopt.perf import gpt_activation_bytes
        >>> from trainopt.models import gpt_config
        >>> parts = gpt_activation_bytes(gpt_config("tiny"), batch_size=2, seq_len=64, precision="fp32")
        >>> parts["blocks"] == 2 * (128 * 64 * (8 + 14 * 4) + 128 * (16 + 4 * 4))
        True
    """
    if precision not in ("fp32", "tf32", "bf16", "fp16"):
        raise ValueError(f"precision must be one of ['fp32', 'tf32', 'bf16', 'fp16'], got {precision!r}")
    if not 0 <= checkpointed_layers <= config.n_layer:
        raise ValueError(f"checkpointed_layers must be in [0, {config.n_layer}], got {checkpointed_layers=}")
    a = 2 if precision in ("bf16", "fp16") else 4
    n, h, heads, vocab = batch_size * seq_len, config.n_embd, config.n_head, config.vocab_size
    stored_layers = config.n_layer - checkpointed_layers
    per_block = n * h * (8 + 14 * a) + n * (16 + 4 * heads)
    return {
        "blocks": stored_layers * per_block + checkpointed_layers * 4 * n * h,
        # LayerNorm input + stats, LM-head input, log-softmax, token ids, targets, positions
        "head": 4 * n * h + 8 * n + a * n * h + 4 * n * vocab + 8 * n + 8 * n + 8 * seq_len,
        "weight_casts": (stored_layers * 12 * h * h + vocab * h) * 2 if a == 2 else 0,
    }


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted memory of a training step, in bytes, by part; :attr:`peak` is the sum.

    Example:
        >>> from trainopt.perf import MemoryEstimate
        >>> est = MemoryEstimate(weights=4, gradients=4, optimizer_states=8, master_weights=0,
        ...                      activations=10, weight_casts=0, logits_backward=2)
        >>> est.peak, est.optimizer_phase  # gradients don't count in the peak, logits do
        (24, 16)
    """

    weights: int
    gradients: int
    optimizer_states: int
    master_weights: int
    activations: int
    weight_casts: int
    logits_backward: int

    @property
    def peak(self) -> int:
        """Peak of the step: during backward of the loss, when the saved activations, the
        logit gradients and the static state are all alive (gradients are not yet)."""
        return (self.weights + self.optimizer_states + self.master_weights + self.activations
                + self.weight_casts + self.logits_backward)

    @property
    def optimizer_phase(self) -> int:
        """Memory in the optimizer step: weights, gradients and states (fused AdamW)."""
        return self.weights + self.gradients + self.optimizer_states + self.master_weights


def estimate_training_memory(model: nn.Module, precision: str = "bf16", optimizer: str = "adamw",
                             batch_size: int = 8, seq_len: int | None = None,
                             checkpointed_layers: int = 0) -> MemoryEstimate:
    """Estimate the memory of one training step of a :class:`trainopt.models.GPT`.

    Static part: :func:`bytes_per_parameter` × parameters. Activations:
    :func:`gpt_activation_bytes`. Transient: backward of the cross-entropy holds the
    gradient of the log-softmax and of the logits, both fp32 (``8·n·V``), while the
    log-softmax output is still saved. Gradients are freed by ``zero_grad()`` before the
    forward, so they don't add to the peak, which is reached at the start of backward.

    Example:
        >>> from trainopt.perf import estimate_training_memory
        >>> from trainopt.models import GPT, gpt_config
        >>> model = GPT(gpt_config("tiny"))
        >>> est = estimate_training_memory(model, "fp32", batch_size=2, seq_len=64)
        >>> est.weights == 4 * model.num_parameters() and est.optimizer_states == 2 * est.weights
        True
    """
    config = model.config
    seq_len = seq_len or config.block_size
    per_param = bytes_per_parameter(optimizer)
    n_params = sum(p.numel() for p in model.parameters())
    parts = gpt_activation_bytes(config, batch_size, seq_len, precision, checkpointed_layers)
    return MemoryEstimate(
        weights=per_param["weights"] * n_params,
        gradients=per_param["gradients"] * n_params,
        optimizer_states=per_param["optimizer_states"] * n_params,
        master_weights=per_param["master_weights"] * n_params,
        activations=parts["blocks"] + parts["head"],
        weight_casts=parts["weight_casts"],
        logits_backward=8 * batch_size * seq_len * config.vocab_size,
    )
