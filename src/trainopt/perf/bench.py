"""A benchmark harness for training steps of the reference GPT: time, throughput, MFU, memory.

One :class:`BenchConfig` names a configuration (model size, precision, ``torch.compile`` mode,
activation checkpointing, AdamW implementation, attention backend, batch and sequence shape).
:func:`measure` times it correctly:

- build the model and optimizer, run ``warmup_steps`` steps (this is where ``torch.compile``
  compiles; their time is reported apart as ``warmup_s`` and never mixed into the step time);
- time ``windows`` windows of ``steps`` steps each; on a GPU a window is timed with two CUDA
  events and the host waits for the GPU only once, after the last window;
- report the median step time over the windows with its spread (quartiles, min, max), the
  tokens/s and MFU derived from that median, and the peak memory of the steady state.

:func:`build_matrix` varies one field at a time around a base configuration (or every
combination with ``grid=True``); :func:`run_matrix` runs a list of configurations with a
progress bar and a time budget, and writes JSON after each one, so an interrupted run keeps
what it measured. :mod:`trainopt.perf.bench_report` turns the JSON into tables and charts.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainopt.models import GPT, GPT_PRESETS, Block, gpt_config, synthetic_batch
from trainopt.perf.memory import apply_activation_checkpointing
from trainopt.perf.precision import PRECISIONS, Precision, PrecisionNotSupportedError
from trainopt.perf.profiling import StepTimer

COMPILE_MODES: tuple[str, ...] = (
    "none", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs",
)
COMPILE_BACKENDS: tuple[str, ...] = ("inductor", "aot_eager", "eager")
OPTIMIZERS: tuple[str, ...] = ("foreach", "fused")
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "flash", "efficient", "cudnn", "math")
#: Dense bf16 tensor-core peaks (TFLOP/s) by GPU model; the first name found in the device name wins.
PEAK_TFLOPS: dict[str, float] = {
    "H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "A100": 312.0, "L4": 121.0,
}
DEFAULT_PEAK_TFLOPS = 989.4  # H100 SXM, bf16 dense: the MFU reference of this project
MFU_GOAL = 0.5  # the goal for the best configuration of MFU_GOAL_SIZE on one H100
MFU_GOAL_SIZE = "350m"


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
            "size": sorted(GPT_PRESETS), "precision": list(PRECISIONS), "compile": list(COMPILE_MODES),
            "compile_backend": list(COMPILE_BACKENDS), "optimizer": list(OPTIMIZERS),
            "attention": list(ATTENTION_BACKENDS), "checkpointing": [False, True],
        }
        for field_name, values in allowed.items():
            value = getattr(self, field_name)
            if value not in values or type(value) is not type(values[0]):
                raise ValueError(f"{field_name} must be one of {values}, got {field_name}={value!r}")
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got batch_size={self.batch_size!r}")
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
        if self.compile_backend != "inductor":
            parts.append(f"backend={self.compile_backend}")
        if self.checkpointing:
            parts.append("ckpt")
        parts.append(self.optimizer)
        if self.attention != "auto":
            parts.append(f"attn={self.attention}")
        parts.append(f"{self.batch_size}x{self.sequence_length}")
        return " ".join(parts)


def build_matrix(base: BenchConfig, axes: dict[str, Sequence[Any]], grid: bool = False) -> list[BenchConfig]:
    """Configurations around ``base``: one field varied at a time, or every combination.

    Args:
        base: The configuration every variation starts from; it comes first.
        axes: Field name → values to try, e.g. ``{"precision": ["fp32", "bf16"]}``.
        grid: ``True`` for the full Cartesian product of ``axes``.

    Returns:
        Distinct configurations, ``base`` (or the first grid point) first.

    Example:
        >>> configs = build_matrix(BenchConfig(), {"precision": ["fp32", "bf16"], "batch_size": [4, 8]})
        >>> [c.name for c in configs]
        ['tiny fp32 foreach 8x64', 'tiny bf16 foreach 8x64', 'tiny fp32 foreach 4x64']
    """
    names = {f.name for f in fields(BenchConfig)}
    for axis in axes:
        if axis not in names:
            raise ValueError(f"axes keys must be fields of BenchConfig {sorted(names)}, got {axis!r}")
    if grid:
        keys = list(axes)
        candidates = [replace(base, **dict(zip(keys, values)))
                      for values in itertools.product(*(axes[k] for k in keys))]
    else:
        candidates = [base] + [replace(base, **{axis: value}) for axis, values in axes.items()
                               for value in values]
    return list(dict.fromkeys(candidates))


def build_model(config: BenchConfig, device: str | torch.device) -> nn.Module:
    """The GPT of ``config.size`` on ``device``, blocks checkpointed if asked, compiled if asked.

    Example:
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
        >>> config = BenchConfig(optimizer="fused")
        >>> build_optimizer(config, build_model(config, "cpu")).defaults["fused"]
        True
    """
    impl = {"fused": True} if config.optimizer == "fused" else {"foreach": True}
    return torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, **impl)


def attention_context(name: str) -> contextlib.AbstractContextManager:
    """A context that restricts ``scaled_dot_product_attention`` to one backend (``"auto"``: none).

    Example:
        >>> q = k = v = torch.randn(1, 2, 8, 16)
        >>> with attention_context("math"):
        ...     out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> out.shape
        torch.Size([1, 2, 8, 16])
    """
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
               "cudnn": "CUDNN_ATTENTION", "math": "MATH"}[name]
    return sdpa_kernel(getattr(SDPBackend, backend))


def make_train_step(model: nn.Module, optimizer: torch.optim.Optimizer, precision: Precision,
                    inputs: torch.Tensor, targets: torch.Tensor) -> Callable[[], None]:
    """One training step on a fixed batch: forward, backward, optimizer step. No host sync.

    Example:
        >>> config = BenchConfig(batch_size=2, seq_len=8)
        >>> model = build_model(config, "cpu")
        >>> before = model.lm_head.weight.detach().clone()
        >>> x, y = torch.randint(0, 512, (2, 2, 8))
        >>> make_train_step(model, build_optimizer(config, model), Precision.from_name("fp32"), x, y)()
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


