"""What the stability stack costs per step, per optimizer form: a bare step against the stabilizer.

For each optimizer form (:data:`FORMS`: AdamW fused, foreach and single-tensor, SGD with
momentum 0.9 in its default form and foreach), each with a cosine schedule (a ``LambdaLR`` from
:func:`~trainopt.schedules.cosine_annealing_schedule`, which changes the learning rate every
step: the path where host reads used to be added), one run times two copies of the same step
on the reference GPT (:mod:`trainopt.models`):

- ``bare``: the step a plain loop writes: autocast forward, backward,
  ``clip_grad_norm_(max_norm=1.0)``, optimizer step, scheduler step;
- ``stabilized``: the same step through
  :class:`~trainopt.stability.stabilizer.TrainingStabilizer` with ``max_grad_norm=1.0``
  (monitors, clipping by the norm the monitor measured, on-device skip, the schedule stepped at
  boundaries every ``check_every`` steps).

Both clip at the same norm, so the ratio is what the stability stack adds to a loop that already
clips (nanoGPT, the Hugging Face Trainer's default ``max_grad_norm=1.0``); the stabilizer's
clipping reuses its monitor's norm instead of computing it a second time.

The two alternate in windows (bare, stabilized, then stabilized, bare, ...), after each has
warmed up until its step time is stable, so that drift and the load of a shared machine hit
both alike. Each pair of neighbouring windows gives one ratio (stabilized over bare); the form's
ratio is the median of these paired ratios, with a percentile-bootstrap interval of that median
and the smallest and largest paired ratio. Windows are timed by the benchmarks' one timer
(:mod:`trainopt.perf.bench.timer`: CUDA events on a GPU, the wall clock on a CPU).

Host reads: ``sync_steps`` steady-state steps of each (no boundary among them) run under
:class:`~trainopt.stability.syncs.HostSyncCounter`; the stabilized step may read the host no
more often than the bare one (some forms read their step count on the host themselves). On a
GPU the stabilized steps of a form whose bare step reads nothing also run under
``torch.cuda.set_sync_debug_mode("error")``.

Run it with ``python -m trainopt.perf.bench stability --out bench_stability.json``
(``--size 124m`` on a GPU, the default there; ``--compile`` to compile the model).
"""

from __future__ import annotations

import copy
import math
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from trainopt.models import GPT, gpt_config, synthetic_batch
from trainopt.perf.bench.results import new_results
from trainopt.perf.bench.timer import interleaved_windows, warm_up
from trainopt.schedules import cosine_annealing_schedule
from trainopt.stability.stabilizer import TrainingStabilizer
from trainopt.stability.syncs import HostSyncCounter
from trainopt.validation import check_int

VARIANTS = ("bare", "stabilized")
STABILITY_GOAL_RATIO = 1.05  # the stabilizer may cost at most 5% of a bare step's time
FORMS: dict[str, tuple[str, dict[str, Any]]] = {
    "AdamW fused": ("AdamW", {"fused": True}),
    "AdamW foreach": ("AdamW", {"foreach": True}),
    "AdamW single-tensor": ("AdamW", {"foreach": False}),
    "SGD default": ("SGD", {}),
    "SGD foreach": ("SGD", {"foreach": True}),
}
"""Each optimizer form's name → its class in ``torch.optim`` and the keywords picking the form."""
OPTIMIZER_SETTINGS = {
    "AdamW": {"lr": 3e-4, "weight_decay": 0.1},
    "SGD": {"lr": 0.05, "momentum": 0.9},
}
MAX_NORM = 1.0  # both steps clip at this norm
SCHEDULE_STEPS = 100_000  # the cosine schedule's length: its rate changes on every step of a run


