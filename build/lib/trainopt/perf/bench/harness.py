"""A benchmark harness for training steps of the reference GPT: time, throughput, MFU, memory.

One :class:`BenchConfig` names a configuration (model size, precision, ``torch.compile`` mode,
activation checkpointing, AdamW implementation, attention backend, batch and sequence shape).
:func:`measure` times it correctly:

- build the model and optimizer and warm up until the step time is stable
  (:func:`~trainopt.perf.bench.timer.warm_up`: ``torch.compile`` compiles here; the warm-up is
  reported apart, with the steps it took, and never mixed into the step time);
- time ``windows`` windows of ``steps`` steps each; on a GPU a window is timed with two CUDA
  events and the host waits for the GPU only once, after the last window;
- report the median step time over the windows with its spread (quartiles, min, max), the
  tokens/s and MFU derived from that median, and the peak memory of the steady state
  (``max_memory_allocated`` on CUDA; on a CPU, one more eager step under
  :class:`~trainopt.perf.peak.LiveStorageTracker`).

:func:`build_matrix` varies one field at a time around a base configuration (or every
combination with ``grid=True``); :func:`run_matrix` runs a list of configurations with a
progress bar and a time budget, and writes JSON after each one, so an interrupted run keeps
what it measured. :mod:`trainopt.perf.bench.summary` prints the JSON as a summary.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from trainopt.models import GPT, Block, gpt_config, synthetic_batch
from trainopt.perf.bench.breakdown import profile_breakdown
from trainopt.perf.bench.configs import BenchConfig
from trainopt.perf.bench.mfu import MFU_GOAL, MFU_GOAL_SIZE, mfu, peak_flops_for
from trainopt.perf.bench.results import Results, new_results, write_results
from trainopt.perf.bench.timer import spread, time_windows, warm_up
from trainopt.perf.memory import apply_activation_checkpointing
from trainopt.perf.peak import measure_peak_memory
from trainopt.perf.precision import Precision, PrecisionNotSupportedError
from trainopt.validation import check_int


def build_model(config: BenchConfig, device: str | torch.device) -> nn.Module:
    """The GPT of ``config.size`` on ``device``, blocks checkpointed if asked, compiled if asked.

    Example:
        >>> from trainopt.perf.bench.configs import BenchConfig
        >>> from trainopt.perf.bench.harness import build_model
        >>> model = build_model(BenchConfig(checkpointing=True), "cpu")
        >>> type(model).__name__, model.config.n_layer
        ('GPT', 2)
    """
    with torch.device(device):
        model = GPT(gpt_config(config.size))
    if config.checkpointing:
        apply_activation_checkpointing(model, Block)
    if config.compile == "none":
        return model
    if config.compile_backend == "inductor":
        return torch.compile(model, mode=config.compile)
    return torch.compile(model, backend=config.compile_backend)


def build_optimizer(config: BenchConfig, model: nn.Module) -> torch.optim.Optimizer:
    """AdamW (GPT-style hyperparameters) with the ``foreach`` or ``fused`` implementation.

    Example:
        >>> from trainopt.perf.bench.configs import BenchConfig
        >>> from trainopt.perf.bench.harness import build_model
        >>> from trainopt.perf.bench.harness import build_optimizer
        >>> config = BenchConfig(optimizer="fused")
        >>> build_optimizer(config, build_model(config, "cpu")).defaults["fused"]
        True
    """
    impl = {"fused": True} if config.optimizer == "fused" else {"foreach": True}
    return torch.optim.AdamW(
        model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **impl
    )


def attention_context(name: str) -> contextlib.AbstractContextManager:
    """A context that restricts ``scaled_dot_product_attention`` to one backend (``"auto"``: none).

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.harness import attention_context
        >>> q = k = v = torch.randn(1, 2, 8, 16)
        >>> with attention_context("math"):
        ...     out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> out.shape
        torch.Size([1, 2, 8, 16])
    """
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": "FLASH_ATTENTION",
        "efficient": "EFFICIENT_ATTENTION",
        "cudnn": "CUDNN_ATTENTION",
        "math": "MATH",
    }[name]
    return sdpa_kernel(getattr(SDPBackend, backend))


def make_train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    inputs: torch.Tensor,
    targets: torch.Tensor,
) -> Callable[[], None]:
    """One training step on a fixed batch: forward, backward, optimizer step. No host sync.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.configs import BenchConfig
        >>> from trainopt.perf.bench.harness import build_model
        >>> from trainopt.perf.bench.harness import build_optimizer
        >>> from trainopt.perf.bench.harness import make_train_step
        >>> from trainopt.perf.precision import Precision
        >>> config = BenchConfig(batch_size=2, seq_len=8)
        >>> model = build_model(config, "cpu")
        >>> before = model.lm_head.weight.detach().clone()
        >>> x, y = torch.randint(0, 512, (2, 2, 8))
        >>> optimizer, precision = build_optimizer(config, model), Precision.from_name("fp32")
        >>> make_train_step(model, optimizer, precision, x, y)()
        >>> bool((model.lm_head.weight != before).any()), model.lm_head.weight.grad is None
        (True, True)
    """

    def step() -> None:
        with precision.autocast():
            loss = model(inputs, targets=targets)
        precision.backward(loss)
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)

    return step


def _release_memory(device: torch.device) -> None:
    gc.collect()
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_step_counts(**counts: int) -> None:
    """Raise ``ValueError`` unless ``steps``, ``windows`` and ``max_warmup_steps`` are positive ints
    and the other counts non-negative.

    Example:
        >>> from trainopt.perf.bench.harness import check_step_counts
        >>> check_step_counts(steps=10, windows=5, warmup_steps=0)
        >>> try:
        ...     check_step_counts(windows=0)
        ... except ValueError as error:
        ...     print(error)
        windows must be an int >= 1, got windows=0
    """
    for name, value in counts.items():
        low = 1 if name in ("steps", "windows", "max_warmup_steps") else 0
        check_int(name, value, low)


def measure(
    config: BenchConfig,
    device: str | torch.device = "cpu",
    *,
    warmup_steps: int = 3,
    max_warmup_steps: int = 100,
    steps: int = 10,
    windows: int = 5,
    peak_tflops: dict[str, float] | float | None = None,
    seed: int = 0,
    profile_steps: int = 0,
) -> dict[str, Any]:
    """Benchmark one configuration; return a JSON-ready record.

    Returns:
        ``status`` (``"ok"``, ``"unsupported"``, ``"oom"``), ``name``, ``config``, and for
        ``"ok"``: ``warmup`` (:func:`~trainopt.perf.bench.timer.warm_up`: steps, stable,
        seconds), ``window_step_times_s`` and their :func:`spread` ``step_time_s``,
        ``tokens_per_s`` (tokens per step ÷ median step time), ``mfu`` (tokens/s × FLOPs per
        token ÷ the peak of ``config.precision``, :mod:`~trainopt.perf.bench.mfu`; ``None``
        without a peak), ``peak_memory_bytes`` and how it was measured, and with
        ``profile_steps > 0`` a ``profile`` (:func:`profile_breakdown`, after the timing).

    Example:
        >>> from trainopt.perf.bench import measure
        >>> from trainopt.perf.bench.configs import BenchConfig
        >>> config = BenchConfig(batch_size=2, seq_len=16)
        >>> record = measure(config, steps=2, windows=2, warmup_steps=1)
        >>> record["status"], record["tokens_per_step"], record["mfu"]  # a CPU has no peak
        ('ok', 32, None)
        >>> record["warmup"]["steps"] >= 1 + 2 * 2  # at least two timed warm-up windows
        True
    """
    check_step_counts(
        warmup_steps=warmup_steps,
        max_warmup_steps=max_warmup_steps,
        steps=steps,
        windows=windows,
        profile_steps=profile_steps,
    )
    device = torch.device(device)
    record: dict[str, Any] = {
        "name": config.name,
        "config": asdict(config),
        "tokens_per_step": config.tokens_per_step,
    }
    try:
        precision = Precision.from_name(config.precision, device)
    except PrecisionNotSupportedError as exc:
        return {**record, "status": "unsupported", "error": str(exc)}
    peak, peak_source = peak_flops_for(device, config.precision, peak_tflops)
    torch.manual_seed(seed)
    try:
        with precision.matmul_settings(), attention_context(config.attention):
            model = build_model(config, device)
            gpt = getattr(model, "_orig_mod", model)
            optimizer = build_optimizer(config, model)
            inputs, targets = synthetic_batch(
                gpt.config, config.batch_size, config.sequence_length, device
            )
            step = make_train_step(model, optimizer, precision, inputs, targets.contiguous())
            warmup = warm_up(
                step, device, min_steps=warmup_steps, window=steps, max_steps=max_warmup_steps
            )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            per_step = time_windows(step, device, steps, windows)
            if device.type == "cuda":
                memory = torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
            elif config.compile == "none":
                memory = (
                    measure_peak_memory(step, gpt, optimizer, [inputs, targets], device),
                    "live storages",
                )
            else:  # compiled kernels allocate outside the dispatcher: nothing to count them with
                memory = None, "not measured: compiled on a CPU"
            flops_per_token = gpt.flops_per_token(config.sequence_length)
            parameters = gpt.num_parameters(non_embedding=True)
            breakdown = profile_breakdown(step, device, profile_steps) if profile_steps else None
    except torch.cuda.OutOfMemoryError as exc:
        return {**record, "status": "oom", "error": str(exc).splitlines()[0]}
    finally:
        model = gpt = optimizer = step = inputs = targets = None
        _release_memory(device)
    step_time = spread(per_step)
    tokens_per_s = config.tokens_per_step / step_time["median"]
    return {
        **record,
        "status": "ok",
        "parameters": parameters,
        "flops_per_token": flops_per_token,
        "warmup": warmup,
        "window_step_times_s": per_step,
        "step_time_s": step_time,
        "tokens_per_s": tokens_per_s,
        "peak_flops": peak,
        "peak_source": peak_source,
        "mfu": mfu(flops_per_token, tokens_per_s, peak) if peak else None,
        "peak_memory_bytes": memory[0],
        "memory_method": memory[1],
        **({"profile": breakdown} if breakdown else {}),
    }


def recipe_pair(
    size: str = "tiny",
    device: str | torch.device = "cpu",
    batch_size: int = 8,
    seq_len: int = 0,
    compile_mode: str = "default",
) -> tuple[BenchConfig, BenchConfig]:
    """The plain PyTorch loop a user would write and the project's recipe, on the same shape.

    Plain: fp32, eager, foreach AdamW, attention left to torch. Recipe: bf16 autocast,
    ``torch.compile``, fused AdamW, and the flash attention kernel on CUDA.

    Example:
        >>> from trainopt.perf.bench import recipe_pair
        >>> plain, recipe = recipe_pair("tiny", "cpu", batch_size=4)
        >>> plain.precision, recipe.precision, recipe.optimizer
        ('fp32', 'bf16', 'fused')
    """
    shape = {"size": size, "batch_size": batch_size, "seq_len": seq_len}
    plain = BenchConfig(
        **shape,
        precision="fp32",
        compile="none",
        optimizer="foreach",
        label=f"{size} plain PyTorch loop",
    )
    attention = "flash" if torch.device(device).type == "cuda" else "auto"
    recipe = BenchConfig(
        **shape,
        precision="bf16",
        compile=compile_mode,
        optimizer="fused",
        attention=attention,
        label=f"{size} trainopt recipe",
    )
    return plain, recipe


def speedup(results: dict[str, Any], baseline: str, candidate: str) -> dict[str, Any]:
    """Compare two measured records of ``results`` by name: the ratio of their throughputs.

    Throughput (tokens/s from the median step time) makes the comparison fair when the two
    shapes differ; for equal shapes it is the ratio of median step times.

    Returns:
        ``{"baseline", "candidate", "speedup"}``; ``speedup`` is candidate ÷ baseline tokens/s
        (``None`` if either did not run).

    Example:
        >>> from trainopt.perf.bench.harness import speedup
        >>> results = {"results": [{"name": "plain", "status": "ok", "tokens_per_s": 1000.0},
        ...                        {"name": "recipe", "status": "ok", "tokens_per_s": 2500.0}]}
        >>> speedup(results, "plain", "recipe")["speedup"]
        2.5
    """
    by_name = {r["name"]: r for r in results["results"]}
    missing = [n for n in (baseline, candidate) if n not in by_name]
    if missing:
        raise ValueError(f"no results named {missing}; names are {sorted(by_name)}")
    a, b = by_name[baseline], by_name[candidate]
    ratio = None
    if a["status"] == b["status"] == "ok":
        ratio = b["tokens_per_s"] / a["tokens_per_s"]
    return {"baseline": baseline, "candidate": candidate, "speedup": ratio}


@contextlib.contextmanager
def _progress(total: int, enabled: bool) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr (tqdm when installed); yields ``advance(description)``."""
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is optional: fall back to one line per configuration

        def advance(name: str) -> None:
            if enabled:
                print(f"[bench] done: {name}", file=sys.stderr, flush=True)

        yield advance
        return
    with tqdm(total=total, file=sys.stderr, disable=not enabled, unit="config") as bar:

        def advance(name: str) -> None:
            bar.set_postfix_str(name[:40])
            bar.update()

        yield advance