def time_windows(step: Callable[[], None], device: str | torch.device, steps: int, windows: int) -> list[float]:
    """Seconds per step in each of ``windows`` windows of ``steps`` steps.

    A :class:`~trainopt.perf.profiling.StepTimer` brackets each window: on CUDA with two events
    and no synchronisation, so the steps run asynchronously, as in training; the host waits
    once, on the last event, when the times are read. On a CPU the wall clock is exact.

    Example:
        >>> times = time_windows(lambda: sum(range(1000)), "cpu", steps=3, windows=2)
        >>> len(times), all(t > 0 for t in times)
        (2, True)
    """
    timer = StepTimer(device, warmup=0)
    for _ in range(windows):
        with timer.step():
            for _ in range(steps):
                step()
    return [ms / 1e3 / steps for ms in timer.times_ms()]


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, min and max of ``values``.

    Example:
        >>> spread([4.0, 1.0, 3.0, 2.0, 5.0])
        {'median': 3.0, 'q1': 2.0, 'q3': 4.0, 'min': 1.0, 'max': 5.0}
    """
    ordered = sorted(values)
    if len(ordered) == 1:
        q1 = q3 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return {"median": statistics.median(ordered), "q1": q1, "q3": q3,
            "min": ordered[0], "max": ordered[-1]}


def peak_flops_for(device: str | torch.device, peak_tflops: float | None = None) -> tuple[float | None, str]:
    """The peak FLOP/s MFU divides by, and where it came from.

    An explicit ``peak_tflops`` wins; on CUDA the GPU name is looked up in :data:`PEAK_TFLOPS`;
    on a CPU there is no reference peak (``None``) unless given.

    Example:
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


#: Kernel (CUDA) or operator (CPU) name patterns → category of the step-time breakdown; first match wins.
PROFILE_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("attention", r"flash|fmha|attention|sdpa"),
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|ampere_|triton_tem|aten::(mm|addmm|bmm|linear|matmul)\b"),
    ("loss", r"log_softmax|nll|cross_entropy"),
    ("casts and copies", r"copy|memcpy|memset|aten::to\b|aten::_to_copy"),
    ("pointwise, norms, other", r""),
)


