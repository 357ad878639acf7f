"""The tables the layout planner's page and the performance pages render at build time.

- :func:`gpu_table_markdown`: the GPU table (``trainopt/perf/bench/gpus.json``) with sources.
- :func:`published_comparison` and :func:`published_table`: the planner against published runs
  (``docs/_data/published_runs.json``), each with its error.
- :func:`decision_table` and the three folds for the memory, distributed and mixed-precision
  pages: what fits for 1B to 405B parameters on 1 to 1,024 GPUs, which layout, which
  precision, and where checkpointing pays, each cell computed by the planner.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from trainopt.perf.bench.mfu import gpu_table
from trainopt.perf.planner import Cluster, Layout, ModelShape, Plan, Training, plan, rank_layouts
from trainopt.perf.planner.shape import PRESETS

DATA = Path(__file__).resolve().parents[4] / "_data" / "published_runs.json"

TOLERANCE = {"memory": 0.10, "time": 0.25}
"""How close the planner must come to a published run (the issue's bounds): memory within
10 %, step time, throughput or MFU within 25 %."""


def gpu_table_markdown() -> str:
    """The GPU table as Markdown: peaks, memory, scale-up link, with each row's source.

    Example:
        >>> from trainopt_site.perf.planner.tables import gpu_table_markdown
        >>> gpu_table_markdown().splitlines()[0].split(" | ")[:3]
        ['| GPU', 'bf16 TFLOP/s', 'fp8 TFLOP/s']
    """
    lines = [
        "| GPU | bf16 TFLOP/s | fp8 TFLOP/s | memory | scale-up link (per GPU) | GPUs per node "
        "| source |",
        "| --- | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for row in gpu_table():
        fp8 = row["peak_tflops"].get("fp8")
        lines.append(
            f"| {row['name']} | {row['peak_tflops']['bf16']:,.1f} | "
            f"{'—' if fp8 is None else f'{fp8:,.1f}'} | {row['memory_gb']} GB | "
            f"{row['scale_up']} | {row['gpus_per_node']} | [{row['vendor']}]({row['source']}) |"
        )
    return (
        "\n".join(lines) + "\n\nDense peaks (the vendors' figures with sparsity are twice these).\n"
    )


def _run_inputs(run: dict[str, Any]) -> tuple[ModelShape, Training, Layout, Cluster]:
    if "preset" in run:
        shape = PRESETS[run["preset"]]
        if "seq_len" in run:
            shape = shape.with_seq_len(run["seq_len"])
    else:
        shape = ModelShape(**run["shape"])
    cluster_args = dict(run["cluster"])
    cluster = Cluster.of(cluster_args.pop("gpu"), cluster_args.pop("gpus"), **cluster_args)
    return shape, Training(**run["training"]), Layout(**run["layout"]), cluster


def _predicted(metric: str, p: Plan, shape: ModelShape) -> float:
    t = p.time
    if metric == "tflops_per_gpu_with_recompute":
        return t.tokens_per_second_per_gpu * shape.flops_per_token() * 8 / 6 / 1e12
    if metric == "mfu":
        return t.mfu
    if metric == "tokens_per_second_per_gpu":
        return t.tokens_per_second_per_gpu
    if metric == "memory_gib":
        return p.memory.peak / 2**30
    if metric == "model_states_gb":
        return p.memory.model_states / 1e9
    raise ValueError(f"unknown metric {metric!r}")


@functools.cache
def _load(path: str) -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(Path(path).read_text())["runs"])


def published_comparison(path: str | Path = DATA) -> list[dict[str, Any]]:
    """One row per published value: the run, the metric, the reference, the planner's value,
    the relative error, the tolerance, and the source's explanation of a gap.

    Example:
        >>> from trainopt_site.perf.planner.tables import published_comparison
        >>> rows = published_comparison()
        >>> len({row["id"] for row in rows}) >= 4
        True
    """
    rows = []
    for run in _load(str(path)):
        shape, training, layout, cluster = _run_inputs(run)
        p = plan(shape, training, layout, cluster)
        for metric, reference in run["reference"].items():
            predicted = _predicted(metric, p, shape)
            kind = "memory" if metric in ("memory_gib", "model_states_gb") else "time"
            rows.append(
                {
                    "id": run["id"],
                    "source": run["source"],
                    "url": run["url"],
                    "layout": p.name,
                    "metric": metric,
                    "reference": reference,
                    "predicted": predicted,
                    "error": predicted / reference - 1,
                    "tolerance": TOLERANCE[kind],
                    "why": run.get("why", ""),
                }
            )
    return rows


METRIC_NAMES = {
    "tflops_per_gpu_with_recompute": "TFLOP/s per GPU (recompute counted)",
    "mfu": "MFU",
    "tokens_per_second_per_gpu": "tokens/s per GPU",
    "memory_gib": "peak memory per GPU (GiB)",
    "model_states_gb": "model states per GPU (GB)",
}


def _value(metric: str, value: float) -> str:
    if metric == "mfu":
        return f"{value:.0%}"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def published_table(data: str | Path = DATA) -> str:
    """The comparison with published runs as Markdown, with each source linked."""
    lines = [
        "| run | layout | measure | published | planner | error |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    notes = []
    for row in published_comparison(data):
        within = abs(row["error"]) <= row["tolerance"]
        mark = "" if within else " ⚠"
        lines.append(
            f"| [{row['id']}]({row['url']}) | {row['layout']} | {METRIC_NAMES[row['metric']]} | "
            f"{_value(row['metric'], row['reference'])} | "
            f"{_value(row['metric'], row['predicted'])} | {row['error']:+.0%}{mark} |"
        )
        if not within and row["why"] and row["why"] not in notes:
            notes.append(row["why"])
    out = "\n".join(lines) + "\n"
    if notes:
        out += "\n⚠ outside the bound (memory 10 %, time 25 %): " + " ".join(notes) + "\n"
    return out


MODELS = {"1B": "llama3-1b", "8B": "llama3-8b", "70B": "llama3-70b", "405B": "llama3-405b"}
GPU_COUNTS = (1, 8, 64, 1024)
SEQ_LEN = 4096
GLOBAL_BATCH = 1024  # sequences of 4,096 tokens: 4M tokens per step


@functools.cache
def _best(model: str, gpus: int, gpu: str, precision: str) -> Plan | None:
    shape = PRESETS[MODELS[model]].with_seq_len(SEQ_LEN)
    training = Training(micro_batch=1, global_batch=GLOBAL_BATCH, precision=precision)
    plans = rank_layouts(shape, training, Cluster.of(gpu, gpus))
    return plans[0] if plans else None


def _sharded_only(model: str, gpus: int, gpu: str, checkpointing: str) -> Plan:
    """The simplest layout: one GPU, or FSDP over all of them."""
    shape = PRESETS[MODELS[model]].with_seq_len(SEQ_LEN)
    training = Training(micro_batch=1, global_batch=GLOBAL_BATCH, checkpointing=checkpointing)
    layout = Layout() if gpus == 1 else Layout(dp=gpus, zero=3)
    return plan(shape, training, layout, Cluster.of(gpu, gpus))


def _memory_cell(model: str, gpus: int, gpu: str) -> str:
    plain, recompute = (_sharded_only(model, gpus, gpu, c) for c in ("none", "full"))
    simplest = plain.layout.name
    if plain.fits:
        return f"{simplest}: {plain.memory.peak / 2**30:,.0f} GiB"
    if recompute.fits:
        return (
            f"{simplest} with checkpointing: {recompute.memory.peak / 2**30:,.0f} GiB "
            f"(without: {plain.memory.peak / 2**30:,.0f})"
        )
    best = _best(model, gpus, gpu, "bf16")
    if best is None:
        states = recompute.memory.model_states / 2**30
        return f"does not fit ({simplest} needs {states:,.0f} GiB of states)"
    return f"needs {best.name}: {best.memory.peak / 2**30:,.0f} GiB"


def decision_table(focus: str = "layout", gpu: str = "H100 SXM") -> str:
    """What fits, which layout, which precision, for 1B-405B on 1-1,024 GPUs.

    ``focus`` picks what each cell says: ``"layout"`` (the fastest layout that fits and its
    MFU), ``"memory"`` (whether the simplest layout, FSDP over every GPU, fits, with or
    without checkpointing) or ``"precision"`` (the bf16 plan, and the most fp8 matmuls could
    gain).

    Example:
        >>> from trainopt_site.perf.planner.tables import decision_table
        >>> print(decision_table("layout").splitlines()[0])
        | model | 1 GPU | 8 GPUs | 64 GPUs | 1,024 GPUs |
    """
    if focus not in ("layout", "memory", "precision"):
        raise ValueError(f"focus must be 'layout', 'memory' or 'precision', got {focus!r}")
    header = "| model | " + " | ".join(f"{n:,} GPU{'s' if n > 1 else ''}" for n in GPU_COUNTS)
    lines = [header + " |", "| --- |" + " --- |" * len(GPU_COUNTS)]
    for model in MODELS:
        cells = []
        for gpus in GPU_COUNTS:
            best = _best(model, gpus, gpu, "bf16")
            if focus == "memory":
                cells.append(_memory_cell(model, gpus, gpu))
            elif best is None:
                cells.append("does not fit")
            elif focus == "layout":
                cells.append(f"{best.name}, MFU {best.time.mfu:.0%}")
            else:
                fp8 = _best(model, gpus, gpu, "fp8")
                gain = best.time.seconds / fp8.time.seconds if fp8 else 1.0
                cells.append(f"bf16, MFU {best.time.mfu:.0%}; fp8 at most {gain:.1f}× faster")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


FOLD = """:::{{dropdown}} Decisions by scale: {title}
:icon: table

{intro}

{table}
Computed by the layout planner when this page was built
([Layout planner](../scale/layout-planner.md#will-it-fit-and-which-layout)): Llama 3 shapes
at {seq:,} tokens per sequence, {batch:,} sequences per step, micro-batch 1, AdamW, on H100 SXM
GPUs (80 GB, 90 % of it usable), with the planner's stated assumptions.
:::
"""


def _fold(title: str, intro: str, focus: str) -> str:
    table = decision_table(focus)
    return FOLD.format(title=title, intro=intro, table=table, seq=SEQ_LEN, batch=GLOBAL_BATCH)


def memory_fold() -> str:
    """The memory page's fold: peak memory per GPU and whether checkpointing is needed."""
    return _fold(
        "what fits, and where checkpointing pays",
        "Whether the simplest layout (one GPU, or FSDP over all of them) fits, with full "
        "activation checkpointing where only that makes it fit, and what else is needed where "
        "neither does.",
        "memory",
    )


def distributed_fold() -> str:
    """The distributed page's fold: the layout for each model and cluster size."""
    return _fold(
        "which layout",
        "The fastest layout that fits (the simplest among equally fast ones), with its "
        "predicted MFU.",
        "layout",
    )


def precision_fold() -> str:
    """The mixed-precision page's fold: what fp8 matmuls would gain over bf16."""
    return _fold(
        "which precision",
        "The fastest bf16 layout that fits, with its predicted MFU. "
        "bf16 mixed precision is the planner's default (16 bytes of state per parameter, "
        "2-byte activations); fp8 matmuls keep bf16's state and double the peak, so the "
        "planner's fp8 gain is an upper bound: torchtitan measured 1.28× for Llama 3.1 8B on "
        "8 H100s (its table 1).",
        "precision",
    )
