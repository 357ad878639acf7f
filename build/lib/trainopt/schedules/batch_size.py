"""Batch-size ramp-up: a pure function ``samples consumed -> batch size``.

Large language-model runs often start with a smaller global batch and raise it in equal
increments over the first samples (GPT-3 over its first 4 to 12 billion tokens; Megatron-LM's
``--rampup-batch-size START INCREMENT SAMPLES``). Early in training the gradient noise scale
is small, so a small batch wastes little; later a large one is needed for efficiency.
"""

from __future__ import annotations

from collections.abc import Callable


def batch_size_rampup(
    start: int, end: int, increment: int, ramp_samples: int
) -> Callable[[int], int]:
    """A schedule of the global batch size over the samples consumed, rising in steps.

    With :math:`k = (\\text{end} - \\text{start}) / \\text{increment}` increments spread evenly
    over ``ramp_samples`` samples,

    .. math::

        b(s) = \\begin{cases}
            \\text{start}
                + \\text{increment} \\cdot \\lfloor s\\,k / \\text{ramp\\_samples} \\rfloor
                & s < \\text{ramp\\_samples} \\\\
            \\text{end} & \\text{otherwise,}
        \\end{cases}

    as Megatron-LM's ``--rampup-batch-size``. Past the ramp it holds ``end``.

    Args:
        start: Batch size at sample 0 (at least 1).
        end: Batch size after the ramp; ``end - start`` must be a multiple of ``increment``.
        increment: How much each step of the ramp adds (at least 1).
        ramp_samples: Samples over which the batch size rises (at least 0; 0 starts at ``end``).

    Raises:
        ValueError: an argument out of range, with its value.

    Example:
        >>> from trainopt.schedules import batch_size_rampup
        >>> batch_size = batch_size_rampup(start=32, end=128, increment=32, ramp_samples=3000)
        >>> [batch_size(s) for s in (0, 999, 1000, 2000, 2999, 3000, 10**9)]
        [32, 32, 64, 96, 96, 128, 128]
    """
    if start < 1 or increment < 1:
        raise ValueError(f"start and increment must be at least 1, got {start=}, {increment=}")
    if end < start or (end - start) % increment:
        raise ValueError(
            f"end must be start plus a multiple of increment, got {start=}, {end=}, {increment=}"
        )
    if ramp_samples < 0:
        raise ValueError(f"ramp_samples must be at least 0, got {ramp_samples=}")
    increments = (end - start) // increment

    def batch_size(samples: int) -> int:
        if samples >= ramp_samples or increments == 0:
            return end
        return start + increment * (max(samples, 0) * increments // ramp_samples)

    return batch_size


def rampup_steps(schedule: Callable[[int], int], total_samples: int) -> list[int]:
    """The batch size of each step that consumes ``total_samples`` samples under ``schedule``.

    A loop draws ``schedule(consumed)`` samples per step; the last step takes what is left.

    Example:
        >>> from trainopt.schedules import batch_size_rampup, rampup_steps
        >>> rampup_steps(batch_size_rampup(2, 6, 2, ramp_samples=12), total_samples=32)
        [2, 2, 2, 4, 4, 6, 6, 6]
    """
    sizes, consumed = [], 0
    while consumed < total_samples:
        size = min(schedule(consumed), total_samples - consumed)
        sizes.append(size)
        consumed += size
    return sizes