def run_matrix(
    configs: Sequence[BenchConfig],
    device: str | torch.device | None = None,
    *,
    warmup_steps: int = 3,
    max_warmup_steps: int = 100,
    steps: int = 10,
    windows: int = 5,
    peak_tflops: dict[str, float] | float | None = None,
    time_budget_s: float | None = None,
    out: str | os.PathLike | None = None,
    progress: bool = True,
    results: Results | None = None,
    started: float | None = None,
    profile_steps: int = 0,
    command: str | None = None,
    note: str | None = None,
) -> Results:
    """Measure ``configs`` one after the other; return (and write to ``out``) the results.

    Args:
        configs: What to run, in order.
        device: Where; default ``"cuda"`` if available, else ``"cpu"``.
        warmup_steps, max_warmup_steps, steps, windows: See :func:`measure`.
        peak_tflops: Override the peaks of :func:`~trainopt.perf.bench.mfu.peak_flops_for`
            (needed for a GPU missing from its table: checked before anything runs).
        time_budget_s: Don't start a configuration that would likely end past this many
            seconds after ``started`` (its estimate: the longest run so far of the same size,
            twice that for max-autotune modes); it is recorded as ``"skipped"``.
        out: JSON path, rewritten after every configuration.
        progress: Show a progress bar on stderr.
        results, started: Continue an earlier call's results and clock.
        profile_steps: Profile this many steps of each configuration after timing it.
        command, note: Recorded in the results' ``meta``.

    Example:
        >>> from trainopt.perf.bench import run_matrix
        >>> from trainopt.perf.bench.configs import BenchConfig
        >>> res = run_matrix([BenchConfig(batch_size=2, seq_len=8)], "cpu", steps=1, windows=1,
        ...                  progress=False)
        >>> [r["status"] for r in res["results"]], res["kind"], res["meta"]["device"]
        (['ok'], 'bench', 'cpu')
    """
    check_step_counts(
        warmup_steps=warmup_steps,
        max_warmup_steps=max_warmup_steps,
        steps=steps,
        windows=windows,
        profile_steps=profile_steps,
    )
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if time_budget_s is not None and not time_budget_s > 0:
        raise ValueError(f"time_budget_s must be positive or None, got {time_budget_s=}")
    for precision in dict.fromkeys(c.precision for c in configs):
        peak_flops_for(device, precision, peak_tflops)  # an unknown GPU fails here, before any run
    started = time.perf_counter() if started is None else started
    if results is None:
        results = new_results(
            "bench",
            device,
            command,
            note,
            warmup_steps=warmup_steps,
            max_warmup_steps=max_warmup_steps,
            steps_per_window=steps,
            windows=windows,
        )
        results.update(results=[], goal={"mfu": MFU_GOAL, "size": MFU_GOAL_SIZE})
    durations: dict[str, float] = {}
    for record in results["results"]:
        if "duration_s" in record:
            size = record["config"]["size"]
            durations[size] = max(durations.get(size, 0.0), record["duration_s"])
    with _progress(len(configs), progress) as advance:
        for config in configs:
            elapsed = time.perf_counter() - started
            estimate = durations.get(config.size, 0.0) * (
                2 if "max-autotune" in config.compile else 1
            )
            if time_budget_s is not None and elapsed + estimate > time_budget_s:
                record = {
                    "name": config.name,
                    "config": asdict(config),
                    "status": "skipped",
                    "error": f"time budget of {time_budget_s:g} s reached",
                }
            else:
                begin = time.perf_counter()
                try:
                    record = measure(
                        config,
                        device,
                        warmup_steps=warmup_steps,
                        max_warmup_steps=max_warmup_steps,
                        steps=steps,
                        windows=windows,
                        peak_tflops=peak_tflops,
                        profile_steps=profile_steps,
                    )
                except Exception as exc:  # noqa: BLE001 - one failing configuration must not lose the others
                    record = {
                        "name": config.name,
                        "config": asdict(config),
                        "status": "error",
                        "error": f"{type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}",
                    }
                record["duration_s"] = time.perf_counter() - begin
                durations[config.size] = max(durations.get(config.size, 0.0), record["duration_s"])
            results["results"].append(record)
            results["meta"]["elapsed_s"] = time.perf_counter() - started
            if out is not None:
                write_results(results, out)
            advance(config.name)
    return results
