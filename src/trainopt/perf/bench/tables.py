"""Tables for the performance pages, rendered at build time from the experiments' JSON.

Every function takes the path of a file written by :mod:`trainopt.perf.bench.experiments` and
returns MyST Markdown. While the file is missing, each says so instead of showing numbers:
the pages never carry a number that the project's code did not measure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

COMMAND = "python -m trainopt.perf.bench.experiments --out docs/_data/perf_h100.json --size 124m"


def _load(path: str | Path) -> dict[str, Any] | None:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else None


def _missing(path: str | Path) -> str:
    return (f"*Not yet measured on a GPU: `{Path(path).name}` is missing. "
            f"Run `{COMMAND}` on a CUDA machine to produce it.*")


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value / 2**30:.2f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.0%}"


def _cpu_note(data: dict[str, Any]) -> str:
    if data["environment"]["device_type"] == "cuda":
        return ""
    return ("*These numbers come from a CPU run, not a GPU: memory is not measured and "
            "CPU timings say nothing about a GPU.*\n\n")


def render_environment(path: str | Path) -> str:
    """One paragraph: device, software versions, date, model, batch and command.

    Example:
        >>> from trainopt.perf.bench.tables import render_environment
        >>> render_environment("no-such-file.json").startswith("*Not yet measured on a GPU")
        True
    """
    data = _load(path)
    if data is None:
        return _missing(path)
    env, model, settings = data["environment"], data["model"], data["settings"]
    memory = f" ({_gib(env['device_memory_bytes'])} GiB)" if env.get("device_memory_bytes") else ""
    cuda = f", CUDA {env['cuda']}" if env.get("cuda") else ""
    return (
        f"{_cpu_note(data)}Measured on **{env['device']}**{memory} with torch {env['torch']}{cuda}, "
        f"Python {env['python']}, on {env['date'][:10]}. Model: the reference GPT `{model['size']}` "
        f"({model['parameters'] / 1e6:.1f}M parameters, {model['n_layer']} layers, width "
        f"{model['n_embd']}), batch {model['batch_size']} × {model['seq_len']} tokens, "
        f"{settings['optimizer']}; {settings['statistic']} ({settings['steps']} steps after "
        f"{settings['warmup']} warm-up). Command: `{data.get('command', COMMAND)}`."
    )


def render_precision_table(path: str | Path) -> str:
    """Step time, tokens/s, MFU and peak memory per precision, with the speed-up over fp32.

    Example:
        >>> from trainopt.perf.bench.tables import render_precision_table
        >>> render_precision_table("missing.json")  # no GPU run yet: no numbers
        '*Not yet measured on a GPU: `missing.json` is missing. Run `python -m ...` on a CUDA machine to produce it.*'
    """
    data = _load(path)
    if data is None:
        return _missing(path)
    rows = data["precision"]
    fp32 = next((r for r in rows if r["precision"] == "fp32" and r["supported"] and "error" not in r), None)
    lines = ["| precision | step time (ms) | p10–p90 (ms) | tokens/s | speed-up vs fp32 | MFU | peak memory (GiB) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if not r["supported"]:
            lines.append(f"| {r['precision']} | not supported here | | | | | |")
            continue
        if "error" in r:
            lines.append(f"| {r['precision']} | failed: {r['error']} | | | | | |")
            continue
        speedup = f"{fp32['step_time_median_ms'] / r['step_time_median_ms']:.2f}×" if fp32 else "—"
        mfu = "—" if r["mfu"] is None else f"{r['mfu']:.1%}"
        lines.append(
            f"| {r['precision']} | {r['step_time_median_ms']:.1f} | {r['step_time_p10_ms']:.1f}–"
            f"{r['step_time_p90_ms']:.1f} | {r['tokens_per_s']:,.0f} | {speedup} | {mfu} | "
            f"{_gib(r['peak_memory_bytes'])} |")
    return _cpu_note(data) + "\n".join(lines)


def render_checkpointing_table(path: str | Path) -> str:
    """Peak memory and step time per checkpointing policy, relative to none.

    Example:
        >>> from trainopt.perf.bench.tables import render_checkpointing_table
        >>> render_checkpointing_table("docs/_data/no-such-run.json").startswith(
        ...     "*Not yet measured on a GPU: `no-such-run.json` is missing.")
        True
    """
    data = _load(path)
    return _missing(path) if data is None else render_checkpointing_table_from(data)


def render_checkpointing_table_from(data: dict[str, Any]) -> str:
    """:func:`render_checkpointing_table` from the loaded results.

    Example:
        >>> from trainopt.perf.bench.tables import render_checkpointing_table_from
        >>> data = {"environment": {"device_type": "cuda"}, "checkpointing": {"precision": "bf16", "rows": [
        ...     {"policy": "every block", "checkpointed_layers": 12, "step_time_median_ms": 115.0,
        ...      "time_change": 0.15, "peak_memory_bytes": 4 * 2**30, "memory_change": -0.5,
        ...      "meets_goal": True},
        ...     {"policy": "selective", "error": "OutOfMemoryError"}]}}
        >>> for line in render_checkpointing_table_from(data).splitlines()[-2:]:
        ...     print(line)
        | every block | 12 | 115.0 | +15% | 4.00 | -50% | yes |
        | selective | failed: OutOfMemoryError | | | | | |
    """
    section = data["checkpointing"]
    lines = [f"Precision: {section['precision']}. Goal: at least 30% lower peak memory for at most 20% more step time.",
             "",
             "| policy | blocks checkpointed | step time (ms) | time | peak memory (GiB) | memory | meets goal |",
             "| --- | ---: | ---: | ---: | ---: | ---: | :---: |"]
    for r in section["rows"]:
        if "error" in r:
            lines.append(f"| {r['policy']} | failed: {r['error']} | | | | | |")
            continue
        goal = {True: "yes", False: "no", None: "—"}[r["meets_goal"]]
        lines.append(
            f"| {r['policy']} | {r['checkpointed_layers']} | {r['step_time_median_ms']:.1f} | "
            f"{_pct(r['time_change'])} | {_gib(r['peak_memory_bytes'])} | {_pct(r['memory_change'])} | {goal} |")
    return _cpu_note(data) + "\n".join(lines)


def render_checkpointing_recommendation(path: str | Path) -> str:
    """Which checkpointing policy met the goal (≥30% less peak memory, ≤20% more time), if any.

    Example:
        >>> import json
        >>> from pathlib import Path
        >>> from trainopt.perf.bench.tables import render_checkpointing_recommendation
        >>> import tempfile
        >>> row = {"checkpointed_layers": 12, "step_time_median_ms": 100.0, "peak_memory_bytes": 2**30}
        >>> rows = [row | {"policy": "none", "time_change": 0.0, "memory_change": 0.0, "meets_goal": False},
        ...         row | {"policy": "every block", "time_change": 0.25, "memory_change": -0.6, "meets_goal": False},
        ...         row | {"policy": "selective", "time_change": 0.1, "memory_change": -0.4, "meets_goal": True}]
        >>> data = {"environment": {"device_type": "cuda"}, "checkpointing": {"precision": "bf16", "rows": rows}}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = Path(tmp, "perf.json").write_text(json.dumps(data))
        ...     print(render_checkpointing_recommendation(Path(tmp, "perf.json")))
        Recommended on this setup: **selective** (-40% peak memory, +10% step time), the cheapest policy that meets the goal.
    """
    data = _load(path)
    if data is None:
        return _missing(path)
    rows = [r for r in data["checkpointing"]["rows"]
            if r["policy"] != "none" and "error" not in r and r.get("memory_change") is not None]
    if not rows:
        return _cpu_note(data) + "*No measured peak memory in this run, so no recommendation.*"

    def describe(r: dict[str, Any]) -> str:
        return f"**{r['policy']}** ({_pct(r['memory_change'])} peak memory, {_pct(r['time_change'])} step time)"

    meeting = [r for r in rows if r["meets_goal"]]
    if meeting:
        best = min(meeting, key=lambda r: r["time_change"])
        return _cpu_note(data) + f"Recommended on this setup: {describe(best)}, the cheapest policy that meets the goal."
    most = min(rows, key=lambda r: r["memory_change"])
    cheapest = min(rows, key=lambda r: r["time_change"])
    return _cpu_note(data) + (f"No policy met the goal on this setup. The largest saving came from {describe(most)}; "
            f"the cheapest policy was {describe(cheapest)}.")


def estimate_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """``(configuration, estimate, measured, error)`` for every row with an estimate.

    ``error`` is ``estimate / measured - 1``, or ``None`` where no peak was measured (a CPU).

    Example:
        >>> from trainopt.perf.bench.tables import estimate_rows
        >>> data = {"precision": [
        ...     {"precision": "fp32", "supported": True, "estimate_bytes": 150, "peak_memory_bytes": 100},
        ...     {"precision": "fp16", "supported": False}],
        ...     "checkpointing": {"precision": "fp32", "rows": [
        ...         {"policy": "none"},
        ...         {"policy": "every block", "estimate_bytes": 60, "peak_memory_bytes": None}]}}
        >>> [(r["configuration"], r["error"]) for r in estimate_rows(data)]
        [('fp32, no checkpointing', 0.5), ('fp32, every block', None)]
    """
    rows = []
    candidates = [(f"{r['precision']}, no checkpointing", r) for r in data["precision"]
                  if r["supported"] and "error" not in r]
    candidates += [(f"{data['checkpointing']['precision']}, {r['policy']}", r)
                   for r in data["checkpointing"]["rows"] if r["policy"] != "none"]
    for label, r in candidates:
        if r.get("estimate_bytes") is None:
            continue
        measured = r.get("peak_memory_bytes")
        error = r["estimate_bytes"] / measured - 1 if measured else None
        rows.append({"configuration": label, "estimate": r["estimate_bytes"], "measured": measured, "error": error})
    return rows


def render_estimate_table(path: str | Path) -> str:
    """The memory estimate beside the measured peak for each configuration (see :func:`estimate_rows`).

    Example:
        >>> from trainopt.perf.bench.tables import render_estimate_table
        >>> "python -m trainopt.perf.bench.experiments" in render_estimate_table("missing.json")
        True
    """
    data = _load(path)
    if data is None:
        return _missing(path)
    lines = ["| configuration | estimate (GiB) | measured peak (GiB) | error |", "| --- | ---: | ---: | ---: |"]
    for r in estimate_rows(data):
        error = "—" if r["error"] is None else f"{r['error']:+.1%}"
        lines.append(f"| {r['configuration']} | {_gib(r['estimate'])} | {_gib(r['measured'])} | {error} |")
    return _cpu_note(data) + "\n".join(lines)


def render_phase_table(path: str | Path) -> str:
    """Allocated, reserved and peak memory after forward, backward and the optimizer step.

    Example:
        >>> import json
        >>> from pathlib import Path
        >>> from trainopt.perf.bench.tables import render_phase_table
        >>> import tempfile
        >>> cpu_run = {"environment": {"device_type": "cpu"}, "phases": {"precision": "fp32", "rows": []}}
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = Path(tmp, "perf.json").write_text(json.dumps(cpu_run))
        ...     print(render_phase_table(Path(tmp, "perf.json")))
        *These numbers come from a CPU run, not a GPU: ...*
        <BLANKLINE>
        *Per-phase memory needs CUDA; this run had none.*
    """
    data = _load(path)
    if data is None:
        return _missing(path)
    rows = data["phases"]["rows"]
    if not rows:
        return _cpu_note(data) + "*Per-phase memory needs CUDA; this run had none.*"
    lines = [f"Precision: {data['phases']['precision']}, second training step.", "",
             "| phase | allocated after (GiB) | reserved (GiB) | peak during (GiB) |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {r['phase']} | {_gib(r['allocated'])} | {_gib(r['reserved'])} | {_gib(r['peak'])} |" for r in rows]
    return _cpu_note(data) + "\n".join(lines)


def render_top_operators(path: str | Path) -> str:
    """The operators with the most self time in a profiled training step.

    Example:
        >>> from trainopt.perf.bench.tables import render_top_operators
        >>> render_top_operators("missing.json").endswith("on a CUDA machine to produce it.*")
        True
    """
    data = _load(path)
    if data is None:
        return _missing(path)
    section = data["top_operators"]
    device = data["environment"]["device_type"] == "cuda"
    column = "self CUDA time (ms)" if device else "self CPU time (ms)"
    lines = [f"Precision: {section['precision']}, two profiled steps.", "",
             f"| operator | calls | {column} |", "| --- | ---: | ---: |"]
    for r in section["rows"]:
        value = r["self_device_us"] if device else r["self_cpu_us"]
        lines.append(f"| `{r['name']}` | {r['calls']} | {value / 1e3:.2f} |")
    return _cpu_note(data) + "\n".join(lines)


def render_device_peaks() -> str:
    """The dense peak FLOP/s table that MFU divides by (:data:`DEVICE_PEAK_FLOPS`).

    Example:
        >>> from trainopt.perf.bench.tables import render_device_peaks
        >>> for line in render_device_peaks().splitlines()[:3]:
        ...     print(line)
        | device | fp32 | tf32 | bf16 | fp16 |
        | --- | ---: | ---: | ---: | ---: |
        | H100 SXM | 66.9 | 494.7 | 989.4 | 989.4 |
    """
    from trainopt.perf.throughput import DEVICE_PEAK_FLOPS

    lines = ["| device | fp32 | tf32 | bf16 | fp16 |", "| --- | ---: | ---: | ---: | ---: |"]
    for device, peaks in DEVICE_PEAK_FLOPS.items():
        cells = " | ".join(f"{peaks[p] / 1e12:,.1f}" for p in ("fp32", "tf32", "bf16", "fp16"))
        lines.append(f"| {device} | {cells} |")
    return "\n".join(lines) + "\n\nDense TFLOP/s from NVIDIA's data sheets (the sparse figures are twice these)."


def render_throughput_table(path: str | Path) -> str:
    """Tokens/s, samples/s and MFU per precision, with the peak each MFU is relative to.

    Example:
        >>> from trainopt.perf.bench.tables import render_throughput_table
        >>> render_throughput_table("perf_h100.json").startswith("*Not yet measured on a GPU")
        True
    """
    data = _load(path)
    if data is None:
        return _missing(path)
    batch = data["model"]["batch_size"]
    tokens = data["model"]["tokens_per_step"]
    lines = [f"FLOPs per token (6·N + 12·L·d·T): {data['model']['flops_per_token'] / 1e9:.3f} GFLOP.", "",
             "| precision | tokens/s | samples/s | device peak (TFLOP/s) | MFU |", "| --- | ---: | ---: | ---: | ---: |"]
    for r in data["precision"]:
        if not r["supported"] or "error" in r:
            continue
        peak = "—" if r["peak_flops"] is None else f"{r['peak_flops'] / 1e12:.1f}"
        mfu = "—" if r["mfu"] is None else f"{r['mfu']:.1%}"
        lines.append(f"| {r['precision']} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] * batch / tokens:,.1f} | {peak} | {mfu} |")
    return _cpu_note(data) + "\n".join(lines)
