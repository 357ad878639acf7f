"""Where a step's time goes: the profiler's device time by category of kernel or operator."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

PROFILE_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("attention", r"flash|fmha|attention|sdpa"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    (
        "matmul",
        r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|ampere_|triton_tem|aten::(mm|addmm|bmm|linear|matmul)\b",
    ),
    ("loss", r"log_softmax|nll|cross_entropy"),
    ("casts and copies", r"copy|memcpy|memset|aten::to\b|aten::_to_copy"),
    ("pointwise, norms, other", r""),
)


def profile_breakdown(
    step: Callable[[], None], device: str | torch.device, steps: int = 2
) -> dict[str, Any]:
    """Profile ``steps`` steps; return the time per step by category and the top kernels.

    On CUDA it sums kernel times (what the GPU did); on a CPU the self time of operators.
    ``busy_s_per_step`` is that sum per step: compared with the measured step time it shows
    how long the device sat idle waiting for the host.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.breakdown import profile_breakdown
        >>> model = torch.nn.Linear(64, 64)
        >>> result = profile_breakdown(lambda: model(torch.randn(32, 64)).sum().backward(), "cpu")
        >>> "matmul" in result["categories"], result["steps"]
        (True, 2)
    """

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    device = torch.device(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    by_name: dict[str, float] = {}
    for event in prof.events():
        if cuda and event.device_type == DeviceType.CUDA:
            seconds = event.time_range.elapsed_us() / 1e6
        elif not cuda and event.device_type == DeviceType.CPU:
            seconds = event.self_cpu_time_total / 1e6
        else:
            continue
        by_name[event.name] = by_name.get(event.name, 0.0) + seconds / steps
    busy = sum(by_name.values())
    categories = {name: 0.0 for name, _ in PROFILE_CATEGORIES}
    for name, seconds in by_name.items():
        category = next(c for c, pattern in PROFILE_CATEGORIES if re.search(pattern, name.lower()))
        categories[category] += seconds
    top = sorted(by_name.items(), key=lambda item: item[1], reverse=True)[:8]
    return {
        "steps": steps,
        "busy_s_per_step": busy,
        "categories": {
            c: {"s_per_step": s, "share": s / busy if busy else 0.0} for c, s in categories.items()
        },
        "top": [{"name": name[:90], "s_per_step": s} for name, s in top],
    }
