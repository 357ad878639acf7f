"""The stability page's classifier tables, from what ``python -m trainopt_site.stability.corpus``
wrote.

Healthy runs by family (runs, rolled back, the most steps skipped in a run, aborted) and faulty
runs by fault and onset step (runs, caught, missed), with the false-positive and miss rates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainopt_site.stability.corpus import HEALTHY, RISING

__all__ = ["classifier", "family", "render"]

_KIND_NAMES = {
    "labels": "a batch with every label wrong",
    "raw_inputs": "a batch of raw pixels (not standardised)",
    "inputs_x100": "a batch of inputs ×100",
    "shuffled_labels": "a batch with its labels shuffled",
    "nan_loss": "a NaN loss",
    "nan_gradient": "a NaN gradient",
    "lr_x10": "learning rate ×10",
    "lr_x30": "learning rate ×30",
    "lr_x100": "learning rate ×100",
}


_FAMILIES = {
    "vae": "VAE, KL weight warmed up from 0 to 1",
    "curriculum": "sequence-length curriculum (8 to 32)",
    "mixture": "data-mixture switch at step 250",
    "plateau": "loss on a plateau (SGD)",
    "policy": "policy-gradient loss (negative)",
    "stdlib": "language model, standard-library sources",
    "language": "GPT language model, generated text",
}
_RUNS = {run.name: run for run in (*HEALTHY, *RISING)}


def family(name: str) -> str:
    """The family of a healthy run, by its name: the rows of the page's healthy table.

    Example:
        >>> from trainopt_site.stability.corpus import HEALTHY
        >>> from trainopt_site.stability.corpus_table import family
        >>> family(HEALTHY[0].name), family(HEALTHY[-1].name)
        ('digits MLP, AdamW', 'digits MLP, fine-tune with warm-up and decay')
    """
    run = _RUNS.get(name)
    if run is None:
        return name.split()[0]
    if run.pretrain:
        return "digits MLP, fine-tune with warm-up and decay"
    if run.task == "digits":
        return f"digits MLP, {'AdamW' if run.optimizer == 'adamw' else 'SGD'}"
    return _FAMILIES[run.task]


def classifier(results: dict[str, Any]) -> dict[str, Any]:
    """The page's classifier tables: healthy runs by family, faulty runs by fault and onset step.

    A healthy row counts its runs, the runs rolled back, the largest share of a run's steps
    skipped, and the runs that ended in an error (aborted). A faulty row counts its runs, those
    caught (the bad batch's step skipped, or the runaway learning rate rolled back) and those
    missed.

    Example:
        >>> from trainopt_site.stability.corpus_table import classifier
        >>> rows = [{"kind": "healthy", "run": "a b", "skipped": 1, "steps": 200, "rollbacks": 0,
        ...          "error": None},
        ...         {"kind": "faulty", "fault": "labels", "fault_at": 60, "caught": False},
        ...         {"kind": "faulty", "fault": "labels", "fault_at": 60, "caught": True}]
        >>> table = classifier({"rows": rows})
        >>> table["healthy"][0]["max_skipped_percent"], table["faulty"][0]["missed"]
        (0.5, 1)
        >>> table["totals"]["miss_rate"]
        0.5
    """
    families: dict[str, list[dict[str, Any]]] = {}
    faults: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in results["rows"]:
        if row["kind"] == "healthy":
            families.setdefault(family(row["run"]), []).append(row)
        else:
            faults.setdefault((row["fault"], row["fault_at"]), []).append(row)
    healthy = [
        {
            "family": name,
            "runs": len(rows),
            "rollbacks": sum(bool(r["rollbacks"]) for r in rows),
            "max_skipped_percent": max(100 * r["skipped"] / max(r["steps"], 1) for r in rows),
            "aborts": sum(bool(r["error"]) for r in rows),
        }
        for name, rows in families.items()
    ]
    order = list(_KIND_NAMES)
    keys = sorted(faults, key=lambda key: (order.index(key[0]), key[1]))
    faulty = [
        {
            "fault": fault,
            "at": at,
            "runs": len(faults[fault, at]),
            "caught": sum(bool(r["caught"]) for r in faults[fault, at]),
            "missed": sum(not r["caught"] for r in faults[fault, at]),
        }
        for fault, at in keys
    ]
    healthy_rows = [r for rows in families.values() for r in rows]
    flagged = sum(bool(r["rollbacks"] or r["error"]) for r in healthy_rows)
    skipped, steps = sum(r["skipped"] for r in healthy_rows), sum(r["steps"] for r in healthy_rows)
    runs, missed = sum(r["runs"] for r in faulty), sum(r["missed"] for r in faulty)
    totals = {
        "healthy_runs": len(healthy_rows),
        "false_positive_runs": flagged,
        "false_positive_rate": flagged / max(len(healthy_rows), 1),
        "skipped": skipped,
        "steps": steps,
        "faulty_runs": runs,
        "missed": missed,
        "miss_rate": missed / max(runs, 1),
    }
    return {"healthy": healthy, "faulty": faulty, "totals": totals}


def render(source: str | Path) -> str:
    """The page's classifier tables of a results file from
    ``python -m trainopt_site.stability.corpus``.

    Example:
        >>> from trainopt_site.stability.corpus_table import render
        >>> print(render("none.json"))
        *No results yet: `python -m trainopt_site.stability.corpus --out none.json` writes them.*
    """
    source = Path(source)
    if not source.exists():
        return (
            f"*No results yet: `python -m trainopt_site.stability.corpus --out {source.name}` "
            "writes them.*"
        )
    results = json.loads(source.read_text())
    table = classifier(results)
    totals = table["totals"]
    lines = [
        "| healthy family | runs | rolled back | steps skipped (most in a run) | aborted |",
        "| --- | --: | --: | --: | --: |",
    ]
    lines += [
        f"| {r['family']} | {r['runs']} | {r['rollbacks']} "
        f"| {r['max_skipped_percent']:.2f} % | {r['aborts']} |"
        for r in table["healthy"]
    ]
    most = max((r["max_skipped_percent"] for r in table["healthy"]), default=0.0)
    lines += [
        f"| **all healthy runs** | {totals['healthy_runs']} | "
        f"{sum(r['rollbacks'] for r in table['healthy'])} | {most:.2f} % | "
        f"{sum(r['aborts'] for r in table['healthy'])} |",
        "",
        f"False-positive rate: {totals['false_positive_runs']} of {totals['healthy_runs']} "
        f"healthy runs rolled back or aborted ({100 * totals['false_positive_rate']:.1f} %); "
        f"{totals['skipped']} of {totals['steps']:,} healthy steps skipped "
        f"({100 * totals['skipped'] / max(totals['steps'], 1):.3f} %).",
        "",
        "| fault | at step | runs | caught | missed |",
        "| --- | --: | --: | --: | --: |",
    ]
    for r in table["faulty"]:
        at = f"from {r['at']}" if r["fault"].startswith("lr_x") else str(r["at"])
        lines.append(
            f"| {_KIND_NAMES[r['fault']]} | {at} | {r['runs']} | {r['caught']} | {r['missed']} |"
        )
    caught = totals["faulty_runs"] - totals["missed"]
    lines += [
        f"| **all faulty runs** | | {totals['faulty_runs']} | {caught} | {totals['missed']} |",
        "",
        f"Miss rate: {totals['missed']} of {totals['faulty_runs']} faulty runs "
        f"({100 * totals['miss_rate']:.1f} %). A bad batch is caught when its step is "
        "skipped; a learning rate too high, when a rollback answers it. Steps count from 0.",
    ]
    made = results.get("made", {})
    lines += [
        "",
        f"*{results['healthy_within_noise']} of {results['healthy_runs']} healthy runs "
        "end within the spread of plain torch over runs with random state "
        f"{results['seeds']}. "
        "Written by "
        f"`python -m trainopt_site.stability.corpus` with torch {made.get('torch', '?')} on "
        f"{made.get('machine', '?')}, {made.get('date', '?')}, "
        f"commit {made.get('git_commit', '?')}"
        f"{' (uncommitted changes)' if made.get('git_dirty') else ''}.*",
    ]
    return "\n".join(lines)
