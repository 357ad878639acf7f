"""The troubleshooting page's figure and table of the recorded runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainopt.data import path
from trainopt.diagnostics.runs import FAULT_DESCRIPTIONS, FAULTS


def findings_table(runs_dir: str | Path | None = None) -> str:
    """A MyST table: each recorded run, the fault injected into it, and what :func:`diagnose` names.

    ``runs_dir`` defaults to the runs shipped in :mod:`trainopt.data`.

    Example:
        >>> from trainopt.diagnostics.plots import findings_table
        >>> print(findings_table().splitlines()[2])
        | `healthy` | none | — |
    """
    from trainopt.diagnostics.symptoms import diagnose

    runs_dir = path("runs") if runs_dir is None else runs_dir
    rows = ["| run | injected fault | diagnose names (from step) |", "| --- | --- | --- |"]
    for fault in FAULTS:
        run = Path(runs_dir) / f"{fault}.jsonl"
        if not run.exists():
            rows.append(f"| `{fault}` | {FAULT_DESCRIPTIONS[fault]} | not recorded |")
            continue
        named = ", ".join(f"**{f.symptom}** ({f.step})" if f.symptom == fault else f"{f.symptom} ({f.step})"
                          for f in diagnose(run)) or "—"
        rows.append(f"| `{fault}` | {FAULT_DESCRIPTIONS[fault]} | {named} |")
    return "\n".join(rows) + "\n"


def runs_figure(runs_dir: str | Path | None = None, faults: tuple[str, ...] = (
        "healthy", "diverging", "oscillating", "plateau", "loss_explosion", "gradient_explosion")) -> Any:
    """Loss and gradient norm of recorded runs, one panel per run, shared log scale.

    Example:
        >>> from trainopt.diagnostics.plots import runs_figure
        >>> fig = runs_figure(faults=("healthy",))
        >>> len(fig.axes)
        2
    """
    import matplotlib.pyplot as plt

    from trainopt.diagnostics.records import load_records

    runs_dir = path("runs") if runs_dir is None else runs_dir
    fig, axes = plt.subplots(2, len(faults), figsize=(2.6 * len(faults), 4.2), sharex=True, squeeze=False)
    for column, fault in enumerate(faults):
        records = load_records(Path(runs_dir) / f"{fault}.jsonl")
        steps = [r["step"] for r in records]
        for row, key in enumerate(("loss", "grad_norm")):
            ax = axes[row][column]
            ax.plot(steps, [r[key] for r in records], lw=0.8, color="C0" if row == 0 else "C1")
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(fault.replace("_", " "), fontsize=9)
            else:
                ax.set_xlabel("step")
            if column == 0:
                ax.set_ylabel(key.replace("_", " "))
    fig.tight_layout()
    return fig
