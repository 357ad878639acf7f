"""Estimate the peak memory of a training step before a run, phase by phase.

:func:`estimate_training_memory` follows one steady-state step of :class:`trainopt.models.GPT`
(AdamW state already allocated, gradients freed by ``zero_grad(set_to_none=True)``) and counts
the bytes alive at the high point of each phase: the forward pass, the backward pass of the
loss, of each block and of the embeddings (gradients appearing as backward produces them), and
the optimizer step (with its implementation's temporaries). The peak is the largest of them.
On a CPU, :class:`~trainopt.perf.peak.LiveStorageTracker` measures the same quantity, and the
tests hold the estimate to it within 5%.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainopt.config.optimizers import OPTIMIZERS
from trainopt.config.precisions import PRECISIONS
from trainopt.validation import check_int

OPTIMIZER_STATE_BYTES: dict[str, int] = {
    name: kind.state_bytes for name, kind in OPTIMIZERS.items()
}
"""Bytes of fp32 state per parameter element, by the name of the one vocabulary
(``trainopt.config.optimizers``)."""


OPTIMIZER_IMPLEMENTATIONS: tuple[str, ...] = ("foreach", "fused", "for-loop")


CUDA_WORKSPACE_BYTES = 64 * 2**20
"""The allowance on a GPU for what the caching allocator holds besides tensors: cuBLAS and
cuBLASLt workspaces (up to 32 MiB each per stream on Hopper) and kernel scratch. It counts in
``torch.cuda.max_memory_allocated``. The CUDA context itself (several hundred MiB, more with
lazy-loaded kernels) is outside the allocator: add it when you compare with ``nvidia-smi``."""


def bytes_per_parameter(
    optimizer: str = "adamw",
    weights_dtype: torch.dtype = torch.float32,
    master_weights: bool = False,
) -> dict[str, int]:
    """Bytes each parameter costs in training, by kind.

    Autocast (``bf16``/``fp16`` precision here) keeps fp32 weights, so it changes nothing in
    this table; storing the weights in bf16 does, and then an fp32 master copy is usual.

    Args:
        optimizer: One of :data:`OPTIMIZER_STATE_BYTES` (fp32 states).
        weights_dtype: Dtype of the weights and gradients.
        master_weights: Whether an fp32 master copy of low-precision weights is kept.

    Example:
        >>> import torch
        >>> from trainopt.perf.estimate import bytes_per_parameter
        >>> bytes_per_parameter("adamw")
        {'weights': 4, 'gradients': 4, 'optimizer_states': 8, 'master_weights': 0}
        >>> sum(bytes_per_parameter("adamw", torch.bfloat16, master_weights=True).values())
        16
    """
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(
            f"optimizer must be one of {sorted(OPTIMIZER_STATE_BYTES)}, got {optimizer!r}"
        )
    size = torch.empty((), dtype=weights_dtype).element_size()
    return {
        "weights": size,
        "gradients": size,
        "optimizer_states": OPTIMIZER_STATE_BYTES[optimizer],
        "master_weights": 4 if master_weights else 0,
    }


STATE_OPTIMIZERS: tuple[str, ...] = ("adamw", "adamw8bit", "adafactor")


def optimizer_state_bytes(
    parameters: Iterable[torch.Tensor],
    optimizer: str = "adamw",
    block_size: int = 256,
    min_8bit_size: int = 4096,
) -> int:
    """Bytes of optimizer state for ``parameters``, from their shapes alone (``meta`` works).

    - ``"adamw"``: two fp32 moments and a 4-byte step per tensor, as ``torch.optim.AdamW``.
    - ``"adamw8bit"``: both moments in 8 bits with one fp32 absmax per ``block_size`` values
      (block-wise quantization, as in bitsandbytes' ``AdamW8bit``, whose blocks hold 256
      values); tensors smaller than ``min_8bit_size`` (4,096 there) keep fp32 moments. An
      estimate: bitsandbytes is not a dependency.
    - ``"adafactor"``: no first moment; the second moment of a matrix is factored into one
      fp32 row and one fp32 column vector, a vector's is kept whole; a 4-byte step per tensor,
      as ``torch.optim.Adafactor``.

    Example:
        >>> import torch
        >>> from trainopt.perf import optimizer_state_bytes
        >>> weight = torch.empty(1024, 4096, device="meta")
        >>> {name: round(optimizer_state_bytes([weight], name) / weight.numel(), 3)
        ...  for name in ("adamw", "adamw8bit", "adafactor")}  # bytes per parameter
        {'adamw': 8.0, 'adamw8bit': 2.031, 'adafactor': 0.005}
    """
    if optimizer not in STATE_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(STATE_OPTIMIZERS)}, got {optimizer!r}")
    total = 0
    for param in parameters:
        n = param.numel()
        if optimizer == "adamw":
            total += 8 * n + 4
        elif optimizer == "adamw8bit":
            total += 8 * n + 4 if n < min_8bit_size else 2 * n + 2 * 4 * -(-n // block_size) + 4
        elif param.dim() >= 2:
            rows, cols = param.shape[-2:]
            total += 4 * (n // (rows * cols)) * (rows + cols) + 4
        else:
            total += 4 * n + 4
    return total


def gpt_activation_bytes(
    config: Any,
    batch_size: int,
    seq_len: int,
    precision: str = "bf16",
    checkpointed_layers: int = 0,
) -> dict[str, int]:
    """Bytes autograd saves in the forward of :class:`trainopt.models.GPT`, by part.

    With ``n = batch_size · seq_len`` tokens, width ``h``, ``H`` heads, vocabulary ``V`` and
    ``a`` bytes per activation (2 under bf16/fp16 autocast, 4 otherwise), a block saves
    ``n·h·(8 + 14·a) + n·(16 + 4·H)`` bytes: two fp32 LayerNorm inputs (8), the inputs of the
    four matmuls (1 + 1 + 1 + 4 widths), q, k, v (3), the GELU input (4) and, from
    flash/memory-efficient attention, the output (1) and an fp32 log-sum-exp per head — never
    the ``T × T`` scores. A checkpointed block keeps only its fp32 input, ``4·n·h``.
    The head keeps the final LayerNorm input (``4·n·h``), the LM-head input (``a·n·h``),
    the fp32 log-softmax (``4·n·V``) and the int64 token ids, targets and positions. Under
    autocast, the bf16 copies of matmul weights that backward needs are counted too
    (``weight_casts``).

    Example:
        >>> from trainopt.perf import gpt_activation_bytes
        >>> from trainopt.models import gpt_config
        >>> config = gpt_config("tiny")
        >>> parts = gpt_activation_bytes(config, batch_size=2, seq_len=64, precision="fp32")
        >>> parts["blocks"] == 2 * (128 * 64 * (8 + 14 * 4) + 128 * (16 + 4 * 4))
        True
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if not 0 <= checkpointed_layers <= config.n_layer:
        raise ValueError(
            f"checkpointed_layers must be in [0, {config.n_layer}], got {checkpointed_layers=}"
        )
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
    """Predicted memory of a steady-state training step, in bytes.

    The static parts (``weights`` … ``weight_casts``) say what the memory is made of;
    ``phases`` says how much is alive at the high point of each phase of the step. The
    :attr:`peak` is the largest phase plus, on a GPU, the ``workspace`` allowance
    (:data:`CUDA_WORKSPACE_BYTES`).

    Example:
        >>> from trainopt.perf import MemoryEstimate
        >>> est = MemoryEstimate(weights=4, gradients=4, optimizer_states=8, master_weights=0,
        ...                      activations=10, weight_casts=0, phases={"forward": 22,
        ...                                                              "optimizer step": 28})
        >>> est.peak, est.peak_phase
        (28, 'optimizer step')
    """

    weights: int
    gradients: int
    optimizer_states: int
    master_weights: int
    activations: int
    weight_casts: int
    phases: dict[str, int]
    workspace: int = 0

    @property
    def peak(self) -> int:
        """The most bytes alive at once in the step: the largest phase, plus the workspace."""
        return max(self.phases.values()) + self.workspace

    @property
    def peak_phase(self) -> str:
        """The phase where the peak is reached."""
        return max(self.phases, key=self.phases.__getitem__)


