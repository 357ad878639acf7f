"""Tables of every benchmark results file, as MyST Markdown: the one renderer of the pages.

:func:`render` reads a results file (:func:`trainopt.perf.bench.results.read_results`) and
renders the parts a page asks for. It formats numbers that are in the file and computes none:
speed-ups, ratios and errors are stored by the benchmark that measured them, so a page can't
show a number that wasn't measured. Every table ends with its label: hardware, software, date
and commit. A missing file renders as one line naming the command that writes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainopt.perf.bench.mfu import PEAK_TFLOPS
from trainopt.perf.bench.results import Results, hardware, label, read_results


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _rate(value: float) -> str:
    return f"{value:,.0f}"


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"


def _change(fraction: float) -> str:
    return f"{fraction * 100:+.0f}%"


def _error(fraction: float) -> str:
    return f"{fraction * 100:+.2f}%"


def _ratio(value: float) -> str:
    return f"{value:.2f}"


def _ratio3(value: float) -> str:
    return f"{value:.3f}"


def _reads(value: float) -> str:
    return f"{value:g}"


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.1f}"


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f}"


NUMBER_FORMATS: tuple[Callable[[Any], str], ...] = (
    _reads,
    _ms,
    _rate,
    _percent,
    _change,
    _error,
    _ratio,
    _ratio3,
    _mib,
    _gib,
    str,
    lambda v: f"{v:.1f}",
    lambda v: f"{v:.2f}",
)
"""Every way the renderer prints a number (a test checks that every printed number is one of
these)."""


def _memory_unit(values: Sequence[float | None]) -> tuple[str, Callable[[float], str]]:
    known = [v for v in values if v is not None]
    return ("GiB", _gib) if known and max(known) >= 2**30 else ("MiB", _mib)


def _cell(value: float | None, fmt: Callable[[float], str]) -> str:
    return "—" if value is None else fmt(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "---:") -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "| --- | " + " | ".join([align] * (len(header) - 1)) + " |",
    ]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _clean(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "/")[:160]


# -- the benchmark suite (python -m trainopt.perf.bench matrix | recipe | all) ------------------


def _bench_results(results: Results) -> list[str]:
    records = results["results"]
    ok = [r for r in records if r["status"] == "ok"]
    with_mfu = any(r.get("mfu") is not None for r in ok)
    unit, mem = _memory_unit([r.get("peak_memory_bytes") for r in ok])
    header = [
        "configuration",
        "step time (ms), median [min–max]",
        "tokens/s",
        *(["MFU"] if with_mfu else []),
        f"peak memory ({unit})",
        "warm-up: steps (s)",
    ]
    rows = []
    for r in records:
        if r["status"] != "ok":
            rows.append(
                [
                    r["name"],
                    f"{r['status']}: {_clean(r.get('error', ''))}",
                    *[""] * (len(header) - 2),
                ]
            )
            continue
        t, w = r["step_time_s"], r["warmup"]
        stable = "" if w["stable"] else ", not stable"
        rows.append(
            [
                r["name"],
                f"{_ms(t['median'])} [{_ms(t['min'])}–{_ms(t['max'])}]",
                _rate(r["tokens_per_s"]),
                *([_cell(r.get("mfu"), _percent)] if with_mfu else []),
                _cell(r.get("peak_memory_bytes"), mem),
                f"{w['steps']} ({w['seconds']:.1f}{stable})",
            ]
        )
    settings = results["meta"]["settings"]
    lines = _table(header, rows)
    lines += [
        "",
        f"Median over {settings['windows']} windows of {settings['steps_per_window']} steps, "
        "after a "
        f"warm-up of at least {settings['warmup_steps']} steps that ran until two windows agreed "
        "within 10%.",
    ]
    if not with_mfu:
        lines.append("MFU needs a device peak; a CPU has none, so it is not shown.")
    return lines


def _bench_recipe(results: Results) -> list[str]:
    recipe = results.get("recipe")
    if not recipe:
        return ["*No recipe comparison in these results.*"]
    by_name = {r["name"]: r for r in results["results"]}
    base, cand = by_name[recipe["baseline"]], by_name[recipe["candidate"]]
    if recipe.get("speedup") is None:
        return [
            f"*The recipe comparison did not complete: {base['name']} is {base['status']}, "
            f"{cand['name']} is {cand['status']}.*"
        ]
    ratio = recipe["speedup"]
    verdict = "faster" if ratio >= 1 else "slower: the recipe does not pay off here"
    return [
        f"**Speed-up {_ratio(ratio)}×** ({verdict}): {cand['name']} trains "
        f"{_rate(cand['tokens_per_s'])} "
        f"tokens/s ({_ms(cand['step_time_s']['median'])} ms per step) where {base['name']} trains "
        f"{_rate(base['tokens_per_s'])} tokens/s "
        f"({_ms(base['step_time_s']['median'])} ms per step)."
    ]


def _bench_goal(results: Results) -> list[str]:
    goal = results["goal"]
    candidates = [
        r for r in results["results"] if r["status"] == "ok" and r["config"]["size"] == goal["size"]
    ]
    if results["meta"]["device"] != "cuda":
        return [
            "MFU against a tensor-core peak is a GPU measure: the goal "
            f"({_percent(goal['mfu'])} for the "
            f"{goal['size']} model) is checked on a GPU run only."
        ]
    if not candidates:
        return [f"*No configuration of the {goal['size']} model was measured in these results.*"]
    best = max(candidates, key=lambda r: r["tokens_per_s"])
    verdict = "meets" if best["mfu"] >= goal["mfu"] else "misses"
    return [
        f"The fastest {goal['size']} configuration, {best['name']}, reaches "
        f"**{_percent(best['mfu'])} MFU** "
        f"({_rate(best['tokens_per_s'])} tokens/s): it **{verdict}** the goal of "
        f"{_percent(goal['mfu'])}."
    ]


def _bench_profile(results: Results) -> list[str]:
    profiled = [r for r in results["results"] if r["status"] == "ok" and "profile" in r]
    candidates = [r for r in profiled if r["config"]["size"] == results["goal"]["size"]] or profiled
    if not candidates:
        return ["*No profile in these results.*"]
    best = max(candidates, key=lambda r: r["tokens_per_s"])
    prof = best["profile"]
    busy = (
        "kernel time"
        if results["meta"]["device"] == "cuda"
        else "operators' self time (the profiler slows a CPU)"
    )
    lines = [
        f"Profile of {best['name']} over {prof['steps']} steps: {busy} adds up to "
        f"{_ms(prof['busy_s_per_step'])} ms per step; the timed step took "
        f"{_ms(best['step_time_s']['median'])} ms.",
        "",
    ]
    lines += _table(
        ["category", "ms per step", "share of busy time"],
        [
            [name, _ms(c["s_per_step"]), _percent(c["share"])]
            for name, c in prof["categories"].items()
        ],
    )
    lines.append("")
    lines += _table(
        ["top kernel or operator", "ms per step"],
        [[f"`{_clean(r['name']).replace('`', '')}`", _ms(r["s_per_step"])] for r in prof["top"]],
    )
    return lines


# -- the stability stack's overhead (python -m trainopt.perf.bench stability) -------------------


def _stability_overhead(results: Results) -> list[str]:
    if "forms" not in results:  # written before the benchmark timed each optimizer form
        return [
            "*These results predate the per-optimizer-form benchmark: run "
            "`python -m trainopt.perf.bench stability` again to fill in this table.*"
        ]
    cfg, sync, goal = results["config"], results["sync_check"], results["goal_ratio"]
    rows, meeting, missing = [], [], []
    for f in results["forms"]:
        if f["status"] != "ok":
            rows.append([f["form"], f"{f['status']}: {_clean(f.get('error', ''))}", "", "", "", ""])
            continue
        ms, r, reads = f["ms_per_step"], f["ratio"], f["host_reads"]
        (meeting if r["ratio"] <= goal else missing).append(f["form"])
        rows.append(
            [
                f"{f['form']}: `{f['optimizer']}`",
                f"{ms['bare']:.2f}",
                f"{ms['stabilized']:.2f}",
                f"{_ratio3(r['ratio'])} [{_ratio3(r['low'])}–{_ratio3(r['high'])}]",
                f"{_ratio3(r['min'])}–{_ratio3(r['max'])}",
                f"{_reads(reads['bare']['per_step'])} / {_reads(reads['stabilized']['per_step'])}",
            ]
        )
    header = [
        "optimizer form",
        "bare (ms/step)",
        "stabilized (ms/step)",
        "ratio, median [95% interval]",
        "paired window ratios, min–max",
        "host reads per step, bare / stabilized",
    ]
    level = next((f["ratio"]["confidence"] for f in results["forms"] if f["status"] == "ok"), 0.95)
    verdict = "; ".join(
        [f"**meets** the goal of at most {_ratio3(goal)} in {', '.join(meeting)}"] * bool(meeting)
        + [
            f"**misses** {'it' if meeting else f'the goal of at most {_ratio3(goal)}'} in "
            f"{', '.join(missing)}"
        ]
        * bool(missing)
    )
    more = sync["more_reads_than_bare"]
    return (
        _table(header, rows)
        + [
            "",
            f"{cfg['model']} ({cfg['parameters'] / 1e6:.1f}M parameters), "
            f"batch {cfg['batch_size']} × "
            f"{cfg['seq_len']}, {cfg['dtype']}, {'compiled' if cfg['compile'] else 'eager'}, "
            f"{cfg['threads']} thread{'s' * (cfg['threads'] != 1)}; a {cfg['schedule']} on every "
            "optimizer. Bare and stabilized "
            f"alternate in {cfg['windows']} windows each of {cfg['steps_per_window']} steps "
            "(AB BA …); "
            "the ratio is the median of the paired window ratios, "
            f"with a {_percent(level)} bootstrap "
            f"interval; stabilizer boundary every {cfg['check_every']} steps. Stabilized over bare "
            f"{verdict}.",
            f"Host reads counted over {sync['steps']} steady-state steps of each "
            f"({sync['method']}): "
            + (
                "the stabilized step reads the host no more often than the bare one in every form"
                if not more
                else f"**more than bare** in {', '.join(more)}"
            )
            + (f"; failed: {_clean('; '.join(sync['errors']))}" if sync.get("errors") else "")
            + ".",
        ]
        + ([f"Command: `{results['meta']['command']}`."] if results["meta"].get("command") else [])
    )


# -- the performance experiments (python -m trainopt.perf.bench experiments) --------------------


def _experiments_environment(results: Results) -> list[str]:
    model, meta = results["model"], results["meta"]
    return [
        f"The reference GPT `{model['size']}` ({model['parameters'] / 1e6:.1f}M parameters, "
        f"{model['n_layer']} "
        f"layers, width {model['n_embd']}), "
        f"batch {model['batch_size']} × {model['seq_len']} tokens, "
        f"{results['optimizer']}, on {hardware(meta)}. Command: `{meta['command']}`."
    ]


def _ok_rows(results: Results) -> list[dict[str, Any]]:
    return [r for r in results["precision"] if r["supported"] and "error" not in r]


def _experiments_precision(results: Results) -> list[str]:
    cuda = results["meta"]["device"] == "cuda"
    unit, mem = _memory_unit([r["peak_memory_bytes"] for r in _ok_rows(results)])
    header = [
        "precision",
        "step time (ms)",
        "p10–p90 (ms)",
        "tokens/s",
        "speed-up vs fp32",
        *(["MFU"] if cuda else []),
        f"peak memory ({unit})",
    ]
    rows = [
        [
            r["precision"],
            f"{r['step_time_median_ms']:.1f}",
            f"{r['step_time_p10_ms']:.1f}–{r['step_time_p90_ms']:.1f}",
            _rate(r["tokens_per_s"]),
            f"{_ratio(r['speedup_vs_fp32'])}×" if r.get("speedup_vs_fp32") else "—",
            *([_cell(r["mfu"], _percent)] if cuda else []),
            _cell(r["peak_memory_bytes"], mem),
        ]
        for r in _ok_rows(results)
    ]
    lines = _table(header, rows)
    failed = [
        f"{r['precision']} ({_clean(r['error'])})" for r in results["precision"] if "error" in r
    ]
    skipped = [r["precision"] for r in results["precision"] if not r["supported"]]
    if skipped:
        lines += ["", f"Not supported on this device: {', '.join(skipped)}."]
    if failed:
        lines += ["", f"Failed: {'; '.join(failed)}."]
    if not cuda:
        lines += ["", "MFU needs a device peak; a CPU has none, so it is not shown."]
    return lines


def _experiments_estimate(results: Results) -> list[str]:
    rows = [(f"{r['precision']}, no checkpointing", r) for r in _ok_rows(results)]
    rows += [
        (f"{results['checkpointing']['precision']}, {r['policy']}", r)
        for r in results["checkpointing"]["rows"]
        if r["policy"] != "none" and "error" not in r
    ]
    rows = [(name, r) for name, r in rows if r.get("estimate_bytes") is not None]
    unit, mem = _memory_unit([r["peak_memory_bytes"] for _, r in rows])
    return _table(
        ["configuration", f"estimate ({unit})", f"measured peak ({unit})", "error"],
        [
            [
                name,
                mem(r["estimate_bytes"]),
                mem(r["peak_memory_bytes"]),
                _error(r["estimate_error"]),
            ]
            for name, r in rows
        ],
    )


def _experiments_checkpointing(results: Results) -> list[str]:
    section = results["checkpointing"]
    unit, mem = _memory_unit([r.get("peak_memory_bytes") for r in section["rows"]])
    rows = []
    for r in section["rows"]:
        if "error" in r:
            rows.append([r["policy"], f"failed: {_clean(r['error'])}", "", "", "", "", ""])
            continue
        rows.append(
            [
                r["policy"],
                str(r["checkpointed_layers"]),
                f"{r['step_time_median_ms']:.1f}",
                _change(r["time_change"]),
                mem(r["peak_memory_bytes"]),
                _change(r["memory_change"]),
                "yes" if r["meets_goal"] else "no",
            ]
        )
    return [
        f"Precision: {section['precision']}. "
        "Goal: at least 30% lower peak memory for at most 20% more "
        "step time.",
        "",
    ] + _table(
        [
            "policy",
            "blocks checkpointed",
            "step time (ms)",
            "time",
            f"peak memory ({unit})",
            "memory",
            "meets goal",
        ],
        rows,
    )


def _experiments_recommendation(results: Results) -> list[str]:
    rows = [
        r for r in results["checkpointing"]["rows"] if r["policy"] != "none" and "error" not in r
    ]
    if not rows:
        return ["*No checkpointing policy ran, so no recommendation.*"]

    def describe(r: dict[str, Any]) -> str:
        return (
            f"**{r['policy']}** ({_change(r['memory_change'])} peak memory, "
            f"{_change(r['time_change'])} step time)"
        )

    meeting = [r for r in rows if r["meets_goal"]]
    if meeting:
        return [
            f"Recommended on this setup: {describe(min(meeting, key=lambda r: r['time_change']))}, "
            "the cheapest policy that meets the goal."
        ]
    return [
        f"No policy met the goal on this setup. The largest saving came from "
        f"{describe(min(rows, key=lambda r: r['memory_change']))}; the cheapest policy was "
        f"{describe(min(rows, key=lambda r: r['time_change']))}."
    ]


def _experiments_phases(results: Results) -> list[str]:
    rows = results["phases"]["rows"]
    if not rows:
        return ["*The per-phase measurement failed in this run.*"]
    unit, mem = _memory_unit([r["peak"] for r in rows])
    return [f"Precision: {results['phases']['precision']}, a steady-state step.", ""] + _table(
        ["phase", f"allocated after ({unit})", f"reserved ({unit})", f"peak during ({unit})"],
        [
            [r["phase"], mem(r["allocated"]), _cell(r["reserved"], mem), mem(r["peak"])]
            for r in rows
        ],
    )


def _experiments_operators(results: Results) -> list[str]:
    cuda = results["meta"]["device"] == "cuda"
    key = "self_device_us" if cuda else "self_cpu_us"
    return [
        f"Precision: {results['top_operators']['precision']}, two profiled steps.",
        "",
    ] + _table(
        ["operator", "calls", f"self {'CUDA' if cuda else 'CPU'} time (ms)"],
        [
            [f"`{_clean(r['name'])}`", str(r["calls"]), f"{r[key] / 1e3:.2f}"]
            for r in results["top_operators"]["rows"]
        ],
    )


def _experiments_throughput(results: Results) -> list[str]:
    cuda = results["meta"]["device"] == "cuda"
    header = [
        "precision",
        "tokens/s",
        "samples/s",
        *(["device peak (TFLOP/s)", "MFU"] if cuda else []),
    ]
    rows = [
        [
            r["precision"],
            _rate(r["tokens_per_s"]),
            f"{r['samples_per_s']:.1f}",
            *([f"{r['peak_flops'] / 1e12:.1f}", _percent(r["mfu"])] if cuda else []),
        ]
        for r in _ok_rows(results)
    ]
    lines = [
        f"FLOPs per token (6·N + 12·L·d·T): {results['model']['flops_per_token'] / 1e9:.4f} GFLOP.",
        "",
    ]
    lines += _table(header, rows)
    if not cuda:
        lines += [
            "",
            "MFU divides by a device's peak; a CPU has none in the peak table, so it is not shown.",
        ]
    return lines


def _scaling_efficiency(results: Results) -> list[str]:
    n = str(results["processes"][-1])
    times, rates, eff = (
        results["window_step_times_s"],
        results["tokens_per_s"],
        results["efficiency"],
    )
    rows = [[k, _ms(min(times[k])) + "–" + _ms(max(times[k])), _rate(rates[k])] for k in ("1", n)]
    return _table(["processes", "ms per step (min–max over windows)", "tokens/s"], rows) + [
        "",
        f"Scaling efficiency with {n} processes: {_percent(eff['ratio'])} "
        f"({_percent(eff['confidence'])} bootstrap interval "
        f"{_percent(eff['low'])}–{_percent(eff['high'])}).",
    ]


def _compile_speedup(results: Results) -> list[str]:
    rows = results["rows"]
    unit, mem = _memory_unit([r["peak_bytes"] for r in rows])
    body = [
        [
            r["mode"],
            _cell(r["compile_s"], lambda v: f"{v:.1f}"),
            _ms(r["step_s"]["median"]),
            _ratio(r["speedup"]),
            _cell(r["break_even_steps"], _rate),
            str(r["graphs"]),
            str(r["graph_breaks"]),
            _cell(r["peak_bytes"], mem),
        ]
        for r in rows
    ]
    settings = results["meta"]["settings"]
    return _table(
        [
            "variant",
            "first step (s)",
            "ms per step (median)",
            "speed-up over eager",
            "break-even steps",
            "graphs",
            "graph breaks",
            f"peak memory ({unit})",
        ],
        body,
    ) + [
        "",
        f"The {settings['size']} GPT, batch {settings['batch_size']} × "
        f"{settings['seq_len']} tokens, backend "
        f"`{settings['backend']}`; median over {settings['windows']} windows of "
        f"{settings['steps_per_window']} "
        "steps after a warm-up.",
    ]


def _estimate_families(results: Results) -> list[str]:
    """The rows of an ``estimate`` results file (``python -m trainopt.perf.bench estimate``)."""
    header = [
        "family",
        "parameters",
        "precision",
        "optimizer",
        "checkpointing",
        "estimate (MiB)",
        "measured peak (MiB)",
        "error",
        "peak phase",
        "Accelerate (MiB)",
        "Accelerate's error",
    ]
    rows = [
        [
            r["family"],
            f"{r['parameters']:,.0f}",
            r["precision"],
            r["optimizer"],
            "blocks" if r["checkpointing"] else "none",
            _mib(r["estimate_bytes"]),
            _mib(r["measured_bytes"]),
            _error(r["error"]),
            r["peak_phase"],
            _mib(r["accelerate_bytes"]),
            _error(r["accelerate_error"]),
        ]
        for r in results["rows"]
    ]
    return _table(header, rows)


PARTS: dict[str, dict[str, Callable[[Results], list[str]]]] = {
    "bench": {
        "results": _bench_results,
        "recipe": _bench_recipe,
        "goal": _bench_goal,
        "profile": _bench_profile,
    },
    "stability": {"overhead": _stability_overhead},
    "scaling": {"efficiency": _scaling_efficiency},
    "compile": {"speedup": _compile_speedup},
    "estimate": {"families": _estimate_families},
    "experiments": {
        "environment": _experiments_environment,
        "precision": _experiments_precision,
        "estimate": _experiments_estimate,
        "checkpointing": _experiments_checkpointing,
        "recommendation": _experiments_recommendation,
        "phases": _experiments_phases,
        "operators": _experiments_operators,
        "throughput": _experiments_throughput,
    },
}
"""The parts :func:`render` can show, by the ``kind`` of the results file."""


def _missing(path: Path) -> str:
    if path.stem.startswith("compile_"):
        return (
            f"*No results in `{path.name}` yet: `python -m trainopt.perf.bench compile --out "
            f"docs/_data/{path.name}` writes them.*\n"
        )
    if path.stem.startswith("memory_estimate"):
        return (
            f"*No results in `{path.name}` yet: `python -m trainopt.perf.bench estimate "
            f"--out docs/_data/{path.name}` writes them.*\n"
        )
    if path.stem.startswith("bench_scaling"):
        return (
            f"*No results in `{path.name}` yet: `python -m trainopt.perf.bench scaling "
            f"--out docs/_data/{path.name}` writes them.*\n"
        )
    preset = path.stem.rsplit("_", 1)[-1]
    where = "on an H100" if preset == "h100" else "on the machine it names"
    return (
        f"*No results in `{path.name}` yet: `python -m trainopt.perf.bench all --preset {preset} "
        f"--out-dir docs/_data` {where} writes them.*\n"
    )


def render(source: str | os.PathLike | Results, parts: Sequence[str] | None = None) -> str:
    """MyST Markdown of the ``parts`` of a results file (default: all of its kind).

    Every table is followed by its label (:func:`trainopt.perf.bench.results.label`: hardware,
    software, date, commit); parts without a table are labelled once, at the end.

    Args:
        source: A results file (or the loaded results).
        parts: Names from :data:`PARTS` for the file's kind.

    Example:
        >>> from trainopt_site.perf.bench.report import render
        >>> print(render("bench_a100.json"))
        *No results in `bench_a100.json` yet: `python -m trainopt.perf.bench all --preset a100
        --out-dir docs/_data` on the machine it names writes them.*
        >>> from trainopt.perf.bench.stability import run
        >>> text = render(run(size="tiny", device="cpu", steps_per_window=1, windows=1,
        ...                warmup_steps=1, max_warmup_steps=2, seq_len=8, forms=["SGD default"],
        ...                sync_steps=1))
        >>> text.splitlines()[0].split(" | ")[:3]
        ['| optimizer form', 'bare (ms/step)', 'stabilized (ms/step)']
    """
    results = read_results(source)
    if results is None:
        return _missing(Path(source))
    available = PARTS[results["kind"]]
    chosen = list(parts) if parts is not None else list(available)
    unknown = [p for p in chosen if p not in available]
    if unknown:
        raise ValueError(
            f"parts of a {results['kind']} file must be among {list(available)}, got {unknown}"
        )
    tag = label(results)
    blocks = ["\n".join(available[name](results)) for name in chosen]
    labelled = [block + ("\n\n" + tag if "| --- |" in block else "") for block in blocks]
    if not any("| --- |" in block for block in blocks):
        labelled.append(tag)
    return "\n\n".join(labelled) + "\n"


def render_device_peaks() -> str:
    """The dense peak TFLOP/s per precision that MFU divides by
    (:data:`trainopt.perf.bench.mfu.PEAK_TFLOPS`).

    Example:
        >>> from trainopt_site.perf.bench.report import render_device_peaks
        >>> for line in render_device_peaks().splitlines()[:3]:
        ...     print(line)
        | device | fp32 | tf32 | bf16 | fp16 |
        | --- | ---: | ---: | ---: | ---: |
        | H100 SXM | 66.9 | 494.7 | 989.4 | 989.4 |
    """
    rows = [
        [device, *(f"{peaks[p]:,.1f}" for p in ("fp32", "tf32", "bf16", "fp16"))]
        for device, peaks in PEAK_TFLOPS.items()
    ]
    return "\n".join(_table(["device", "fp32", "tf32", "bf16", "fp16"], rows)) + (
        "\n\nDense TFLOP/s from NVIDIA's data sheets "
        '(the figures "with sparsity" are twice these).\n'
    )