def profile_breakdown(step: Callable[[], None], device: str | torch.device, steps: int = 2) -> dict[str, Any]:
    """Profile ``steps`` steps; return the time per step by category and the top kernels.

    On CUDA it sums kernel times (what the GPU did); on a CPU the self time of operators.
    ``busy_s_per_step`` is that sum per step: compared with the measured step time it shows
    how long the device sat idle waiting for the host.

    Example:
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
        "steps": steps, "busy_s_per_step": busy,
        "categories": {c: {"s_per_step": s, "share": s / busy if busy else 0.0} for c, s in categories.items()},
        "top": [{"name": name[:90], "s_per_step": s} for name, s in top],
    }


def _release_memory(device: torch.device) -> None:
    gc.collect()
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_step_counts(**counts: int) -> None:
    """Raise ``ValueError`` unless ``steps`` and ``windows`` are positive ints and the others non-negative.

    Example:
        >>> check_step_counts(steps=10, windows=5, warmup_steps=0)
        >>> try:
        ...     check_step_counts(windows=0)
        ... except ValueError as error:
        ...     print(error)
        windows must be a positive int, got windows=0
    """
    for name, value in counts.items():
        low = 1 if name in ("steps", "windows") else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            kind = "positive" if low else "non-negative"
            raise ValueError(f"{name} must be a {kind} int, got {name}={value!r}")


def measure(config: BenchConfig, device: str | torch.device = "cpu", *, warmup_steps: int = 3,
            steps: int = 10, windows: int = 5, peak_flops: float | None = None, seed: int = 0,
            profile_steps: int = 0) -> dict[str, Any]:
    """Benchmark one configuration; return a JSON-ready record.

    Returns:
        ``status`` (``"ok"``, ``"unsupported"``, ``"oom"``), ``name``, ``config``, and for
        ``"ok"``: ``step_time_s`` (:func:`spread` over windows), ``tokens_per_s`` (tokens per
        step ÷ median step time), ``mfu`` (tokens/s × FLOPs per token ÷ ``peak_flops``, or
        ``None``), ``peak_memory_bytes`` (CUDA only), ``warmup_s``, ``flops_per_token``, and
        with ``profile_steps > 0`` a ``profile`` (:func:`profile_breakdown`, after the timing).

    Example:
        >>> record = measure(BenchConfig(batch_size=2, seq_len=16), steps=2, windows=2, warmup_steps=1)
        >>> record["status"], record["tokens_per_step"]
        ('ok', 32)
        >>> record["tokens_per_s"] == 32 / record["step_time_s"]["median"]
        True
    """
    check_step_counts(warmup_steps=warmup_steps, steps=steps, windows=windows, profile_steps=profile_steps)
    device = torch.device(device)
    record: dict[str, Any] = {"name": config.name, "config": asdict(config),
                              "tokens_per_step": config.tokens_per_step}
    try:
        precision = Precision.from_name(config.precision, device)
    except PrecisionNotSupportedError as exc:
        return {**record, "status": "unsupported", "error": str(exc)}
    torch.manual_seed(seed)
    try:
        with precision.matmul_settings(), attention_context(config.attention):
            model = build_model(config, device)
            gpt = getattr(model, "_orig_mod", model)
            optimizer = build_optimizer(config, model)
            inputs, targets = synthetic_batch(gpt.config, config.batch_size, config.sequence_length, device)
            step = make_train_step(model, optimizer, precision, inputs, targets.contiguous())
            begin = time.perf_counter()
            for _ in range(warmup_steps):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            warmup_s = time.perf_counter() - begin
            per_step = time_windows(step, device, steps, windows)
            peak_memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
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
        **record, "status": "ok", "parameters": parameters,
        "flops_per_token": flops_per_token, "warmup_s": warmup_s, "window_step_times_s": per_step,
        "step_time_s": step_time, "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * flops_per_token / peak_flops if peak_flops else None,
        "peak_memory_bytes": peak_memory, **({"profile": breakdown} if breakdown else {}),
    }


def recipe_pair(size: str = "tiny", device: str | torch.device = "cpu", batch_size: int = 8,
                seq_len: int = 0, compile_mode: str = "default") -> tuple[BenchConfig, BenchConfig]:
    """The plain PyTorch loop a user would write and the project's recipe, on the same shape.

    Plain: fp32, eager, foreach AdamW, attention left to torch. Recipe: bf16 autocast,
    ``torch.compile``, fused AdamW, and the flash attention kernel on CUDA.

    Example:
        >>> plain, recipe = recipe_pair("tiny", "cpu", batch_size=4)
        >>> plain.precision, recipe.precision, recipe.optimizer
        ('fp32', 'bf16', 'fused')
    """
    shape = dict(size=size, batch_size=batch_size, seq_len=seq_len)
    plain = BenchConfig(**shape, precision="fp32", compile="none", optimizer="foreach",
                        label=f"{size} plain PyTorch loop")
    attention = "flash" if torch.device(device).type == "cuda" else "auto"
    recipe = BenchConfig(**shape, precision="bf16", compile=compile_mode, optimizer="fused",
                         attention=attention, label=f"{size} trainopt recipe")
    return plain, recipe


def speedup(results: dict[str, Any], baseline: str, candidate: str) -> dict[str, Any]:
    """Compare two measured records of ``results`` by name: the ratio of their throughputs.

    Throughput (tokens/s from the median step time) makes the comparison fair when the two
    shapes differ; for equal shapes it is the ratio of median step times.

    Returns:
        ``{"baseline", "candidate", "speedup"}``; ``speedup`` is candidate ÷ baseline tokens/s
        (``None`` if either did not run).

    Example:
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


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict[str, Any]:
    """The commit of the code that ran, and whether tracked files differed from it.

    Outside a git checkout (a copied tree), the commit comes from ``TRAINOPT_GIT_COMMIT`` if set.

    Example:
        >>> sorted(git_state())
        ['git_commit', 'git_dirty']
    """
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": os.environ.get("TRAINOPT_GIT_COMMIT") or None, "git_dirty": None}
    return {"git_commit": commit, "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no"))}


