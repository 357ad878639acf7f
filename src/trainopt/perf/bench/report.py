"""Tables, summaries and charts of benchmark results, made from the JSON that the harness writes.

Every number these functions print is read from a results file written by
:func:`trainopt.perf.bench.harness.run_matrix` (or ``python -m trainopt.perf.bench``); they compute nothing
new, so a page that renders them can't show a number that wasn't measured. A missing file gives
a note that the result is not yet measured instead of a table.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

Results = dict[str, Any]


def load_results(source: str | os.PathLike | Results) -> Results | None:
    """Results from a JSON path (``None`` if the file doesn't exist) or a results dict as is.

    Example:
        >>> from trainopt.perf.bench.report import load_results
        >>> load_results("no/such/file.json") is None, load_results({"results": []})
        (True, {'results': []})
    """
    if isinstance(source, dict):
        return source
    path = Path(source)
    if not path.exists():
        return None
    return json.loads(path.read_text())


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds with one decimal.

    Example:
        >>> from trainopt.perf.bench.report import fmt_ms
        >>> fmt_ms(0.0362)
        '36.2'
    """
    return f"{seconds * 1e3:.1f}"


def fmt_rate(value: float) -> str:
    """A rate with thousands separators.

    Example:
        >>> from trainopt.perf.bench.report import fmt_rate
        >>> fmt_rate(45261.3)
        '45,261'
    """
    return f"{value:,.0f}"


def fmt_percent(fraction: float) -> str:
    """A fraction as a percentage with one decimal.

    Example:
        >>> from trainopt.perf.bench.report import fmt_percent
        >>> fmt_percent(0.437)
        '43.7%'
    """
    return f"{fraction * 100:.1f}%"


def fmt_gb(num_bytes: float) -> str:
    """Bytes as GB (10⁹) with one decimal.

    Example:
        >>> from trainopt.perf.bench.report import fmt_gb
        >>> fmt_gb(41.26e9)
        '41.3'
    """
    return f"{num_bytes / 1e9:.1f}"


def fmt_ratio(value: float) -> str:
    """A ratio with two decimals.

    Example:
        >>> from trainopt.perf.bench.report import fmt_ratio
        >>> fmt_ratio(6.527)
        '6.53'
    """
    return f"{value:.2f}"


def fmt_ratio3(value: float) -> str:
    """A ratio with three decimals.

    Example:
        >>> from trainopt.perf.bench.report import fmt_ratio3
        >>> fmt_ratio3(1.0042)
        '1.004'
    """
    return f"{value:.3f}"


def fmt_seconds(value: float) -> str:
    """Seconds with one decimal.

    Example:
        >>> from trainopt.perf.bench.report import fmt_seconds
        >>> fmt_seconds(61.84)
        '61.8'
    """
    return f"{value:.1f}"


def _missing(source: str | os.PathLike | Results) -> str:
    name = Path(source).name if not isinstance(source, dict) else "results"
    return (f"*Not yet measured on a GPU: `{name}` has not been recorded yet. "
            "Run the command above on the GPU to fill this in.*\n")


def _ok(results: Results) -> list[Results]:
    return [r for r in results["results"] if r["status"] == "ok"]


def provenance(results: Results) -> str:
    """One sentence saying where, when and how the results were measured.

    Example:
        >>> from trainopt.perf.bench.report import provenance
        >>> meta = {"device": "cpu", "torch": "2.13.0", "date": "2026-11-23T10:00:00+00:00",
        ...         "git_commit": "abc", "windows": 5, "steps_per_window": 10, "warmup_steps": 3}
        >>> provenance({"meta": meta}).split(":")[0]
        'Measured on cpu (torch 2.13.0) on 2026-11-23 at commit `abc`'
    """
    meta = results["meta"]
    software = f"torch {meta['torch']}" + (f", CUDA {meta['cuda']}" if meta.get("cuda") else "")
    peak = meta.get("peak_source") or "no peak"
    dirty = " with uncommitted changes" if meta.get("git_dirty") else ""
    return (f"Measured on {meta['device']} ({software}) on {meta['date'][:10]} at commit "
            f"`{meta.get('git_commit') or 'unknown'}`{dirty}: median of {meta['windows']} windows of "
            f"{meta['steps_per_window']} steps after {meta['warmup_steps']} warm-up steps. "
            f"MFU reference: {peak}.")


def results_table(source: str | os.PathLike | Results) -> str:
    """A MyST Markdown table of every configuration in a results file, with its provenance.

    Columns: step time (median, and the min–max over windows), tokens/s, MFU, peak memory,
    warm-up time (compilation included). Rows that didn't run say why.

    Example:
        >>> from trainopt.perf.bench.report import results_table
        >>> from trainopt.perf.bench.configs import BenchConfig
        >>> from trainopt.perf.bench.harness import run_matrix
        >>> res = run_matrix([BenchConfig(batch_size=2, seq_len=8)], "cpu", steps=1, windows=1, progress=False)
        >>> print(results_table(res).splitlines()[0])
        | configuration | step time (ms), median [min–max] | tokens/s | MFU | peak memory (GB) | warm-up (s) |
    """
    results = load_results(source)
    if results is None:
        return _missing(source)
    lines = ["| configuration | step time (ms), median [min–max] | tokens/s | MFU | peak memory (GB) | warm-up (s) |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results["results"]:
        if r["status"] != "ok":
            error = " ".join(str(r.get("error", "")).split()).replace("|", "/")[:160]
            lines.append(f"| {r['name']} | {r['status']}: {error} | | | | |")
            continue
        t = r["step_time_s"]
        mfu = fmt_percent(r["mfu"]) if r.get("mfu") is not None else "n/a"
        memory = fmt_gb(r["peak_memory_bytes"]) if r.get("peak_memory_bytes") is not None else "n/a"
        lines.append(f"| {r['name']} | {fmt_ms(t['median'])} [{fmt_ms(t['min'])}–{fmt_ms(t['max'])}] | "
                     f"{fmt_rate(r['tokens_per_s'])} | {mfu} | {memory} | {fmt_seconds(r['warmup_s'])} |")
    return "\n".join(lines) + "\n\n" + provenance(results) + "\n"


def recipe_summary(source: str | os.PathLike | Results) -> str:
    """The headline: how much faster the project's recipe runs than the plain PyTorch loop.

    Example:
        >>> from trainopt.perf.bench.report import recipe_summary
        >>> recipe_summary({"meta": {}, "results": []})
        '*No recipe comparison in these results.*\\n'
    """
    results = load_results(source)
    if results is None:
        return _missing(source)
    recipe = results.get("recipe")
    if not recipe:
        return "*No recipe comparison in these results.*\n"
    by_name = {r["name"]: r for r in results["results"]}
    base, cand = by_name[recipe["baseline"]], by_name[recipe["candidate"]]
    if recipe.get("speedup") is None:
        return (f"*The recipe comparison did not complete: {base['name']} is {base['status']}, "
                f"{cand['name']} is {cand['status']}.*\n")
    ratio = recipe["speedup"]
    verdict = "faster" if ratio >= 1 else "slower: the recipe does not pay off here"
    return (f"**Speed-up {fmt_ratio(ratio)}×** ({verdict}): {cand['name']} trains "
            f"{fmt_rate(cand['tokens_per_s'])} tokens/s ({fmt_ms(cand['step_time_s']['median'])} ms per "
            f"step) where {base['name']} trains {fmt_rate(base['tokens_per_s'])} tokens/s "
            f"({fmt_ms(base['step_time_s']['median'])} ms per step), on {results['meta']['device']}.\n")


def best_result(results: Results, size: str) -> Results | None:
    """The measured configuration of model ``size`` with the highest tokens/s, or ``None``.

    Example:
        >>> from trainopt.perf.bench.report import best_result
        >>> rows = [{"name": n, "status": "ok", "config": {"size": "tiny"}, "tokens_per_s": t}
        ...         for n, t in (("a", 10.0), ("b", 30.0))]
        >>> best_result({"results": rows}, "tiny")["name"], best_result({"results": rows}, "350m")
        ('b', None)
    """
    candidates = [r for r in _ok(results) if r["config"]["size"] == size]
    return max(candidates, key=lambda r: r["tokens_per_s"], default=None)


def goals_summary(source: str | os.PathLike | Results, size: str | None = None) -> str:
    """Whether the best configuration of ``size`` reached the MFU goal, with the measured figure.

    ``size`` defaults to the results file's ``meta.mfu_goal_size``.

    Example:
        >>> from trainopt.perf.bench.report import goals_summary
        >>> goals_summary({"meta": {"mfu_goal": 0.5, "mfu_goal_size": "350m"}, "results": []})
        '*No configuration of the 350m model was measured in these results.*\\n'
    """
    results = load_results(source)
    if results is None:
        return _missing(source)
    size = size or results["meta"].get("mfu_goal_size", "")
    best = best_result(results, size)
    goal = results["meta"].get("mfu_goal")
    if best is None:
        return f"*No configuration of the {size} model was measured in these results.*\n"
    if best.get("mfu") is None or goal is None:
        return f"The fastest {size} configuration, {best['name']}, has no MFU reference on this device.\n"
    verdict = "meets" if best["mfu"] >= goal else "misses"
    return (f"The fastest {size} configuration, {best['name']}, reaches **{fmt_percent(best['mfu'])} MFU** "
            f"({fmt_rate(best['tokens_per_s'])} tokens/s, {fmt_ms(best['step_time_s']['median'])} ms "
            f"per step): it **{verdict}** the goal of {fmt_percent(goal)}.\n")


def profile_table(source: str | os.PathLike | Results, size: str | None = None) -> str:
    """Where the step time of the fastest configuration of ``size`` goes, by kernel category.

    ``size`` defaults to the results file's ``meta.mfu_goal_size``, falling back to the
    fastest profiled configuration of any size.

    Example:
        >>> from trainopt.perf.bench.report import profile_table
        >>> profile_table({"meta": {}, "results": []})
        '*No profile in these results.*\\n'
    """
    results = load_results(source)
    if results is None:
        return _missing(source)
    size = size or results["meta"].get("mfu_goal_size", "")
    profiled = [r for r in _ok(results) if "profile" in r]
    candidates = [r for r in profiled if r["config"]["size"] == size] or profiled
    if not candidates:
        return "*No profile in these results.*\n"
    best = max(candidates, key=lambda r: r["tokens_per_s"])
    prof = best["profile"]
    lines = [f"Profile of {best['name']} ({prof['steps']} steps): the device is busy "
             f"{fmt_ms(prof['busy_s_per_step'])} ms of the {fmt_ms(best['step_time_s']['median'])} ms step.", "",
             "| category | ms per step | share of busy time |", "| --- | --- | --- |"]
    for name, cat in prof["categories"].items():
        lines.append(f"| {name} | {fmt_ms(cat['s_per_step'])} | {fmt_percent(cat['share'])} |")
    lines += ["", "| top kernel or operator | ms per step |", "| --- | --- |"]
    for row in prof["top"]:
        name = row["name"].replace("|", "/").replace("`", "'")
        lines.append(f"| `{name}` | {fmt_ms(row['s_per_step'])} |")
    return "\n".join(lines) + "\n"


def stability_summary(source: str | os.PathLike | Results) -> str:
    """What the stability stack costs per step, against its goal, from the ``stability`` entry.

    Example:
        >>> from trainopt.perf.bench.report import stability_summary
        >>> stability_summary({"meta": {}, "results": []})
        '*No stability benchmark in these results.*\\n'
    """
    results = load_results(source)
    if results is None:
        return _missing(source)
    stab = results.get("stability")
    if not stab:
        return "*No stability benchmark in these results.*\n"
    if stab.get("status") != "ok":
        return f"*The stability benchmark did not run: {stab.get('status')}: {stab.get('error')}.*\n"
    ms, ratios, cfg = stab["ms_per_step"], stab["ratios"], stab["config"]
    ratio = ratios["stabilizer/bare"]
    verdict = "meets" if ratio <= stab["goal_ratio"] else "misses"
    sync = stab["sync_check"]
    return "\n".join([
        "| step | ms per step (median) | ratio to the bare step |", "| --- | --- | --- |",
        f"| bare | {fmt_ms(ms['bare'] / 1e3)} | |",
        f"| TrainingStabilizer | {fmt_ms(ms['stabilizer'] / 1e3)} | {fmt_ratio3(ratio)} |",
        f"| seed-style `.item()` stack | {fmt_ms(ms['seed_style'] / 1e3)} | {fmt_ratio3(ratios['seed_style/bare'])} |",
        "",
        f"{cfg['model']}, batch {cfg['batch_size']} × {cfg['seq_len']}, {cfg['dtype']}, on "
        f"{stab['hardware']['name']}. The stabilizer's ratio {fmt_ratio3(ratio)} **{verdict}** the goal of "
        f"at most {fmt_ratio3(stab['goal_ratio'])}. Host syncs in {sync['steps']} steady-state steps: "
        f"{sync['syncs'] if 'syncs' in sync else ('none' if sync['passed'] else 'some')}.",
    ]) + "\n"


def plot_results(source: str | os.PathLike | Results, title: str = "") -> Figure:
    """A bar chart of tokens/s per configuration, labelled with MFU where there is a peak.

    A missing results file gives a figure that says so.

    Example:
        >>> from trainopt.perf.bench.report import plot_results
        >>> fig = plot_results("does-not-exist.json")
        >>> fig.axes[0].texts[0].get_text()
        'not yet measured on a GPU'
    """
    results = load_results(source)
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(results["results"]) if results else 1)))
    if results is None:
        ax.text(0.5, 0.5, "not yet measured on a GPU", ha="center", va="center", fontsize=14)
        ax.set_axis_off()
        return fig
    rows = _ok(results)
    names = [r["name"] for r in rows]
    values = [r["tokens_per_s"] for r in rows]
    bars = ax.barh(names, values, color="#4C72B0")
    ax.invert_yaxis()
    for bar, r in zip(bars, rows):
        label = fmt_rate(r["tokens_per_s"])
        if r.get("mfu") is not None:
            label += f"  ({fmt_percent(r['mfu'])} MFU)"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + label, va="center", fontsize=8)
    ax.set_xlabel("tokens/s (median over windows)")
    ax.set_xlim(0, max(values, default=1) * 1.45)
    ax.set_title(title or f"Training throughput on {results['meta']['device']}")
    fig.tight_layout()
    return fig
