"""Communication per step by collective: what each GPU sends under a layout.

Volumes are those of the ring algorithms NCCL and RCCL use for large messages: each of ``g``
ranks sends ``2·(g-1)/g·S`` bytes to all-reduce ``S`` bytes and ``(g-1)/g·S`` to all-gather or
reduce-scatter them (Thakur et al. 2005; the ZeRO paper's section 7 counts the same). Per step,
with ``m`` micro-batches per data-parallel rank:

- DDP all-reduces the gradients once (accumulation without sync until the last micro-batch);
  ZeRO-1 and -2 reduce-scatter them and all-gather the updated weights once; FSDP (ZeRO-3)
  all-gathers each block's weights before its forward and again before its backward, and
  reduce-scatters its gradients, for every micro-batch: 1.5 times DDP's bytes at ``m = 1``.
- Tensor parallelism with sequence parallelism all-gathers and reduce-scatters the block's
  activations twice each in forward and again in backward (Korthikanti et al. 2022, section
  4.2.2): eight collectives of ``a·tokens·h`` bytes per block and micro-batch; full
  checkpointing repeats the forward's four.
- Pipeline parallelism sends each micro-batch's activations to the next stage and their
  gradients back.
- Context parallelism all-gathers the keys and values of every block in forward and backward
  and reduce-scatters their gradients (torch's ``context_parallel`` all-gathers by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainopt.perf.planner.layout import Layout, Training
from trainopt.perf.planner.memory import local_parameters, micro_batches
from trainopt.perf.planner.shape import ModelShape


@dataclass(frozen=True)
class Collective:
    """One kind of communication of a step.

    Example:
        >>> from trainopt.perf.planner import Collective
        >>> c = Collective("all-reduce", "dp", "gradients", 2e9, group=8, overlapped=True)
        >>> c.bytes_per_gpu / 1e9, c.overlapped
        (2.0, True)

    Attributes:
        name: What it is (``"all-reduce"``, ``"all-gather"``, ``"reduce-scatter"``,
            ``"send/recv"``).
        dimension: The parallel dimension whose group it runs in (``"dp"``, ``"tp"``, ``"pp"``,
            ``"cp"``).
        purpose: What it moves.
        bytes_per_gpu: Bytes each GPU sends per step.
        group: Ranks in the group.
        overlapped: Whether it runs while compute goes on (else the step waits for it).
    """

    name: str
    dimension: str
    purpose: str
    bytes_per_gpu: float
    group: int
    overlapped: bool


def _ring(group: int) -> float:
    return (group - 1) / group


def communication_per_step(
    shape: ModelShape, training: Training, layout: Layout
) -> list[Collective]:
    """The collectives of one optimizer step on one GPU, with the bytes each sends.

    Example:
        >>> from trainopt.perf.planner import Layout, Training, communication_per_step
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> shape, training = PRESETS["llama3-8b"], Training(micro_batch=1)
        >>> def total(layout):
        ...     return sum(c.bytes_per_gpu for c in communication_per_step(shape, training, layout))
        >>> round(total(Layout(dp=8, zero=3)) / total(Layout(dp=8, zero=0)), 2)  # ZeRO paper
        1.5
    """
    p = training.precision_bytes
    block, outer = local_parameters(shape, layout)
    n_local = block + outer
    m = micro_batches(training, layout)
    out: list[Collective] = []
    dp = layout.dp
    if dp > 1:
        grads, weights = p.gradients * n_local, p.weights * n_local
        if layout.zero == 0:
            out.append(Collective("all-reduce", "dp", "gradients", 2 * _ring(dp) * grads, dp, True))
        elif layout.zero in (1, 2):
            out.append(Collective("reduce-scatter", "dp", "gradients", _ring(dp) * grads, dp, True))
            out.append(Collective("all-gather", "dp", "weights", _ring(dp) * weights, dp, True))
        else:
            out.append(
                Collective("all-gather", "dp", "weights", 2 * m * _ring(dp) * weights, dp, True)
            )
            out.append(
                Collective("reduce-scatter", "dp", "gradients", m * _ring(dp) * grads, dp, True)
            )
    tokens = training.micro_batch * shape.seq_len // layout.cp
    stage_blocks = -(-shape.layers // layout.pp)
    activation = p.activations * tokens * shape.hidden
    if layout.tp > 1:
        forwards = 2 if training.checkpointing == "full" else 1
        per_block = (4 * forwards + 4) * _ring(layout.tp) * activation
        if layout.sequence_parallel:
            out.append(
                Collective(
                    "all-gather + reduce-scatter", "tp", "block activations",
                    m * stage_blocks * per_block, layout.tp, False,
                )
            )  # fmt: skip
        else:
            out.append(
                Collective(
                    "all-reduce", "tp", "block outputs", m * stage_blocks * per_block,
                    layout.tp, False,
                )
            )  # fmt: skip
    if layout.pp > 1:
        sent = activation / (layout.tp if layout.sequence_parallel else 1)
        out.append(
            Collective("send/recv", "pp", "stage activations", 2 * m * sent, layout.pp, False)
        )
    if layout.cp > 1:
        kv = 2 * p.activations * tokens * shape.kv_width // layout.tp
        out.append(
            Collective(
                "all-gather + reduce-scatter", "cp", "keys and values",
                3 * m * stage_blocks * (layout.cp - 1) * kv, layout.cp, False,
            )
        )  # fmt: skip
    return out
