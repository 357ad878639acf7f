"""``torch.compile`` measured: graph breaks, compilations, regional compilation, compile time.

The compilation page's code:

- :func:`graph_breaks` runs a function once under ``torch._dynamo.explain`` and reports its
  graphs, graph breaks and their reasons;
- :class:`GraphCounter` is a ``torch.compile`` backend that counts the graphs Dynamo hands it
  and runs them eagerly, so :func:`count_compilations` can count recompiles in milliseconds;
- :func:`compile_repeated_blocks` compiles each repeated block of a model (regional
  compilation);
- :func:`measure_compile` times the first compiled training step (the compile time) and the
  steady-state step against eager: ``python -m trainopt.perf.bench compile`` writes its
  results file, which the compilation page renders.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainopt.models import GPT, gpt_config, synthetic_batch
from trainopt.perf.bench.results import Results, new_results
from trainopt.perf.bench.timer import interleaved_windows, spread, warm_up
from trainopt.perf.precision import Precision


@dataclass(frozen=True)
class GraphReport:
    """What Dynamo made of one call: ``graphs`` captured, ``graph_breaks`` between them, the
    distinct first lines of the break ``reasons``, and the ``ops`` in all graphs.

    Example:
        >>> import torch
        >>> from trainopt.perf.compilation import graph_breaks
        >>> report = graph_breaks(torch.sin, torch.ones(3))
        >>> report.graphs, report.graph_breaks, report.reasons
        (1, 0, ())
    """

    graphs: int
    graph_breaks: int
    reasons: tuple[str, ...]
    ops: int


def graph_breaks(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> GraphReport:
    """Run ``fn(*args, **kwargs)`` once under ``torch._dynamo.explain`` (no backend compiler).

    ``explain`` resets Dynamo's caches first: call it before compiling, not between steps.

    Example:
        >>> import torch
        >>> from trainopt.perf.compilation import graph_breaks
        >>> report = graph_breaks(lambda x: x.sin() * x.sum().item(), torch.ones(3))
        >>> report.graphs, report.graph_breaks  # .item() leaves the graph: two graphs
        (2, 1)
        >>> "item" in report.reasons[0]
        True
    """
    out = torch._dynamo.explain(fn)(*args, **kwargs)
    reasons = tuple(dict.fromkeys(str(r.reason).strip().splitlines()[0] for r in out.break_reasons))
    return GraphReport(out.graph_count, out.graph_break_count, reasons, out.op_count)


class GraphCounter:
    """A ``torch.compile`` backend that counts the graphs it is given and runs them eagerly.

    Each graph Dynamo captures, first compile or recompile, is one call. Nothing is compiled,
    so counting costs tracing time only.

    Example:
        >>> import torch
        >>> from trainopt.perf.compilation import GraphCounter
        >>> counter = GraphCounter()
        >>> f = torch.compile(lambda x: x * 2, backend=counter)
        >>> _ = f(torch.ones(2)), f(torch.ones(2))
        >>> counter.graphs
        1
    """

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        self.graphs += 1
        return gm.forward


def count_compilations(
    fn: Callable[..., Any], calls: Iterable[Sequence[Any]], dynamic: bool | None = None
) -> int:
    """Graphs Dynamo captures when ``fn`` is compiled and called once with each tuple in ``calls``.

    One graph for the first call; each call that a guard rejects (a new shape, dtype, or a
    Python value the graph specialised on) adds a recompile. ``dynamic`` is passed to
    ``torch.compile``: ``None`` marks a dimension dynamic once it has changed, ``False``
    never does, ``True`` tries from the start.

    Example:
        >>> import torch
        >>> from trainopt.perf.compilation import count_compilations
        >>> calls = [(torch.ones(n, 4),) for n in (2, 3, 4, 5)]
        >>> (count_compilations(torch.sin, calls),
        ...  count_compilations(torch.sin, calls, dynamic=False))
        (2, 4)
    """
    torch._dynamo.reset()
    counter = GraphCounter()
    compiled = torch.compile(fn, backend=counter, dynamic=dynamic)
    for args in calls:
        compiled(*args)
    return counter.graphs


def compile_repeated_blocks(
    model: nn.Module, block_type: type[nn.Module], **compile_kwargs: Any
) -> int:
    """Compile every submodule of type ``block_type`` in place (``nn.Module.compile``); return how
    many.

    Regional compilation: the blocks of a transformer share their code, so Dynamo traces one
    and reuses it for the others (parameters are graph inputs), and the compile time is that
    of one block, not of the whole model.

    Example:
        >>> import torch
        >>> from trainopt.models import GPT, Block, gpt_config
        >>> from trainopt.perf.compilation import GraphCounter, compile_repeated_blocks
        >>> torch._dynamo.reset()
        >>> model, counter = GPT(gpt_config("tiny", n_layer=3)), GraphCounter()
        >>> compile_repeated_blocks(model, Block, backend=counter)
        3
        >>> _ = model(torch.zeros(1, 8, dtype=torch.long))
        >>> counter.graphs  # one graph serves all three blocks
        1
    """
    blocks = [m for m in model.modules() if isinstance(m, block_type)]
    for block in blocks:
        block.compile(**compile_kwargs)
    return len(blocks)


def _timed_first_step(step: Callable[[], Any], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    begin = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - begin


def _train_step(
    model: nn.Module, precision: Precision, x: torch.Tensor, y: torch.Tensor
) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        with precision.autocast():
            loss = model(x, targets=y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def measure_compile(
    size: str = "tiny",
    device: str | torch.device = "cpu",
    batch_size: int = 8,
    seq_len: int | None = None,
    modes: Sequence[str] = ("default",),
    backend: str = "inductor",
    steps: int = 5,
    windows: int = 3,
    warmup_steps: int = 2,
    max_warmup_steps: int = 30,
    command: str | None = None,
    note: str | None = None,
) -> Results:
    """Compile time and steady-state training step of the GPT, eager against each compile ``mode``.

    Each variant trains its own copy of one model on one batch (AdamW, bf16 autocast on CUDA,
    fp32 on a CPU). A compiled variant's ``compile_s`` is the wall time of its first step
    (tracing, compilation, and one step); after a warm-up, all variants are timed in
    interleaved windows. The
    ``speedup`` is eager's median step over the variant's; ``break_even_steps`` is how many
    steps the saving per step takes to pay the compile time back (``None`` if it never does).
    ``peak_bytes`` is the peak CUDA memory the variant adds over its first steps: its copy of
    the model, its optimizer state, its activations and, with CUDA graphs, their memory pool
    (``None`` on a CPU).

    Example:
        >>> from trainopt.perf.compilation import measure_compile
        >>> results = measure_compile(batch_size=2, seq_len=8, backend="eager", steps=1, windows=1,
        ...                           warmup_steps=1, max_warmup_steps=2)
        >>> results["kind"], [row["mode"] for row in results["rows"]]
        ('compile', ['eager', 'default'])
        >>> results["rows"][1]["graphs"], results["rows"][1]["graph_breaks"]
        (1, 0)
    """
    device = torch.device(device)
    config = gpt_config(size)
    seq_len = seq_len or config.block_size
    torch.manual_seed(0)
    base = GPT(config).to(device)
    x, y = synthetic_batch(
        config,
        batch_size=batch_size,
        seq_len=seq_len,
        device=device,
        generator=torch.Generator().manual_seed(0),
    )
    precision = Precision.from_name("bf16" if device.type == "cuda" else "fp32", device)
    report = graph_breaks(copy.deepcopy(base), x, targets=y)
    results = new_results(
        "compile",
        device,
        command=command,
        note=note,
        size=size,
        batch_size=batch_size,
        seq_len=seq_len,
        backend=backend,
        steps_per_window=steps,
        windows=windows,
    )
    rows: list[dict[str, Any]] = []
    steps_by_mode: dict[str, Callable[[], None]] = {}
    torch._dynamo.reset()
    for mode in ("eager", *modes):
        held = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        model = copy.deepcopy(base)
        if mode != "eager":
            model = torch.compile(
                model, backend=backend, **({"mode": mode} if backend == "inductor" else {})
            )
        step = steps_by_mode[mode] = _train_step(model, precision, x, y)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        first = _timed_first_step(step, device)
        warm_up(step, device, min_steps=warmup_steps, window=steps, max_steps=max_warmup_steps)
        rows.append(
            {
                "mode": mode,
                "compile_s": None if mode == "eager" else first,
                "graphs": 0 if mode == "eager" else report.graphs,
                "graph_breaks": 0 if mode == "eager" else report.graph_breaks,
                "peak_bytes": torch.cuda.max_memory_allocated(device) - held
                if device.type == "cuda"
                else None,
            }
        )
    # interleaved windows: a change in the machine's load hits every variant alike
    times = interleaved_windows(steps_by_mode, device, steps, windows)
    for row in rows:
        row["step_s"] = spread(times[row["mode"]])
    eager = rows[0]["step_s"]["median"]
    for row in rows:
        row["speedup"] = eager / row["step_s"]["median"]
        saved = eager - row["step_s"]["median"]
        row["break_even_steps"] = (
            row["compile_s"] / saved if row["compile_s"] is not None and saved > 0 else None
        )
    torch._dynamo.reset()
    results["rows"] = rows
    return results