def _optimizer_temporaries(model: nn.Module, optimizer: str, implementation: str) -> int:
    """Bytes an Adam(W) step allocates besides its state (fp32 parameters)."""
    if optimizer not in ("adam", "adamw") or implementation == "fused":
        return 0
    sizes = [p.numel() * 4 for p in model.parameters()]
    if implementation == "foreach":
        return sum(sizes)  # _foreach_sqrt(exp_avg_sq): one full-size list
    # one parameter at a time: sqrt, then the division, while the previous denominator lives on
    return max(prev + 2 * size for prev, size in zip([0] + sizes, sizes))


def _block_backward(config: Any, n: int, seq_len: int, a: int, every: int, bias: bool) -> int:
    """The most bytes, beyond the static ones, alive in the backward pass of a block.

    Counted at the backward of each block's MLP output projection, the high point of a block:
    the activations still saved (block ``i`` complete, recomputed if checkpointed), the weight
    casts of blocks ``<= i``, the gradients already produced (LM head, final LayerNorm, blocks
    ``> i``), the residual stream's gradient, the projection's weight gradient (cast to fp32
    from a 16-bit one under autocast) and the gradient of the GELU output.
    """
    h, heads, vocab = config.n_embd, config.n_head, config.vocab_size
    full = n * h * (8 + 14 * a) + n * (16 + 4 * heads)
    saved = [4 * n * h if every and i % every == 0 else full for i in range(config.n_layer)]
    cast = 12 * h * h * 2 if a == 2 else 0
    layer_norm = 4 * h * (2 if bias else 1)
    block_grads = 4 * 12 * h * h + 2 * layer_norm
    projection = 4 * 4 * h * h + (2 * 4 * h * h if a == 2 else 0)
    best = 0
    for i in reversed(range(config.n_layer)):
        live = (
            sum(saved[:i])
            + full
            + cast * (i + 1)
            + 4 * vocab * h
            + layer_norm
            + (config.n_layer - 1 - i) * block_grads
            + 4 * n * h
            + projection
            + a * 4 * n * h
        )
        best = max(best, live)
    return best + 8 * seq_len  # the position ids the embedding keeps