def bare_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    compute_loss: Callable[[], torch.Tensor],
    dtype: torch.dtype | None,
    scheduler: Any = None,
    max_norm: float | None = None,
) -> torch.Tensor:
    """(a) The step with nothing added: autocast forward, backward, clipping, optimizer and
    scheduler step.

    ``max_norm``: clip with :func:`torch.nn.utils.clip_grad_norm_` first (``None``: no clipping).

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
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss.detach()


def per_parameter_sync_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    compute_loss: Callable[[], torch.Tensor],
    dtype: torch.dtype | None,
    history: list[float],
    max_norm: float = 1.0,
) -> torch.Tensor:
    """(c) A naive monitored step: one ``.item()`` per parameter, ``loss.item()``, a host overflow
    test.

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
        >>> def closure():
        ...     return model(x, targets=y)
        >>> loss = per_parameter_sync_step(model, optimizer, closure, None, history)
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


def build_optimizer(form: str, params: Any) -> torch.optim.Optimizer:
    """The optimizer of a form of :data:`FORMS` over ``params``.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.stability import build_optimizer
        >>> opt = build_optimizer("SGD foreach", torch.nn.Linear(2, 2).parameters())
        >>> type(opt).__name__, opt.defaults["momentum"], opt.defaults["foreach"]
        ('SGD', 0.9, True)
    """
    if form not in FORMS:
        raise ValueError(f"forms must be among {list(FORMS)}, got {form!r}")
    name, keywords = FORMS[form]
    return getattr(torch.optim, name)(params, **OPTIMIZER_SETTINGS[name], **keywords)


