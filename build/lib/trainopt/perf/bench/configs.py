"""Benchmark configurations of the reference GPT and the matrices built from them."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from trainopt.models import GPT_PRESETS
from trainopt.perf.precision import PRECISIONS
from trainopt.validation import check_int

COMPILE_MODES: tuple[str, ...] = (
    "none",
    "default",
    "reduce-overhead",
    "max-autotune",
    "max-autotune-no-cudagraphs",
)


COMPILE_BACKENDS: tuple[str, ...] = ("inductor", "aot_eager", "eager")


OPTIMIZERS: tuple[str, ...] = ("foreach", "fused")


ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "flash", "efficient", "cudnn", "math")


@dataclass(frozen=True)
class BenchConfig:
    """One configuration of a training step of the reference :class:`~trainopt.models.GPT`.

    Attributes:
        size: GPT preset: ``"tiny"``, ``"small"``, ``"124m"`` or ``"350m"``.
        precision: ``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp16"`` (fp16 adds a GradScaler).
        compile: ``"none"`` (eager) or a ``torch.compile`` mode from :data:`COMPILE_MODES`.
        compile_backend: ``torch.compile`` backend; modes apply to ``"inductor"`` only.
        checkpointing: Recompute each transformer block in the backward pass.
        optimizer: AdamW implementation: ``"foreach"`` or ``"fused"``.
        attention: ``scaled_dot_product_attention`` backend; ``"auto"`` lets torch choose.
        batch_size: Sequences per step.
        seq_len: Tokens per sequence; ``0`` means the preset's ``block_size``.
        label: A name for tables; empty gives :attr:`name`'s generated one.

    Example:
        >>> from trainopt.perf.bench import BenchConfig
        >>> BenchConfig(precision="bf16", compile="default", batch_size=4).name
        'tiny bf16 compile=default foreach 4x64'
        >>> BenchConfig(precision="fp8")
        Traceback (most recent call last):
        ...
        ValueError: precision must be one of ['fp32', 'tf32', 'bf16', 'fp16'], got precision='fp8'
    """

    size: str = "tiny"
    precision: str = "fp32"
    compile: str = "none"
    compile_backend: str = "inductor"
    checkpointing: bool = False
    optimizer: str = "foreach"
    attention: str = "auto"
    batch_size: int = 8
    seq_len: int = 0
    label: str = ""

    def __post_init__(self) -> None:
        allowed = {
            "size": sorted(GPT_PRESETS),
            "precision": list(PRECISIONS),
            "compile": list(COMPILE_MODES),
            "compile_backend": list(COMPILE_BACKENDS),
            "optimizer": list(OPTIMIZERS),
            "attention": list(ATTENTION_BACKENDS),
            "checkpointing": [False, True],
        }
        for field_name, values in allowed.items():
            value = getattr(self, field_name)
            if value not in values or type(value) is not type(values[0]):
                raise ValueError(
                    f"{field_name} must be one of {values}, got {field_name}={value!r}"
                )
        check_int("batch_size", self.batch_size, 1)
        block = GPT_PRESETS[self.size].get("block_size", 1024)
        if not isinstance(self.seq_len, int) or not 0 <= self.seq_len <= block:
            raise ValueError(
                f"seq_len must be an int in [0, {block}] for size {self.size!r} (0: {block}), "
                f"got seq_len={self.seq_len!r}"
            )

    @property
    def tokens_per_step(self) -> int:
        """``batch_size × seq_len``: the tokens one training step consumes."""
        return self.batch_size * self.sequence_length

    @property
    def sequence_length(self) -> int:
        """The sequence length in effect (the preset's ``block_size`` when ``seq_len`` is 0)."""
        return self.seq_len or GPT_PRESETS[self.size].get("block_size", 1024)

    @property
    def name(self) -> str:
        """``label``, or a name built from the fields that differ from the defaults."""
        if self.label:
            return self.label
        parts = [self.size, self.precision]
        if self.compile != "none":
            parts.append(f"compile={self.compile}")
        if self.compile != "none" and self.compile_backend != "inductor":
            parts.append(f"backend={self.compile_backend}")
        if self.checkpointing:
            parts.append("ckpt")
        parts.append(self.optimizer)
        if self.attention != "auto":
            parts.append(f"attn={self.attention}")
        parts.append(f"{self.batch_size}x{self.sequence_length}")
        return " ".join(parts)


def build_matrix(
    base: BenchConfig, axes: dict[str, Sequence[Any]], grid: bool = False
) -> list[BenchConfig]:
    """Configurations around ``base``: one field varied at a time, or every combination.

    Args:
        base: The configuration every variation starts from; it comes first.
        axes: Field name → values to try, e.g. ``{"precision": ["fp32", "bf16"]}``.
        grid: ``True`` for the full Cartesian product of ``axes``.

    Returns:
        Distinct configurations, ``base`` (or the first grid point) first.

    Example:
        >>> from trainopt.perf.bench import BenchConfig
        >>> from trainopt.perf.bench import build_matrix
        >>> fields = {"precision": ["fp32", "bf16"], "batch_size": [4, 8]}
        >>> configs = build_matrix(BenchConfig(), fields)
        >>> [c.name for c in configs]
        ['tiny fp32 foreach 8x64', 'tiny bf16 foreach 8x64', 'tiny fp32 foreach 4x64']
    """
    names = {f.name for f in fields(BenchConfig)}
    for axis in axes:
        if axis not in names:
            raise ValueError(
                f"axes keys must be fields of BenchConfig {sorted(names)}, got {axis!r}"
            )
    if grid:
        keys = list(axes)
        candidates = [
            replace(base, **dict(zip(keys, values)))
            for values in itertools.product(*(axes[k] for k in keys))
        ]
    else:
        candidates = [base] + [
            replace(base, **{axis: value}) for axis, values in axes.items() for value in values
        ]
    return list(dict.fromkeys(candidates))
