"""Memory per GPU of a layout, by part: parameters, gradients, optimizer state, activations,
communication buffers and temporaries.

The model states follow ZeRO's accounting (Rajbhandari et al. 2020): bytes per parameter by
precision and optimizer, the optimizer state sharded over the data-parallel ranks from stage 1,
the gradients from stage 2, the weights from stage 3 (FSDP). Tensor parallelism divides the
blocks and the vocabulary; a pipeline stage holds its share of the blocks and the embedding or
the output layer.

Activations follow Korthikanti et al. 2022 (section 4): the tensors autograd saves per block,
per token, counted here for the attention and feed-forward shapes of :class:`ModelShape`
(grouped-query attention, a gated feed-forward layer) with a fused attention kernel, which saves
its output and one fp32 log-sum-exp per head instead of the ``T × T`` scores:

.. code-block:: text

    per block and token:  r·2h (norm inputs) + a·(h + h + 2·kv + h + h + k·f) + 4·heads
                          k = 2 (GELU: its input and output), 4 (SwiGLU: gate, up, their product)

with ``a`` bytes per activation and ``r`` per residual-stream value. Tensor parallelism with
sequence parallelism divides all of it by ``tp``; without sequence parallelism the norm inputs
and the inputs of the column-parallel matmuls stay whole. Context parallelism divides the
tokens. Full checkpointing keeps each block's input (``r·h`` per token) and recomputes one
block at a time. Under the 1F1B pipeline schedule the first stage holds ``pp`` micro-batches
in flight (Narayanan et al. 2021, section 2.2.1). The loss keeps fp32 log-probabilities
(``4·V`` per token) and its backward adds their gradient and the logits' (``8·V``).

The peak is the larger of two moments of a step: the start of backward (everything the forward
saved, the loss gradients, FSDP's gathered weights) and the optimizer step (the gradients, and
the temporary copy that a ``foreach`` AdamW makes of its state). Where a block's weights outweigh
its activations (a tiny model on a few dozen tokens), the middle of backward, with one block's
weights gathered and its gradients unsharded, can peak above both: the planner is then low.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainopt.perf.estimate import OPTIMIZER_STATE_BYTES
from trainopt.perf.planner.layout import Layout, Training
from trainopt.perf.planner.shape import ModelShape

PARTS: tuple[str, ...] = (
    "parameters",
    "gradients",
    "optimizer_states",
    "activations",
    "communication_buffers",
    "temporaries",
)


@dataclass(frozen=True)
class MemoryPerGPU:
    """Bytes per GPU at each moment of a step that can be the peak, by part.

    ``phases`` maps each moment to its parts; :attr:`peak` is the largest total and
    :attr:`parts` splits it.

    Example:
        >>> from trainopt.perf.planner import MemoryPerGPU
        >>> m = MemoryPerGPU({"backward start": {"parameters": 2, "activations": 5},
        ...                   "optimizer step": {"parameters": 2, "gradients": 2}})
        >>> m.peak, m.peak_phase, m.parts["activations"]
        (7, 'backward start', 5)
    """

    phases: dict[str, dict[str, int]]

    @property
    def peak_phase(self) -> str:
        """The moment of the step where :attr:`peak` is reached."""
        return max(self.phases, key=lambda phase: sum(self.phases[phase].values()))

    @property
    def parts(self) -> dict[str, int]:
        """The bytes of each part at the peak."""
        return self.phases[self.peak_phase]

    @property
    def peak(self) -> int:
        """The most bytes alive at once."""
        return sum(self.parts.values())

    @property
    def model_states(self) -> int:
        """Weights, gradients and optimizer state per GPU, as ZeRO counts them (at the step)."""
        step = self.phases["optimizer step"]
        return step["parameters"] + step["gradients"] + step["optimizer_states"]


def local_parameters(shape: ModelShape, layout: Layout) -> tuple[int, int]:
    """``(one block, the rest)`` parameters that one GPU of the busiest pipeline stage holds
    before data-parallel sharding: the blocks split by ``tp``, ``ceil(layers / pp)`` of them;
    the embedding or the output layer (both when ``pp == 1``) split over the vocabulary.

    Example:
        >>> from trainopt.perf.planner import Layout
        >>> from trainopt.perf.planner.memory import local_parameters
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> shape = PRESETS["llama3-8b"]
        >>> sum(local_parameters(shape, Layout())) == shape.parameters()
        True
        >>> blocks, outer = local_parameters(shape, Layout(tp=8, pp=4))  # 8 blocks on a stage
        >>> blocks == 8 * (shape.block_parameters() // 8)
        True
    """
    blocks = -(-shape.layers // layout.pp)
    block = shape.block_parameters() // layout.tp
    if layout.pp == 1 or shape.other_parameters is not None:
        outer = shape.outer_parameters()
    else:  # the first stage holds the embeddings, the last the output layer (a copy if tied)
        outer = max(
            shape.vocab * shape.hidden + shape.position_embeddings * shape.hidden,
            shape.vocab * shape.hidden + shape.hidden,
        )
    return blocks * block, outer // layout.tp


def block_activation_bytes(shape: ModelShape, training: Training, layout: Layout) -> int:
    """Bytes one block saves for backward for one micro-batch on one GPU (no checkpointing).

    Example:
        >>> from trainopt.perf.planner import Layout, Training
        >>> from trainopt.perf.planner.memory import block_activation_bytes
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> shape = PRESETS["llama3-8b"]
        >>> one = block_activation_bytes(shape, Training(), Layout())
        >>> round(one / 2**30, 2)  # GiB at 8,192 tokens
        1.28
        >>> block_activation_bytes(shape, Training(), Layout(tp=8)) == one // 8
        True
    """
    a = training.precision_bytes.activations
    r = a
    h, kv, f = shape.hidden, shape.kv_width, shape.ffn_hidden
    tokens = training.micro_batch * shape.seq_len // layout.cp
    k = 4 if shape.gated_mlp else 2
    split = a * (h + 2 * kv + h + k * f) + 4 * shape.heads  # q, k, v, attention output, MLP
    whole = r * 2 * h + a * 2 * h  # norm inputs, inputs of the column-parallel matmuls
    if layout.sequence_parallel or layout.tp == 1:
        return tokens * (whole + split) // layout.tp
    return tokens * (whole + split // layout.tp)


def memory_per_gpu(shape: ModelShape, training: Training, layout: Layout) -> MemoryPerGPU:
    """Bytes per GPU of one training step of ``shape`` under ``layout``, by part.

    Example:
        >>> from trainopt.perf.planner import Layout, ModelShape, Training, memory_per_gpu
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> fsdp = memory_per_gpu(PRESETS["llama3-8b"], Training(micro_batch=1),
        ...                       Layout(dp=8, zero=3))
        >>> round(fsdp.parts["optimizer_states"] / 2**30, 1)  # 12 bytes × 8.03B / 8 GPUs
        11.2
    """
    p = training.precision_bytes
    block, outer = local_parameters(shape, layout)
    n_local = block + outer
    shard = layout.dp
    weights = p.weights * n_local // (shard if layout.zero >= 3 else 1)
    states = (OPTIMIZER_STATE_BYTES[training.optimizer] + p.master_weights) * n_local
    states //= shard if layout.zero >= 1 else 1
    grads_step = p.gradients * n_local // (shard if layout.zero >= 2 else 1)
    persistent_grads = grads_step if layout.dp > 1 and layout.zero <= 1 else 0

    tokens = training.micro_batch * shape.seq_len // layout.cp
    per_block = block_activation_bytes(shape, training, layout)
    stage_blocks = -(-shape.layers // layout.pp)
    in_flight = min(layout.pp, micro_batches(training, layout))
    if training.checkpointing == "full":
        kept = (
            tokens * p.activations * shape.hidden // (layout.tp if layout.sequence_parallel else 1)
        )
        blocks = stage_blocks * kept * in_flight + per_block
    else:
        blocks = stage_blocks * per_block * in_flight
    vocab_part = shape.vocab // layout.tp
    head = tokens * (2 * p.activations * shape.hidden + 4 * vocab_part) + 16 * tokens
    activations = blocks + head
    loss_backward = 8 * tokens * vocab_part

    gathered = 0
    if layout.zero >= 3 and layout.dp > 1:  # the root's weights and one prefetched block
        gathered = p.weights * (outer + block // stage_blocks)
    kernel_copy = 0
    if training.optimizer in ("adam", "adamw") and training.optimizer_kernels == "foreach":
        kernel_copy = 4 * n_local // (shard if layout.zero >= 1 else 1)

    backward = {
        "parameters": weights,
        "gradients": persistent_grads,
        "optimizer_states": states,
        "activations": activations,
        "communication_buffers": gathered,
        "temporaries": loss_backward,
    }
    step = {
        "parameters": weights,
        "gradients": grads_step,
        "optimizer_states": states,
        "activations": 0,
        "communication_buffers": 0,
        "temporaries": kernel_copy,
    }
    return MemoryPerGPU({"backward start": backward, "optimizer step": step})


def micro_batches(training: Training, layout: Layout) -> int:
    """Micro-batches per optimizer step on each data-parallel rank (at least 1).

    Example:
        >>> from trainopt.perf.planner import Layout, Training
        >>> from trainopt.perf.planner.memory import micro_batches
        >>> micro_batches(Training(micro_batch=2, global_batch=512), Layout(dp=64))
        4
    """
    if training.global_batch is None:
        return 1
    return max(1, training.global_batch // (training.micro_batch * layout.dp))