def environment(device: str | torch.device, peak_tflops: float | None = None) -> dict[str, Any]:
    """Hardware, software and MFU reference of a run, for the results file.

    Example:
        >>> meta = environment("cpu")
        >>> meta["device"], meta["torch"] == torch.__version__, meta["peak_flops"]
        ('cpu', True, None)
    """
    device = torch.device(device)
    peak, source = peak_flops_for(device, peak_tflops)
    cuda = device.type == "cuda"
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **git_state(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "peak_flops": peak,
        "peak_source": source,
        "mfu_goal": MFU_GOAL,
        "mfu_goal_size": MFU_GOAL_SIZE,
    }


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


def write_results(results: dict[str, Any], out: str | os.PathLike) -> None:
    """Write ``results`` as JSON atomically (a reader never sees half a file).

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "results.json"
        >>> write_results({"meta": {}, "results": []}, path)
        >>> json.loads(path.read_text())
        {'meta': {}, 'results': []}
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, out)


def run_matrix(configs: Sequence[BenchConfig], device: str | torch.device | None = None, *,
               warmup_steps: int = 3, steps: int = 10, windows: int = 5, peak_tflops: float | None = None,
               time_budget_s: float | None = None, out: str | os.PathLike | None = None,
               progress: bool = True, results: dict[str, Any] | None = None,
               started: float | None = None, profile_steps: int = 0) -> dict[str, Any]:
    """Measure ``configs`` one after the other; return (and write to ``out``) the results.

    Args:
        configs: What to run, in order.
        device: Where; default ``"cuda"`` if available, else ``"cpu"``.
        warmup_steps, steps, windows: See :func:`measure`.
        peak_tflops: Override the peak of :func:`peak_flops_for`.
        time_budget_s: Don't start a configuration that would likely end past this many
            seconds after ``started`` (its estimate: the longest run so far of the same size,
            twice that for max-autotune modes); it is recorded as ``"skipped"``.
        out: JSON path, rewritten after every configuration.
        progress: Show a progress bar on stderr.
        results, started: Continue an earlier call's results and clock.
        profile_steps: Profile this many steps of each configuration after timing it.

    Example:
        >>> res = run_matrix([BenchConfig(batch_size=2, seq_len=8)], "cpu", steps=1, windows=1, progress=False)
        >>> [r["status"] for r in res["results"]], res["meta"]["device"]
        (['ok'], 'cpu')
    """
    check_step_counts(warmup_steps=warmup_steps, steps=steps, windows=windows, profile_steps=profile_steps)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if time_budget_s is not None and not time_budget_s > 0:
        raise ValueError(f"time_budget_s must be positive or None, got {time_budget_s=}")
    peak, _ = peak_flops_for(device, peak_tflops)
    started = time.perf_counter() if started is None else started
    if results is None:
        results = {"meta": {**environment(device, peak_tflops), "warmup_steps": warmup_steps,
                            "steps_per_window": steps, "windows": windows}, "results": []}
    durations: dict[str, float] = {}
    for record in results["results"]:
        if "duration_s" in record:
            size = record["config"]["size"]
            durations[size] = max(durations.get(size, 0.0), record["duration_s"])
    with _progress(len(configs), progress) as advance:
        for config in configs:
            elapsed = time.perf_counter() - started
            estimate = durations.get(config.size, 0.0) * (2 if "max-autotune" in config.compile else 1)
            if time_budget_s is not None and elapsed + estimate > time_budget_s:
                record = {"name": config.name, "config": asdict(config), "status": "skipped",
                          "error": f"time budget of {time_budget_s:g} s reached"}
            else:
                begin = time.perf_counter()
                try:
                    record = measure(config, device, warmup_steps=warmup_steps, steps=steps,
                                     windows=windows, peak_flops=peak, profile_steps=profile_steps)
                except Exception as exc:  # noqa: BLE001 - one failing configuration must not lose the others
                    record = {"name": config.name, "config": asdict(config), "status": "error",
                              "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
                record["duration_s"] = time.perf_counter() - begin
                durations[config.size] = max(durations.get(config.size, 0.0), record["duration_s"])
            results["results"].append(record)
            results["meta"]["elapsed_s"] = time.perf_counter() - started
            if out is not None:
                write_results(results, out)
            advance(config.name)
    return results
