"""The benchmarking page's chart, drawn at build time from a results file."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from trainopt.perf.bench.results import Results, hardware, read_results


def plot_results(source: str | os.PathLike | Results, title: str = "") -> Figure:
    """A bar chart of tokens/s per measured configuration, labelled with MFU where there is a peak.

    A missing results file gives a figure that says so.

    Example:
        >>> from trainopt_site.perf.bench.plots import plot_results
        >>> fig = plot_results("bench_h100.json")  # no such file here
        >>> fig.axes[0].texts[0].get_text()
        'no results in bench_h100.json yet'
    """
    results = read_results(source)
    rows = [r for r in results["results"] if r["status"] == "ok"] if results else []
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(rows))))
    if results is None:
        ax.text(
            0.5,
            0.5,
            f"no results in {os.path.basename(source)} yet",
            ha="center",
            va="center",
            fontsize=14,
        )
        ax.set_axis_off()
        return fig
    bars = ax.barh([r["name"] for r in rows], [r["tokens_per_s"] for r in rows], color="#4C72B0")
    ax.invert_yaxis()
    for bar, r in zip(bars, rows):
        text = f"{r['tokens_per_s']:,.0f}" + (
            f"  ({r['mfu'] * 100:.1f}% MFU)" if r.get("mfu") is not None else ""
        )
        ax.text(
            bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + text, va="center", fontsize=8
        )
    ax.set_xlabel("tokens/s (median over windows)")
    ax.set_xlim(0, max((r["tokens_per_s"] for r in rows), default=1) * 1.45)
    ax.set_title(title or f"Training throughput on {hardware(results['meta'])}")
    fig.tight_layout()
    return fig
