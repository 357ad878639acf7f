"""The troubleshooting page's figures and tables: the recorded runs, and a fresh early blow-up.

Figures are drawn for a content column about 700 px wide at 110 dpi: at most 6.4 inches wide,
with text of at least 9 points, so no label is smaller than 9 px where it is displayed.
"""

from __future__ import annotations

import math
import textwrap
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainopt.data import path
from trainopt_site.diagnostics.runs import FAULT_DESCRIPTIONS, FAULTS

WIDTH_IN = 6.4
"""Widest figure, in inches: 704 px at the 110 dpi the site renders figures at."""

FONT_PT = 9.5
"""Size of every text in the figures, in points."""

_STYLE = {
    "font.size": FONT_PT,
    "axes.titlesize": FONT_PT,
    "axes.labelsize": FONT_PT,
    "xtick.labelsize": FONT_PT,
    "ytick.labelsize": FONT_PT,
    "legend.fontsize": FONT_PT,
}


def findings_table(runs_dir: str | Path | None = None) -> str:
    """A MyST table: each recorded run, the fault injected into it, and what :func:`diagnose` names.

    ``runs_dir`` defaults to the runs shipped in :mod:`trainopt.data`.

    Example:
        >>> from trainopt_site.diagnostics.plots import findings_table
        >>> print(findings_table().splitlines()[2])
        | `healthy` | none (Adam, lr 2e-3) | — |
    """
    from trainopt.diagnostics.symptoms import diagnose

    runs_dir = path("runs") if runs_dir is None else runs_dir
    rows = ["| run | injected fault | diagnose names (from step) |", "| --- | --- | --- |"]
    for fault in FAULTS:
        run = Path(runs_dir) / f"{fault}.jsonl"
        if not run.exists():
            rows.append(f"| `{fault}` | {FAULT_DESCRIPTIONS[fault]} | not recorded |")
            continue
        named = (
            ", ".join(
                f"**{f.symptom}** ({f.step})" if f.symptom == fault else f"{f.symptom} ({f.step})"
                for f in diagnose(run)
            )
            or "—"
        )
        rows.append(f"| `{fault}` | {FAULT_DESCRIPTIONS[fault]} | {named} |")
    return "\n".join(rows) + "\n"


def runs_figure(
    runs_dir: str | Path | None = None,
    faults: tuple[str, ...] = ("healthy", "diverging", "oscillating"),
) -> Any:
    """Loss (top) and gradient norm (bottom) of up to three recorded runs, one column each (log
    scales where they span decades).

    Example:
        >>> from trainopt_site.diagnostics.plots import runs_figure
        >>> fig = runs_figure(faults=("healthy",))
        >>> len(fig.axes)
        2
    """
    import matplotlib.pyplot as plt

    from trainopt.diagnostics.records import load_records

    if not 1 <= len(faults) <= 3:
        raise ValueError(
            f"faults must name 1 to 3 runs (more would not be readable), got {faults=}"
        )
    runs_dir = path("runs") if runs_dir is None else runs_dir
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(
            2, len(faults), figsize=(WIDTH_IN, 3.9), sharex=True, squeeze=False
        )
        for column, fault in enumerate(faults):
            records = load_records(Path(runs_dir) / f"{fault}.jsonl")
            steps = [r["step"] for r in records]
            for row, key in enumerate(("loss", "grad_norm")):
                ax = axes[row][column]
                values = [r[key] for r in records]
                ax.plot(steps, values, lw=0.8, color="C0" if row == 0 else "C1")
                positive = [v for v in values if v > 0]
                if positive and max(positive) > 10 * min(
                    positive
                ):  # a log scale only where it spans decades
                    ax.set_yscale("log")
                ax.grid(alpha=0.3)
                if row == 0:
                    ax.set_title(fault.replace("_", " "))
                else:
                    ax.set_xlabel("step")
                if column == 0:
                    ax.set_ylabel(key.replace("_", " "))
        fig.tight_layout()
    return fig


@lru_cache(maxsize=4)
def _fresh(cause: str, optimizer: str, hidden: int, seed: int) -> tuple[dict[str, Any], ...]:
    from trainopt.diagnostics.known_causes import generate_run

    return tuple(generate_run(cause, optimizer, hidden, seed))


TEXT_COLUMNS = 88
"""Widest line of a text block on the page: it fits the content column without scrolling."""


