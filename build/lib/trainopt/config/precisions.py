"""The one vocabulary of precisions: the names every trainopt function takes, and autocast's dtype.

``fp32`` (no autocast), ``tf32`` (fp32 with TensorFloat-32 matmuls on GPUs that have them; no
autocast), ``bf16`` and ``fp16`` (autocast to that dtype). ``float32``, ``bfloat16`` and
``float16`` are accepted as the same names spelled as torch spells them. The stabilizer, the
precision recipes, the memory estimates and the benchmarks all read this table.
"""

from __future__ import annotations

import torch

__all__ = ["ALIASES", "AUTOCAST_DTYPES", "PRECISIONS", "autocast_dtype"]

PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")

AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {
    "fp32": None,
    "tf32": None,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
"""Autocast's dtype for each precision (``None``: no autocast, fp32 activations)."""

ALIASES: dict[str, str] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""torch's spelling of a precision, and the name it stands for."""


def autocast_dtype(
    name: str, field: str = "precision", allowed: tuple[str, ...] = PRECISIONS
) -> torch.dtype | None:
    """Autocast's dtype for the precision ``name`` (an alias too), refusing any other name.

    Args:
        name: A precision name (:data:`PRECISIONS`) or one of :data:`ALIASES`.
        field: The argument's name, for the error.
        allowed: The precisions the caller takes (a subset of :data:`PRECISIONS`).

    Raises:
        ValueError: ``name`` is not an allowed precision; the message names the field and the
            allowed names.

    Example:
        >>> from trainopt.config.precisions import autocast_dtype
        >>> autocast_dtype("bf16"), autocast_dtype("float32")
        (torch.bfloat16, None)
        >>> try:
        ...     autocast_dtype("int8", field="dtype")
        ... except ValueError as error:
        ...     print(error)
        dtype must be one of ['fp32', 'tf32', 'bf16', 'fp16'] (or float32, bfloat16, float16),
            got 'int8'
    """
    canonical = ALIASES.get(name, name) if isinstance(name, str) else name
    if canonical not in allowed:
        spelled = ", ".join(k for k, v in ALIASES.items() if v in allowed)
        raise ValueError(
            f"{field} must be one of {list(allowed)}"
            + (f" (or {spelled})" if spelled else "")
            + f", got {name!r}"
        )
    return AUTOCAST_DTYPES[canonical]
