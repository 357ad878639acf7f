"""Model FLOPs utilisation (MFU): one definition, one table of peaks per precision.

MFU is the share of a device's peak that the model's own arithmetic needs at the measured speed
(PaLM, appendix B):

.. code-block:: text

    MFU = tokens/s × FLOPs per token / peak FLOP/s of the precision in use

FLOPs per token are :meth:`trainopt.models.GPT.flops_per_token`, ``6·N + 12·L·d·T``:

- ``N`` counts the weights that take part in matmuls: every parameter except the position
  embedding. The token embedding is tied to the LM head, so it counts once (its matmul work
  is in the head). LayerNorm weights are in ``N`` too; they are a rounding error.
- ``6·N``: a multiply-add is 2 FLOPs; the forward pass does one per weight per token (``2·N``)
  and the backward pass two (``4·N``: the gradient of the input and of the weight).
- ``12·L·d·T``: the two attention matmuls (``QKᵀ`` and the weighted sum of ``V``) of ``L``
  layers of width ``d`` at sequence length ``T``, ``2·2·d·T`` per token forward, three times
  that with the backward pass. They are counted over the full ``T × T`` square, as if attention
  were not causal: a causal kernel skips half of that work, so MFU never credits the skip.

Work the model doesn't need is not counted: recomputation under activation checkpointing costs
time and adds no model FLOPs, so it lowers MFU, as it should (hardware FLOPs utilisation, HFU,
counts it). ``torch.utils.flop_counter.FlopCounterMode`` on a step with the math attention kernel
counts exactly ``6·N_matmul + 12·L·d·T``: the formula's ``N`` adds the LayerNorm weights.

A peak too large underestimates MFU (an H100 PCIe looked up as SXM shows 756.5/989.4 of its
MFU in bf16); a peak too small overestimates it.

The peak is the dense (no sparsity) tensor-core or FP32 rate of the precision the step runs
in, so an fp32 step is divided by the fp32 peak, never by a bf16 one. A CPU has no peak here:
its MFU is not reported unless you give one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib import resources

import torch


def gpu_table() -> list[dict]:
    """The rows of ``gpus.json`` (this package's data): one GPU each, with its source.

    The one table of GPUs: dense peak TFLOP/s per precision (the vendors' figures "with
    sparsity" are twice these; fp32 is the non-tensor rate, tf32/bf16/fp16/fp8 tensor cores),
    memory, scale-up bandwidth per GPU and direction, GPUs per node (or NVLink domain), and the
    data sheet or product page each row comes from. :data:`PEAK_TFLOPS` is its MFU part; the
    layout planner (:mod:`trainopt.perf.planner`) reads the rest.

    Example:
        >>> from trainopt.perf.bench.mfu import gpu_table
        >>> {row["name"]: row["memory_gb"] for row in gpu_table()}["MI300X"]
        192
    """
    text = resources.files("trainopt.perf.bench").joinpath("gpus.json").read_text()
    return json.loads(text)["gpus"]


# The GPUs that ``device_key`` recognises by their CUDA name, in the four precisions MFU uses.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    row["name"]: {p: row["peak_tflops"][p] for p in ("fp32", "tf32", "bf16", "fp16")}
    for row in gpu_table()
    if row["bench"]
}


MFU_GOAL = 0.5  # the goal for the best configuration of MFU_GOAL_SIZE on one H100


MFU_GOAL_SIZE = "350m"


def mfu(flops_per_token: float, tokens_per_second: float, peak: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak FLOP/s.

    Example:
        >>> from trainopt.perf import mfu
        >>> round(mfu(1e9, 2e5, 989.4e12), 4)
        0.2021
    """
    if not peak > 0:
        raise ValueError(f"peak must be positive FLOP/s, got {peak=}")
    return flops_per_token * tokens_per_second / peak


def device_key(device_name: str) -> str | None:
    """The row of :data:`PEAK_TFLOPS` for a ``torch.cuda.get_device_name()``, or ``None``.

    Example:
        >>> from trainopt.perf.bench.mfu import device_key
        >>> names = ("NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL", "NVIDIA A100-SXM4-80GB",
        ...          "NVIDIA L40S", "NVIDIA L4", "Tesla T4")
        >>> [device_key(n) for n in names]
        ['H100 SXM', 'H100 NVL', 'A100', 'L40S', 'L4', None]
    """
    words = device_name.upper().replace("-", " ").split()
    if "H100" in words:
        return "H100 NVL" if "NVL" in words else "H100 PCIe" if "PCIE" in words else "H100 SXM"
    if "H200" in words:
        return "H200 NVL" if "NVL" in words else "H200"
    return next((key for key in ("A100", "A10", "L40S", "L4") if key in words), None)


def parse_peak_tflops(text: str) -> dict[str, float]:
    """``--peak-tflops`` text: one value for every precision, or ``precision=value`` pairs.

    Example:
        >>> from trainopt.perf.bench.mfu import parse_peak_tflops
        >>> parse_peak_tflops("400"), parse_peak_tflops("bf16=835.5,fp32=60")
        ({'*': 400.0}, {'bf16': 835.5, 'fp32': 60.0})
    """
    peaks: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            number = 0.0
        if name not in ("", "fp32", "tf32", "bf16", "fp16") or not number > 0:
            raise ValueError(
                f"must be a positive TFLOP/s or precision=TFLOP/s pairs "
                f"(fp32, tf32, bf16, fp16), got {text!r}"
            )
        peaks[name or "*"] = number
    if not peaks:
        raise ValueError(f"must be a positive TFLOP/s, got {text!r}")
    return peaks


def peak_flops_for(
    device: str | torch.device,
    precision: str,
    peak_tflops: Mapping[str, float] | float | None = None,
    *,
    device_name: str | None = None,
) -> tuple[float | None, str]:
    """The peak FLOP/s that MFU divides by for ``precision`` on ``device``, and its source.

    A given ``peak_tflops`` (one number, or a ``{precision: TFLOP/s}`` mapping with ``"*"``
    for any precision) wins. Otherwise a CUDA GPU is looked up by name in
    :data:`PEAK_TFLOPS`; a GPU that isn't there raises (pass ``peak_tflops``): no GPU is
    silently taken for another. A CPU has no peak: ``(None, ...)``, and no MFU is reported.

    Args:
        device: The device the step runs on.
        precision: ``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp16"``.
        peak_tflops: Dense peak in TFLOP/s, overriding the table.
        device_name: The GPU's name (default: ``torch.cuda.get_device_name(device)``).

    Raises:
        ValueError: an unknown precision, or a GPU not in the table without ``peak_tflops``.

    Example:
        >>> from trainopt.perf.bench.mfu import peak_flops_for
        >>> peak_flops_for("cuda", "fp32", device_name="NVIDIA H100 80GB HBM3")
        (66900000000000.0, 'H100 SXM fp32 dense: 66.9 TFLOP/s (data sheet)')
        >>> peak_flops_for("cpu", "bf16")
        (None, 'no peak for a CPU: MFU not reported')
        >>> try:
        ...     peak_flops_for("cuda", "bf16", device_name="NVIDIA H20")
        ... except ValueError as error:
        ...     print(error)
        GPU 'NVIDIA H20' is not in the peak table (H100 SXM, H100 PCIe, H100 NVL, H200, H200 NVL,
            A100, A10, L4, L40S); give its dense bf16 TFLOP/s
    """
    if precision not in ("fp32", "tf32", "bf16", "fp16"):
        raise ValueError(
            f"precision must be one of ['fp32', 'tf32', 'bf16', 'fp16'], got {precision!r}"
        )
    if peak_tflops is not None:
        given = peak_tflops if isinstance(peak_tflops, Mapping) else {"*": float(peak_tflops)}
        value = given.get(precision, given.get("*"))
        if value is not None:
            if not value > 0:
                raise ValueError(f"peak_tflops must be positive, got {value!r}")
            return float(round(value * 1e12)), f"given: {value:g} TFLOP/s"
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"no peak for a {device.type.upper()}: MFU not reported"
    name = device_name if device_name is not None else torch.cuda.get_device_name(device)
    key = device_key(name)
    if key is None:
        raise ValueError(
            f"GPU {name!r} is not in the peak table ({', '.join(PEAK_TFLOPS)}); "
            f"give its dense {precision} TFLOP/s"
        )
    tflops = PEAK_TFLOPS[key][precision]
    return float(round(tflops * 1e12)), f"{key} {precision} dense: {tflops:g} TFLOP/s (data sheet)"