def blow_up_diagnosis(
    cause: str = "lr_too_high", optimizer: str = "sgd", hidden: int = 128, seed: int = 0
) -> str:
    """What :func:`diagnose` says of a fresh generated run, as a MyST ``text`` block (built with the
    page).

    Each finding prints as ``str(finding)`` does, its lines wrapped at :data:`TEXT_COLUMNS`.

    Example:
        >>> from trainopt_site.diagnostics.plots import blow_up_diagnosis
        >>> text = blow_up_diagnosis(cause="lr_too_high", optimizer="adamw", hidden=16)
        >>> text.startswith("```text") and "cause:" in text
        True
    """
    from trainopt.diagnostics.symptoms import diagnose

    findings = diagnose(list(_fresh(cause, optimizer, hidden, seed)), classes=10)
    lines = [
        textwrap.fill(
            line,
            TEXT_COLUMNS,
            subsequent_indent="    ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        for f in findings
        for line in str(f).splitlines()
    ]
    return "```text\n" + "\n".join(lines) + "\n```\n"


def blow_up_figure(
    cause: str = "lr_too_high", optimizer: str = "sgd", hidden: int = 128, seed: int = 0
) -> Any:
    """Loss and gradient norm of a fresh generated run, its first 40 steps and the whole run, with
    its findings.

    The run is drawn in colour over the healthy run of the same model and seed (grey). The red line
    is the step of the first finding, grey dashed lines those of the findings tied to it; the
    dotted line is ``log(10)``, the loss of a uniform guess over the digits' 10 classes.

    Example:
        >>> from trainopt_site.diagnostics.plots import blow_up_figure
        >>> fig = blow_up_figure(hidden=16)
        >>> len(fig.axes), bool(fig.get_figwidth() <= 6.4)
        (4, True)
    """
    import matplotlib.pyplot as plt

    from trainopt.diagnostics.known_causes import SETTINGS
    from trainopt.diagnostics.symptoms import diagnose

    records = list(_fresh(cause, optimizer, hidden, seed))
    healthy = list(_fresh("healthy", optimizer, hidden, seed))
    findings = diagnose(records, classes=10)
    first = findings[0] if findings else None
    tied = [f for f in findings if f.after is not None]
    with plt.rc_context(_STYLE):
        fig, axes = plt.subplots(2, 2, figsize=(WIDTH_IN, 4.4), sharex="col", sharey="row")
        for column, last in enumerate((40, len(records))):
            for row, key in enumerate(("loss", "grad_norm")):
                ax = axes[row][column]
                ax.plot(
                    range(min(last, len(healthy))),
                    [r[key] for r in healthy[:last]],
                    lw=1.0,
                    color="0.65",
                    label=f"healthy, lr {SETTINGS['healthy', optimizer][0]:g}",
                )
                ax.plot(
                    range(last),
                    [r[key] for r in records[:last]],
                    lw=1.0,
                    color="C0" if row == 0 else "C1",
                    label=f"this run, lr {SETTINGS[cause, optimizer][0]:g}",
                )
                ax.set_yscale("log")
                ax.grid(alpha=0.3)
                if row == 0:
                    ax.axhline(math.log(10), color="k", ls=":", lw=1.0)
                for f in tied:
                    ax.axvline(f.step, color="0.4", ls="--", lw=1.0)
                if first is not None:
                    ax.axvline(first.step, color="C3", ls="--", lw=1.2)
            axes[0][column].set_title("first 40 steps" if column == 0 else "whole run")
            axes[1][column].set_xlabel("step")
        axes[0][0].set_ylabel("loss")
        axes[1][0].set_ylabel("gradient norm")
        axes[0][1].legend(loc="upper right", frameon=False)
        if first is not None:
            axes[0][0].annotate(
                first.symptom.replace("_", " "),
                (first.step, 0.95),
                xycoords=("data", "axes fraction"),
                xytext=(4, 0),
                textcoords="offset points",
                color="C3",
                va="top",
            )
        for f in tied[:1]:
            if f.step < 40:
                axes[0][0].annotate(
                    f.symptom.replace("_", " "),
                    (f.step, 0.05),
                    xycoords=("data", "axes fraction"),
                    xytext=(-4, 0),
                    textcoords="offset points",
                    color="0.3",
                    va="bottom",
                    ha="right",
                )
        fig.tight_layout()
    return fig