def estimate_training_memory(
    model: nn.Module,
    precision: str = "bf16",
    optimizer: str = "adamw",
    batch_size: int = 8,
    seq_len: int | None = None,
    checkpoint_every: int = 0,
    implementation: str = "foreach",
    device: str | torch.device | None = None,
) -> MemoryEstimate:
    """Estimate the peak memory of a steady-state training step of a :class:`trainopt.models.GPT`.

    A formula for this one model; for any other ``nn.Module``,
    :func:`~trainopt.perf.traced_estimate.estimate_step_memory` traces a step on fake tensors.

    With ``n = batch_size · seq_len`` tokens, vocabulary ``V``, width ``h``, ``S`` the static
    bytes (weights, optimizer state, master weights), ``A`` the saved activations and ``c``
    the autocast weight copies (:func:`gpt_activation_bytes`), ``G`` the gradients and 16 bytes
    per token of int64 ids and targets, the phases are:

    - forward: ``S + A + c`` plus the logits and, under autocast, their fp32 copy;
    - loss backward: ``S + A + c + 8·n·V``, the gradients of the log-softmax and of the logits;
    - block backward: at each block's MLP output projection, the activations still saved, the
      gradients produced so far and the block's own gradient buffers (a checkpointed block is
      recomputed here, so its activations are all back);
    - end of backward: ``S + G``, plus ``8·V·h`` where the tied embedding's two gradients are
      summed into a third;
    - optimizer step: ``S + G`` plus the temporaries of AdamW: a full fp32 copy of the state
      (``foreach``), none (``fused``), or three parameters' worth at most (``for-loop``).

    Args:
        model: The GPT (on any device, ``meta`` included: only shapes are read).
        precision: ``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp16"`` (autocast: weights stay fp32).
        optimizer: One of :data:`OPTIMIZER_STATE_BYTES`.
        batch_size, seq_len: The batch shape; ``seq_len`` defaults to the block size.
        checkpoint_every: 0 for no activation checkpointing; ``k`` for every ``k``-th block, as
            ``apply_activation_checkpointing(model, Block, every=k)``.
        implementation: The optimizer's ``"foreach"``, ``"fused"`` or ``"for-loop"`` kernels.
        device: Where it will train (default: the model's device); CUDA adds the workspace.

    Example:
        >>> from trainopt.perf import estimate_training_memory
        >>> from trainopt.models import GPT, gpt_config
        >>> model = GPT(gpt_config("tiny"))
        >>> est = estimate_training_memory(model, "fp32", batch_size=1, seq_len=64)
        >>> est.weights == 4 * model.num_parameters() and est.optimizer_states == 2 * est.weights
        True
        >>> # one sequence: AdamW's foreach copy wins
        >>> est.peak_phase, est.peak == est.phases["optimizer step"]
        ('optimizer step', True)
        >>> estimate_training_memory(model, "fp32", batch_size=16, seq_len=64).peak_phase
        'loss backward'
    """
    if implementation not in OPTIMIZER_IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be one of {list(OPTIMIZER_IMPLEMENTATIONS)}, "
            f"got {implementation!r}"
        )
    check_int("checkpoint_every", checkpoint_every, 0)
    if type(model).__name__ != "GPT" or not hasattr(model, "config"):
        raise TypeError(
            "estimate_training_memory counts the parts of trainopt.models.GPT, "
            f"got a {type(model).__name__}; "
            "for any nn.Module use trainopt.perf.estimate_step_memory(model, example_batch, ...)"
        )
    config = model.config
    seq_len = seq_len or config.block_size
    n, vocab, h = batch_size * seq_len, config.vocab_size, config.n_embd
    per_param = bytes_per_parameter(optimizer)
    n_params = sum(p.numel() for p in model.parameters())
    checkpointed = len(range(0, config.n_layer, checkpoint_every)) if checkpoint_every else 0
    parts = gpt_activation_bytes(config, batch_size, seq_len, precision, checkpointed)
    a = 2 if precision in ("bf16", "fp16") else 4
    weights, gradients = per_param["weights"] * n_params, per_param["gradients"] * n_params
    static = weights + (per_param["optimizer_states"] + per_param["master_weights"]) * n_params
    saved = parts["blocks"] + parts["head"] + parts["weight_casts"]
    tokens = 16 * n
    tied = model.lm_head.weight is model.wte.weight
    phases = {
        "forward": static + saved + a * n * vocab + (4 * n * vocab if a == 2 else 0),
        "loss backward": static + saved + 8 * n * vocab,
        "block backward": static
        + tokens
        + _block_backward(config, n, seq_len, a, checkpoint_every, config.bias),
        "end of backward": static + tokens + gradients + (8 * vocab * h if tied else 0),
        "optimizer step": static
        + tokens
        + gradients
        + _optimizer_temporaries(model, optimizer, implementation),
    }
    device = torch.device(device) if device is not None else next(model.parameters()).device
    return MemoryEstimate(
        weights=weights,
        gradients=gradients,
        optimizer_states=per_param["optimizer_states"] * n_params,
        master_weights=per_param["master_weights"] * n_params,
        activations=parts["blocks"] + parts["head"],
        weight_casts=parts["weight_casts"],
        phases=phases,
        workspace=CUDA_WORKSPACE_BYTES if device.type == "cuda" else 0,
    )
