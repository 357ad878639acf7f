"""What the stability stack costs per step: a bare step, the TrainingStabilizer, and a naive stack.

One run times three variants of the same training step on the reference GPT
(:mod:`trainopt.models`), in interleaved windows so that clock drift and thermal state hit all
three alike:

- ``bare``: autocast forward, backward, fused AdamW step;
- ``stabilizer``: the same step through :class:`~trainopt.stability.stabilizer.TrainingStabilizer`
  (monitors, clipping, on-device skip, boundaries every ``check_every`` steps);
- ``seed_style``: a naive stack, the bare step plus monitors that read the device once per
  parameter: a ``.item()`` per parameter for the gradient norm, ``loss.item()`` for the loss history, and a host-side overflow test.

Each window is timed by the benchmarks' one timer (:mod:`trainopt.perf.bench.timer`: CUDA
events on a GPU, the wall clock on a CPU) after each variant has warmed up until its step time
is stable; the per-step time of a variant is the median over its windows. A second check runs
50 steady-state stabilizer steps under ``torch.cuda.set_sync_debug_mode("error")`` on a GPU
(under :class:`~trainopt.stability.syncs.HostSyncCounter` on a CPU, which counts them).

Run it with ``python -m trainopt.perf.bench stability --out bench_stability.json``
(``--size 124m`` on a GPU, the default there; ``--compile`` to compile the model).
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable
from typing import Any

import torch

from trainopt.models import GPT, gpt_config, synthetic_batch
from trainopt.perf.bench.results import new_results
from trainopt.perf.bench.timer import interleaved_windows, warm_up
from trainopt.stability.stabilizer import TrainingStabilizer
from trainopt.stability.syncs import HostSyncCounter

VARIANTS = ("bare", "stabilizer", "seed_style")
STABILITY_GOAL_RATIO = 1.02  # the stability stack may cost at most 2% of step time


def bare_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              compute_loss: Callable[[], torch.Tensor], dtype: torch.dtype | None) -> torch.Tensor:
    """(a) The step with nothing added: autocast forward, backward, optimizer step.

    Example:
        >>> import torch
        >>> from trainopt.models import GPT
        >>> from trainopt.models import gpt_config
        >>> from trainopt.models import synthetic_batch
        >>> from trainopt.perf.bench.stability import bare_step
        >>> model = GPT(gpt_config("tiny"))
        >>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        >>> x, y = synthetic_batch(model.config, batch_size=2, seq_len=16)
        >>> before = model.lm_head.weight.clone()
        >>> loss = bare_step(model, optimizer, lambda: model(x, targets=y), dtype=None)
        >>> loss.shape, loss.requires_grad, torch.equal(before, model.lm_head.weight)
        (torch.Size([]), False, False)
    """
    optimizer.zero_grad(set_to_none=True)
    with torch.amp.autocast(model_device(model).type, dtype=dtype, enabled=dtype is not None):
        loss = compute_loss()
    loss.backward()
    optimizer.step()
    return loss.detach()


def per_parameter_sync_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                            compute_loss: Callable[[], torch.Tensor], dtype: torch.dtype | None,
                            history: list[float], max_norm: float = 1.0) -> torch.Tensor:
    """(c) A naive monitored step: one ``.item()`` per parameter, ``loss.item()``, a host overflow test.

    Every ``.item()`` waits for the GPU to finish the work queued so far, so the host cannot run
    ahead and the GPU idles while the host queues the next kernels.

    Example:
        >>> import torch
        >>> from trainopt.models import GPT
        >>> from trainopt.models import gpt_config
        >>> from trainopt.models import synthetic_batch
        >>> from trainopt.perf.bench.stability import per_parameter_sync_step
        >>> model = GPT(gpt_config("tiny"))
        >>> optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        >>> x, y = synthetic_batch(model.config, batch_size=2, seq_len=16)
        >>> history = []
        >>> loss = per_parameter_sync_step(model, optimizer, lambda: model(x, targets=y), None, history)
        >>> len(history), history[0] == loss.item()  # the loss went to the host
        (1, True)
    """
    optimizer.zero_grad(set_to_none=True)
    with torch.amp.autocast(model_device(model).type, dtype=dtype, enabled=dtype is not None):
        loss = compute_loss()
    loss.backward()
    total = 0.0
    for p in model.parameters():
        if p.grad is not None:
            total += p.grad.norm(2).item() ** 2
    history.append(loss.item())
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if math.isfinite(total):
        optimizer.step()
    return loss.detach()


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.stability import model_device
        >>> model_device(torch.nn.Linear(2, 2))
        device(type='cpu')
    """
    return next(model.parameters()).device


def _sync_check(stabilizer: TrainingStabilizer, compute_loss: Callable[[], torch.Tensor],
                steps: int = 50) -> dict[str, Any]:
    """Run ``steps`` stabilizer steps between boundaries; count host syncs (on CUDA, any raises)."""
    stabilizer.check_every = 10**9  # no boundary inside the checked steps
    cuda = stabilizer.device.type == "cuda"
    method = "HostSyncCounter" + (' and torch.cuda.set_sync_debug_mode("error")' if cuda else "")
    counter, error = HostSyncCounter(), None
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        with counter:
            for _ in range(steps):
                stabilizer.step(compute_loss)
    except RuntimeError as exc:
        error = str(exc)[:500]
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode(0)
    return {"method": method, "steps": steps, "syncs": counter.count,
            "passed": error is None and counter.count == 0, "error": error}