def paired_ratios(
    bare: list[float],
    stabilized: list[float],
    *,
    confidence: float = 0.95,
    resamples: int = 4000,
    seed: int = 0,
) -> dict[str, Any]:
    """Median of the paired window ratios ``stabilized[i] / bare[i]``, its interval and range.

    The interval is a percentile bootstrap of the median over the pairs (resampled with the
    seed ``seed``, so the same windows give the same interval).

    Example:
        >>> from trainopt.perf.bench.stability import paired_ratios
        >>> r = paired_ratios([10.0, 20.0, 10.0, 11.0], [11.0, 21.0, 10.5, 11.0])
        >>> round(r["ratio"], 3), r["min"], round(r["max"], 3), r["low"] <= r["ratio"] <= r["high"]
        (1.05, 1.0, 1.1, True)
    """
    if len(bare) != len(stabilized) or not bare:
        raise ValueError("bare and stabilized must hold the same number (at least one) of windows")
    ratios = np.asarray(stabilized, dtype=float) / np.asarray(bare, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(ratios[rng.integers(0, ratios.size, (resamples, ratios.size))], axis=1)
    low, high = np.quantile(medians, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {
        "ratio": float(np.median(ratios)),
        "low": float(low),
        "high": float(high),
        "confidence": confidence,
        "min": float(ratios.min()),
        "max": float(ratios.max()),
        "pairs": ratios.tolist(),
    }


def _alternating_windows(
    steps: dict[str, Callable[[], Any]], device: torch.device, steps_per_window: int, windows: int
) -> dict[str, list[float]]:
    """Milliseconds per step of ``windows`` windows each of bare and stabilized, in the order
    AB BA AB ...: window ``i`` of one is always next to window ``i`` of the other."""
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for window in range(windows):
        order = VARIANTS if window % 2 == 0 else VARIANTS[::-1]
        for name, per_step in interleaved_windows(
            {n: steps[n] for n in order}, device, steps_per_window, 1
        ).items():
            times[name].append(per_step[0] * 1e3)
    return times


def _host_reads(
    step: Callable[[], Any], steps: int, device: torch.device, debug_mode: bool
) -> dict[str, Any]:
    """Host reads of ``steps`` steps (:class:`HostSyncCounter`; on CUDA, optionally also under
    ``set_sync_debug_mode("error")``, whose error is returned)."""
    counter, error = HostSyncCounter(), None
    if debug_mode:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        with counter:
            for _ in range(steps):
                step()
    except RuntimeError as exc:
        error = str(exc)[:500]
    finally:
        if debug_mode:
            torch.cuda.set_sync_debug_mode(0)
    return {
        "count": counter.count,
        "per_step": counter.count / steps,
        "operators": dict(counter.operators),
        "error": error,
    }


def _measure_form(
    form: str,
    base: torch.nn.Module,
    compute: Callable[[torch.nn.Module], Any],
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    *,
    steps_per_window: int,
    windows: int,
    warmup_steps: int,
    max_warmup_steps: int,
    check_every: int,
    sync_steps: int,
) -> dict[str, Any]:
    models = {name: copy.deepcopy(base) for name in VARIANTS}
    optimizers = {name: build_optimizer(form, m.parameters()) for name, m in models.items()}
    schedulers = {
        name: cosine_annealing_schedule(o, total_steps=SCHEDULE_STEPS, warmup_steps=10)
        for name, o in optimizers.items()
    }
    stabilizer = TrainingStabilizer(
        models["stabilized"],
        optimizers["stabilized"],
        schedulers["stabilized"],
        dtype=autocast_dtype,
        max_grad_norm=MAX_NORM,
        check_every=check_every,
    )
    steps = {
        "bare": lambda: bare_step(
            models["bare"],
            optimizers["bare"],
            lambda: compute(models["bare"]),
            autocast_dtype,
            schedulers["bare"],
            max_norm=MAX_NORM,
        ),
        "stabilized": lambda: stabilizer.step(lambda: compute(models["stabilized"])),
    }
    warmup = {
        name: warm_up(
            steps[name],
            device,
            min_steps=warmup_steps,
            window=steps_per_window,
            max_steps=max_warmup_steps,
        )
        for name in VARIANTS
    }
    times = _alternating_windows(steps, device, steps_per_window, windows)
    while stabilizer.steps % check_every + sync_steps >= check_every:
        steps["stabilized"]()  # no boundary among the counted steps: they are the steady state
    reads = {"bare": _host_reads(steps["bare"], sync_steps, device, False)}
    reads["stabilized"] = _host_reads(
        steps["stabilized"],
        sync_steps,
        device,
        device.type == "cuda" and reads["bare"]["count"] == 0,
    )
    name, keywords = FORMS[form]
    settings = {**OPTIMIZER_SETTINGS[name], **keywords}
    return {
        "form": form,
        "status": "ok",
        "optimizer": f"{name}({', '.join(f'{k}={v!r}' for k, v in settings.items())})",
        "warmup": warmup,
        "window_ms": times,
        "ms_per_step": {v: statistics.median(t) for v, t in times.items()},
        "ratio": paired_ratios(times["bare"], times["stabilized"]),
        "host_reads": {"steps": sync_steps, **reads},
    }


def run(
    size: str | None = None,
    device: str | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    steps_per_window: int = 10,
    windows: int = 20,
    warmup_steps: int = 5,
    max_warmup_steps: int = 100,
    check_every: int = 100,
    compile: bool = False,
    compile_backend: str = "inductor",
    dtype: str = "bf16",
    seed: int = 0,
    forms: list[str] | None = None,
    sync_steps: int = 20,
    command: str | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """Time bare and stabilized steps per optimizer form; return a ``"stability"`` results document.

    Args:
        size: GPT preset (``"tiny"`` on a CPU, ``"124m"`` on a GPU by default).
        device: ``"cuda"`` or ``"cpu"``; the GPU when present by default.
        batch_size: Sequences per step (16 for the GPU presets, 4 for tiny by default).
        seq_len: Tokens per sequence (the preset's block size by default).
        steps_per_window: Steps per timed window.
        windows: Timed windows of each of bare and stabilized, per form (alternating).
        warmup_steps, max_warmup_steps: Each step warms up for at least ``warmup_steps``, then
            until two windows agree within 10% (:func:`~trainopt.perf.bench.timer.warm_up`),
            for at most ``max_warmup_steps``.
        check_every: The stabilizer's boundary interval.
        compile: Wrap each model copy in ``torch.compile`` (with ``compile_backend``).
        dtype: ``"bf16"`` (autocast) or ``"fp32"``.
        seed: Seed of the model and batch.
        forms: Names from :data:`FORMS` (all by default).
        sync_steps: Steady-state steps whose host reads are counted, per form and step.
        command, note: Recorded in ``meta``.

    Returns:
        ``config``, ``forms`` (per form: ``warmup``, ``window_ms``, ``ms_per_step`` medians,
        the paired ``ratio`` with its interval, ``host_reads`` of bare and stabilized), the
        ``goal_ratio`` and the ``sync_check`` (stabilized reads no more than bare, every form).

    Example:
        >>> from trainopt.perf.bench.stability import run
        >>> result = run(size="tiny", device="cpu", steps_per_window=1, windows=2, warmup_steps=1,
        ...              max_warmup_steps=2, seq_len=8, batch_size=2, forms=["SGD default"],
        ...              sync_steps=2)
        >>> [f["form"] for f in result["forms"]], result["sync_check"]["passed"]
        (['SGD default'], True)
    """
    device_ = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = size or ("124m" if device_.type == "cuda" else "tiny")
    if dtype not in ("bf16", "fp32"):
        raise ValueError(f"dtype must be 'bf16' or 'fp32', got {dtype=}")
    for name, value in (
        ("steps_per_window", steps_per_window),
        ("windows", windows),
        ("max_warmup_steps", max_warmup_steps),
        ("sync_steps", sync_steps),
        ("warmup_steps", warmup_steps + 1),
    ):
        check_int(name, value, 1)
    if sync_steps >= check_every:
        raise ValueError(
            f"sync_steps must be below check_every (steps between boundaries), got "
            f"{sync_steps=}, {check_every=}"
        )
    forms = list(FORMS) if forms is None else list(forms)
    unknown = [f for f in forms if f not in FORMS]
    if unknown or not forms:
        raise ValueError(f"forms must be among {list(FORMS)}, got {unknown or forms}")
    autocast_dtype = torch.bfloat16 if dtype == "bf16" else None
    config = gpt_config(size)
    batch_size = batch_size or (16 if size != "tiny" else 4)
    seq_len = seq_len or config.block_size
    torch.manual_seed(seed)
    base = GPT(config).to(device_)
    x, y = synthetic_batch(
        config, batch_size, seq_len, device=device_, generator=torch.Generator().manual_seed(seed)
    )
    compiled: dict[int, Any] = {}

    def compute(model: torch.nn.Module) -> torch.Tensor:
        if compile and id(model) not in compiled:
            compiled[id(model)] = torch.compile(model, backend=compile_backend)
        return compiled.get(id(model), model)(x, targets=y)

    measured = []
    for form in forms:
        try:
            measured.append(
                _measure_form(
                    form,
                    base,
                    compute,
                    device_,
                    autocast_dtype,
                    steps_per_window=steps_per_window,
                    windows=windows,
                    warmup_steps=warmup_steps,
                    max_warmup_steps=max_warmup_steps,
                    check_every=check_every,
                    sync_steps=sync_steps,
                )
            )
        except (RuntimeError, ValueError) as exc:  # a form this device or torch lacks
            measured.append({"form": form, "status": "error", "error": str(exc)[:500]})
        compiled.clear()
    ok = [f for f in measured if f["status"] == "ok"]
    more = [
        f["form"]
        for f in ok
        if f["host_reads"]["stabilized"]["count"] > f["host_reads"]["bare"]["count"]
    ]
    errors = [
        f"{f['form']}: {f['host_reads']['stabilized']['error']}"
        for f in ok
        if f["host_reads"]["stabilized"]["error"]
    ]
    cuda = device_.type == "cuda"
    results = new_results("stability", device_, command, note)
    results.update(
        {
            "config": {
                "model": f"GPT {size}",
                "parameters": base.num_parameters(),
                "batch_size": batch_size,
                "seq_len": seq_len,
                "dtype": dtype,
                "compile": compile,
                "max_grad_norm": MAX_NORM,
                "schedule": f"cosine LambdaLR (cosine_annealing_schedule, {SCHEDULE_STEPS} steps)",
                "steps_per_window": steps_per_window,
                "windows": windows,
                "check_every": check_every,
                "threads": torch.get_num_threads(),
            },
            "forms": measured,
            "goal_ratio": STABILITY_GOAL_RATIO,
            "sync_check": {
                "method": "HostSyncCounter"
                + (' and torch.cuda.set_sync_debug_mode("error")' if cuda else ""),
                "steps": sync_steps,
                "more_reads_than_bare": more,
                "errors": errors,
                "passed": len(ok) == len(measured) and not more and not errors,
            },
        }
    )
    return results
