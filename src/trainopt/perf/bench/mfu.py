"""Model FLOPs utilisation: achieved FLOP/s over the peak of the precision in use."""

from __future__ import annotations

import torch

PEAK_TFLOPS: dict[str, float] = {
    "H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "A100": 312.0, "L4": 121.0,
}


DEFAULT_PEAK_TFLOPS = 989.4  # H100 SXM, bf16 dense: the MFU reference of this project


MFU_GOAL = 0.5  # the goal for the best configuration of MFU_GOAL_SIZE on one H100


MFU_GOAL_SIZE = "350m"


def peak_flops_for(device: str | torch.device, peak_tflops: float | None = None) -> tuple[float | None, str]:
    """The peak FLOP/s MFU divides by, and where it came from.

    An explicit ``peak_tflops`` wins; on CUDA the GPU name is looked up in :data:`PEAK_TFLOPS`;
    on a CPU there is no reference peak (``None``) unless given.

    Example:
        >>> from trainopt.perf.bench.mfu import peak_flops_for
        >>> peak_flops_for("cpu")
        (None, 'no reference peak for cpu; pass peak_tflops')
        >>> peak_flops_for("cpu", peak_tflops=1.5)
        (1500000000000.0, 'given: 1.5 TFLOP/s')
    """
    if peak_tflops is not None:
        if not peak_tflops > 0:
            raise ValueError(f"peak_tflops must be positive, got {peak_tflops=}")
        return peak_tflops * 1e12, f"given: {peak_tflops} TFLOP/s"
    device = torch.device(device)
    if device.type != "cuda":
        return None, f"no reference peak for {device.type}; pass peak_tflops"
    gpu = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS.items():
        if key in gpu:
            return tflops * 1e12, f"{key} bf16 dense: {tflops} TFLOP/s"
    return DEFAULT_PEAK_TFLOPS * 1e12, f"unknown GPU {gpu!r}: H100 SXM bf16 dense {DEFAULT_PEAK_TFLOPS} TFLOP/s"
