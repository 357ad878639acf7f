"""``python -m trainopt.perf.planner``: will a model fit, and which layout to use.

Without ``--layout`` it ranks every layout of the cluster that fits, fastest first; with one,
it prints that layout's memory by part, communication by collective and step time with its
assumptions. A mistake in an argument prints one line, ``error: <argument>: <allowed>``, and
exits with status 2 (:func:`main` shows both forms).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from trainopt.config.cli import ArgumentParser, UsageError, positive_int
from trainopt.perf.bench.arguments import positive_float
from trainopt.perf.bench.mfu import gpu_table
from trainopt.perf.estimate import OPTIMIZER_STATE_BYTES
from trainopt.perf.planner.layout import CHECKPOINTING, PRECISIONS, Cluster, Layout, Training
from trainopt.perf.planner.layouts import Plan, plan, rank_layouts
from trainopt.perf.planner.shape import PRESETS, ModelShape

SHAPE_FIELDS = ("layers", "hidden", "heads", "ffn_hidden", "vocab")
SHAPE_HELP = {
    "layers": "transformer blocks",
    "hidden": "model width",
    "heads": "attention heads",
    "ffn_hidden": "feed-forward width",
    "vocab": "vocabulary size",
}


def parse_layout(text: str) -> Layout:
    """``--layout`` text: ``dp=8,zero=3,tp=8`` (omitted degrees are 1, ZeRO 0).

    Example:
        >>> from trainopt.perf.planner.cli import parse_layout
        >>> parse_layout("dp=8,zero=3,tp=8").name
        'FSDP 8 × TP 8'
    """
    values: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        if key not in ("dp", "zero", "tp", "pp", "cp") or not value.isdigit():
            raise argparse.ArgumentTypeError(
                f"must be comma-separated dp=, zero=, tp=, pp=, cp= with ints, got {text!r}"
            )
        values[key] = int(value)
    try:
        return Layout(**values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def build_parser() -> ArgumentParser:
    """The command's arguments.

    Example:
        >>> from trainopt.perf.planner.cli import build_parser
        >>> args = build_parser().parse_args(["--model", "llama3-8b", "--gpus", "64"])
        >>> args.gpu, args.gpus, args.precision, args.checkpointing
        ('H100 SXM', 64, 'bf16', 'auto')
    """
    gpus = [row["name"] for row in gpu_table()]
    parser = ArgumentParser(
        prog="python -m trainopt.perf.planner",
        description="Memory per GPU, communication and step time of parallel layouts; "
        "the layouts that fit, ranked.",
    )
    model = parser.add_argument_group("model (a named shape, or every shape field)")
    model.add_argument("--model", choices=sorted(PRESETS), help="a named shape")
    for name in SHAPE_FIELDS:
        model.add_argument(f"--{name.replace('_', '-')}", type=positive_int, help=SHAPE_HELP[name])
    model.add_argument("--kv-heads", type=positive_int, help="key-value heads (default: heads)")
    model.add_argument("--gated-mlp", action="store_true", help="SwiGLU feed-forward (Llama)")
    model.add_argument(
        "--tied-embeddings", action="store_true", help="the output layer shares the embedding"
    )
    model.add_argument("--seq-len", type=positive_int, help="tokens per sequence")
    run = parser.add_argument_group("training")
    run.add_argument(
        "--micro-batch", type=positive_int, default=1, help="sequences per GPU per pass (1)"
    )
    run.add_argument("--global-batch", type=positive_int, help="sequences per optimizer step")
    run.add_argument(
        "--precision", choices=list(PRECISIONS), default="bf16", help="compute precision (bf16)"
    )
    run.add_argument(
        "--optimizer",
        choices=sorted(OPTIMIZER_STATE_BYTES),
        default="adamw",
        help="sets the optimizer state's bytes (adamw)",
    )
    run.add_argument(
        "--checkpointing",
        choices=[*CHECKPOINTING, "auto"],
        default="auto",
        help="activation checkpointing; auto tries both",
    )
    cluster = parser.add_argument_group("cluster (a GPU of the table, overridable)")
    cluster.add_argument("--gpu", choices=gpus, default="H100 SXM", help="a row of the table")
    cluster.add_argument("--gpus", type=positive_int, default=8, help="GPUs in all")
    cluster.add_argument("--memory-gb", type=positive_float, help="memory per GPU, in GB")
    cluster.add_argument("--peak-tflops", type=positive_float, help="dense, of --precision")
    cluster.add_argument(
        "--intra-node-gb-per-s", type=positive_float, help="per-GPU bandwidth within a node"
    )
    cluster.add_argument(
        "--inter-node-gb-per-s", type=positive_float, help="per-GPU bandwidth between nodes"
    )
    cluster.add_argument("--gpus-per-node", type=positive_int, help="GPUs sharing a node")
    out = parser.add_argument_group("output")
    out.add_argument("--layout", type=parse_layout, help="one layout: dp=8,zero=3,tp=8")
    out.add_argument("--top", type=positive_int, default=10, help="ranked layouts to print")
    out.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return parser


def _shape(args: argparse.Namespace) -> tuple[str, ModelShape]:
    given = {name: getattr(args, name) for name in SHAPE_FIELDS if getattr(args, name)}
    if args.model is None:
        missing = [f"--{n.replace('_', '-')}" for n in SHAPE_FIELDS if n not in given]
        if missing:
            raise UsageError(
                "--model", f"give a named shape or every shape field ({', '.join(missing)} missing)"
            )
        if args.seq_len is None:
            raise UsageError("--seq-len", "required with a shape given field by field")
        fields = dict(given, seq_len=args.seq_len, kv_heads=args.kv_heads)
        fields.update(gated_mlp=args.gated_mlp, tied_embeddings=args.tied_embeddings)
        try:
            return "model", ModelShape(**fields)
        except ValueError as exc:
            field = str(exc).split(" ")[0].removeprefix("ModelShape.")
            raise UsageError(f"--{field.replace('_', '-')}", str(exc)) from exc
    if given:
        raise UsageError("--model", "give a named shape or the shape fields, not both")
    shape = PRESETS[args.model]
    return args.model, shape.with_seq_len(args.seq_len) if args.seq_len else shape


def _cluster(args: argparse.Namespace) -> Cluster:
    overrides: dict[str, object] = {}
    for name in ("memory_gb", "intra_node_gb_per_s", "inter_node_gb_per_s", "gpus_per_node"):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    cluster = Cluster.of(args.gpu, args.gpus, **overrides)
    peak = PRECISIONS[args.precision].peak
    if args.peak_tflops is not None:
        cluster = Cluster.of(
            args.gpu,
            args.gpus,
            **overrides,
            peak_tflops={**cluster.peak_tflops, peak: args.peak_tflops},
        )
    if peak not in cluster.peak_tflops:
        raise UsageError("--precision", f"{args.gpu} has no {peak} peak; give --peak-tflops")
    return cluster


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def ranking_table(plans: Sequence[Plan], top: int) -> str:
    """The ranked plans as a Markdown table.

    Example:
        >>> from trainopt.perf.planner import Cluster, Training, rank_layouts
        >>> from trainopt.perf.planner.cli import ranking_table
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> plans = rank_layouts(PRESETS["llama3-1b"], Training(), Cluster.of("H100 SXM", 8))
        >>> ranking_table(plans, top=1).splitlines()[2].split(" | ")[:2]
        ['| 1', 'DDP 8']
    """
    lines = [
        "| rank | layout | memory per GPU | step time | MFU |",
        "| ---: | --- | ---: | ---: | ---: |",
    ]
    for i, p in enumerate(plans[:top], 1):
        lines.append(
            f"| {i} | {p.name} | {_gib(p.memory.peak)} | {p.time.seconds:,.2f} s | "
            f"{p.time.mfu:.0%} |"
        )
    return "\n".join(lines)


def plan_report(p: Plan) -> str:
    """One plan: memory by part, communication by collective, step time and assumptions.

    Example:
        >>> from trainopt.perf.planner import Cluster, Layout, Training, plan
        >>> from trainopt.perf.planner.cli import plan_report
        >>> from trainopt.perf.planner.shape import PRESETS
        >>> one = plan(PRESETS["llama3-8b"], Training(checkpointing="full"), Layout(dp=8, zero=3),
        ...            Cluster.of("H100 SXM", 8))
        >>> print(plan_report(one).splitlines()[0])
        layout: FSDP 8 + checkpointing; fits: yes
    """
    lines = [f"layout: {p.name}; fits: {'yes' if p.fits else 'no'}", ""]
    lines += ["| memory per GPU | at the " + p.memory.peak_phase + " |", "| --- | ---: |"]
    lines += [f"| {k.replace('_', ' ')} | {_gib(v)} |" for k, v in p.memory.parts.items()]
    lines += [f"| **peak** | **{_gib(p.memory.peak)}** |", ""]
    lines += [
        "| collective | group | moves | per GPU per step | overlapped |",
        "| --- | --- | --- | ---: | --- |",
    ]
    lines += [
        f"| {c.name} | {c.dimension} {c.group} | {c.purpose} | {c.bytes_per_gpu / 1e9:,.2f} GB | "
        f"{'yes' if c.overlapped else 'no'} |"
        for c in p.communication
    ]
    t = p.time
    lines += [
        "",
        f"step time {t.seconds:,.3f} s = compute {t.compute:,.3f} s + exposed communication "
        f"{t.exposed_communication:,.3f} s + pipeline bubble {t.bubble:,.3f} s; "
        f"{t.tokens_per_second_per_gpu:,.0f} tokens/s per GPU, MFU {t.mfu:.1%}",
        "assumptions: " + "; ".join(f"{k} {v}" for k, v in t.assumptions.items()),
    ]
    return "\n".join(lines)


def _as_json(p: Plan) -> dict[str, object]:
    return {
        "layout": p.name,
        "fits": p.fits,
        "memory": {**p.memory.parts, "peak": p.memory.peak, "peak_phase": p.memory.peak_phase},
        "communication": [vars(c) for c in p.communication],
        "step_time": {k: v for k, v in vars(p.time).items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit status (:func:`~trainopt.config.cli.run_command` turns
    a mistake into one line and status 2).

    Example:
        >>> from trainopt.perf.planner.cli import main
        >>> main(["--model", "llama3-8b", "--gpu", "H100 SXM", "--gpus", "64",
        ...       "--global-batch", "512", "--top", "1"])  # doctest: +ELLIPSIS
        llama3-8b (8.03B parameters), seq 8192, bf16, adamw, on 64 × H100 SXM (80 GB)
        | rank | layout | memory per GPU | step time | MFU |
        | ---: | --- | ---: | ---: | ---: |
        | 1 | ... |
        0
        >>> main(["--model", "llama3-1b", "--gpus", "1", "--top", "1"])  # doctest: +ELLIPSIS
        llama3-1b (1.24B parameters), seq 8192, bf16, adamw, on 1 × H100 SXM (80 GB)
        ...
        0
    """
    args = build_parser().parse_args(argv)
    name, shape = _shape(args)
    cluster = _cluster(args)
    training = Training(
        micro_batch=args.micro_batch,
        global_batch=args.global_batch,
        precision=args.precision,
        optimizer=args.optimizer,
        checkpointing="none" if args.checkpointing == "auto" else args.checkpointing,
    )
    if args.layout is not None:
        if args.layout.gpus > cluster.gpus:
            raise UsageError("--layout", f"uses {args.layout.gpus} GPUs; --gpus is {cluster.gpus}")
        one = plan(shape, training, args.layout, cluster)
        print(json.dumps(_as_json(one), indent=1) if args.json else plan_report(one))
        return 0
    choices = CHECKPOINTING if args.checkpointing == "auto" else (args.checkpointing,)
    plans = rank_layouts(shape, training, cluster, checkpointing=choices)
    if args.json:
        print(json.dumps([_as_json(p) for p in plans[: args.top]], indent=1))
        return 0
    print(
        f"{name} ({shape.parameters() / 1e9:.2f}B parameters), seq {shape.seq_len}, "
        f"{args.precision}, {args.optimizer}, on {cluster.gpus} × {cluster.name} "
        f"({cluster.memory_gb:g} GB)"
    )
    print(ranking_table(plans, args.top) if plans else "no layout fits")
    return 0