def run(size: str | None = None, device: str | None = None, batch_size: int | None = None,
        seq_len: int | None = None, steps_per_window: int = 10, windows: int = 10, warmup_steps: int = 5,
        max_warmup_steps: int = 100, check_every: int = 100, compile: bool = False,
        compile_backend: str = "inductor", dtype: str = "bf16", seed: int = 0, command: str | None = None,
        note: str | None = None) -> dict[str, Any]:
    """Time the three variants in one run; return a results document of kind ``"stability"``.

    Args:
        size: GPT preset (``"tiny"`` on a CPU, ``"124m"`` on a GPU by default).
        device: ``"cuda"`` or ``"cpu"``; the GPU when present by default.
        batch_size: Sequences per step (16 for the GPU presets, 4 for tiny by default).
        seq_len: Tokens per sequence (the preset's block size by default).
        steps_per_window: Steps per timed window.
        windows: Timed windows per variant (interleaved).
        warmup_steps, max_warmup_steps: Each variant warms up for at least ``warmup_steps``, then
            until two windows agree within 10% (:func:`~trainopt.perf.bench.timer.warm_up`),
            for at most ``max_warmup_steps``.
        check_every: The stabilizer's boundary interval.
        compile: Wrap each model copy in ``torch.compile`` (with ``compile_backend``).
        dtype: ``"bf16"`` (autocast) or ``"fp32"``.
        seed: Seed of the model and batch.
        command, note: Recorded in ``meta``.

    Returns:
        ``config``, ``warmup`` per variant, ``window_ms`` (ms per step of each window) and
        their ``ms_per_step`` medians, the ``ratios`` to ``bare``, the ``sync_check`` and the
        ``goal_ratio``.

    Example:
        >>> from trainopt.perf.bench.stability import run
        >>> result = run(size="tiny", device="cpu", steps_per_window=2, windows=2, warmup_steps=1,
        ...              seq_len=16, batch_size=2)
        >>> sorted(result["ms_per_step"]), result["sync_check"]["syncs"]
        (['bare', 'seed_style', 'stabilizer'], 0)
    """
    device_ = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = size or ("124m" if device_.type == "cuda" else "tiny")
    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"dtype must be 'bf16' or 'fp32', got {dtype=}")
    for name, value in (("steps_per_window", steps_per_window), ("windows", windows),
                        ("max_warmup_steps", max_warmup_steps), ("warmup_steps", warmup_steps + 1)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    autocast_dtype = torch.bfloat16 if dtype == "bf16" else None
    config = gpt_config(size)
    batch_size = batch_size or (16 if size != "tiny" else 4)
    seq_len = seq_len or config.block_size
    torch.manual_seed(seed)
    base = GPT(config).to(device_)
    x, y = synthetic_batch(config, batch_size, seq_len, device=device_,
                           generator=torch.Generator().manual_seed(seed))
    models = {name: copy.deepcopy(base) for name in VARIANTS}
    del base
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
                  for name, m in models.items()}
    forward = {name: (torch.compile(m, backend=compile_backend) if compile else m) for name, m in models.items()}
    losses = {name: (lambda f=f: f(x, targets=y)) for name, f in forward.items()}
    stabilizer = TrainingStabilizer(models["stabilizer"], optimizers["stabilizer"], dtype=autocast_dtype,
                                    max_grad_norm=1.0, check_every=check_every)
    history: list[float] = []
    steps = {
        "bare": lambda: bare_step(models["bare"], optimizers["bare"], losses["bare"], autocast_dtype),
        "stabilizer": lambda: stabilizer.step(losses["stabilizer"]),
        "seed_style": lambda: per_parameter_sync_step(models["seed_style"], optimizers["seed_style"],
                                                      losses["seed_style"], autocast_dtype, history),
    }
    warmup = {name: warm_up(steps[name], device_, min_steps=warmup_steps, window=steps_per_window,
                            max_steps=max_warmup_steps) for name in VARIANTS}
    times = {name: [s * 1e3 for s in per_step]
             for name, per_step in interleaved_windows(steps, device_, steps_per_window, windows).items()}
    medians = {name: statistics.median(t) for name, t in times.items()}
    results = new_results("stability", device_, command, note)
    results.update({
        "config": {
            "model": f"GPT {size}", "parameters": models["bare"].num_parameters(), "batch_size": batch_size,
            "seq_len": seq_len, "dtype": dtype, "compile": compile, "optimizer": "AdamW(fused=True)",
            "steps_per_window": steps_per_window, "windows": windows, "check_every": check_every,
        },
        "warmup": warmup,
        "window_ms": times,
        "ms_per_step": medians,
        "ratios": {"stabilizer/bare": medians["stabilizer"] / medians["bare"],
                   "seed_style/bare": medians["seed_style"] / medians["bare"]},
        "goal_ratio": STABILITY_GOAL_RATIO,
        "sync_check": _sync_check(stabilizer, losses["stabilizer"]),
    })
    return results
