"""A plain-text summary of a benchmark results file: what ``python -m trainopt.perf.bench`` prints.

:func:`summary` reads a results file (:func:`~trainopt.perf.bench.results.read_results`) of any
kind and returns a few aligned lines for a terminal: the machine, then one line per measured
configuration with its headline numbers. It prints numbers that are in the file and computes
none, like the pages' tables; the file itself holds everything else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from trainopt.perf.bench.results import Results, hardware, read_results


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _mib(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:,.1f} MiB"


def _percent(fraction: float | None, sign: str = "", digits: int = 1) -> str:
    return "-" if fraction is None else f"{fraction * 100:{sign}.{digits}f}%"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells, each column padded to its widest cell, two spaces apart.

    A short row's last cell (a failure's message) runs on without widening the columns.
    """
    n = max(map(len, rows))
    widths = [
        max((len(row[i]) for row in rows if i < len(row) - 1 or len(row) == n), default=0)
        for i in range(n)
    ]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows
    ]


def _failed(record: dict[str, Any]) -> str:
    return (
        f"{record.get('status', 'failed')}: {' '.join(str(record.get('error', '')).split())[:100]}"
    )


def _bench(results: Results) -> list[str]:
    rows = [["configuration", "median step", "tokens/s", "MFU", "peak memory"]]
    for r in results["results"]:
        if r["status"] != "ok":
            rows.append([r["name"], _failed(r)])
            continue
        rows.append(
            [
                r["name"],
                _ms(r["step_time_s"]["median"]),
                f"{r['tokens_per_s']:,.0f}",
                _percent(r.get("mfu")),
                _mib(r.get("peak_memory_bytes")),
            ]
        )
    lines = _columns(rows)
    recipe = results.get("recipe")
    if recipe and recipe.get("speedup") is not None:
        lines.append(
            f"speed-up of {recipe['candidate']} over {recipe['baseline']}: {recipe['speedup']:.2f}x"
        )
    return lines


def _stability(results: Results) -> list[str]:
    if "forms" not in results:
        return ["  (these results predate the per-optimizer-form benchmark)"]
    rows = [
        ["optimizer form", "bare", "stabilized", "ratio [interval]", "host reads, bare/stabilized"]
    ]
    for f in results["forms"]:
        if f["status"] != "ok":
            rows.append([f["form"], _failed(f)])
            continue
        ms, r, reads = f["ms_per_step"], f["ratio"], f["host_reads"]
        rows.append(
            [
                f["form"],
                f"{ms['bare']:.2f} ms",
                f"{ms['stabilized']:.2f} ms",
                f"{r['ratio']:.3f} [{r['low']:.3f}-{r['high']:.3f}]",
                f"{reads['bare']['per_step']:g}/{reads['stabilized']['per_step']:g} per step",
            ]
        )
    return _columns(rows) + [f"goal: a ratio of at most {results['goal_ratio']:.3f}"]


def _experiments(results: Results) -> list[str]:
    rows = [["precision", "median step", "tokens/s", "peak memory", "estimate error"]]
    for r in results["precision"]:
        if not r["supported"] or "error" in r:
            rows.append([r["precision"], "not supported" if not r["supported"] else _failed(r)])
            continue
        rows.append(
            [
                r["precision"],
                f"{r['step_time_median_ms']:.1f} ms",
                f"{r['tokens_per_s']:,.0f}",
                _mib(r["peak_memory_bytes"]),
                _percent(r.get("estimate_error"), "+", 2),
            ]
        )
    section = results["checkpointing"]
    checks = [["checkpointing", "step time", "peak memory", "meets the goal"]]
    for r in section["rows"]:
        if "error" in r:
            checks.append([r["policy"], _failed(r)])
            continue
        checks.append(
            [
                r["policy"],
                _percent(r["time_change"], "+"),
                _percent(r["memory_change"], "+"),
                "yes" if r.get("meets_goal") else "no",
            ]
        )
    return (
        _columns(rows) + [f"activation checkpointing in {section['precision']}:"] + _columns(checks)
    )


def _scaling(results: Results) -> list[str]:
    n = str(results["processes"][-1])
    eff = results["efficiency"]
    rows = [["processes", "tokens/s"]] + [
        [k, f"{results['tokens_per_s'][k]:,.0f}"] for k in ("1", n)
    ]
    interval = f"[{_percent(eff['low'])}-{_percent(eff['high'])}]"
    return [
        *_columns(rows),
        f"scaling efficiency with {n} processes: {_percent(eff['ratio'])} {interval}",
    ]


def _compile(results: Results) -> list[str]:
    rows = [
        ["variant", "first step", "median step", "speed-up", "break-even steps", "graph breaks"]
    ]
    for r in results["rows"]:
        rows.append(
            [
                r["mode"],
                "-" if r["compile_s"] is None else f"{r['compile_s']:.1f} s",
                _ms(r["step_s"]["median"]),
                f"{r['speedup']:.2f}x",
                "-" if r["break_even_steps"] is None else f"{r['break_even_steps']:,.0f}",
                str(r["graph_breaks"]),
            ]
        )
    return _columns(rows)


def _estimate(results: Results) -> list[str]:
    rows = [["family", "precision", "optimizer", "checkpointing", "estimate", "measured", "error"]]
    rows += [
        [
            r["family"],
            r["precision"],
            r["optimizer"],
            "blocks" if r["checkpointing"] else "none",
            _mib(r["estimate_bytes"]),
            _mib(r["measured_bytes"]),
            _percent(r["error"], "+", 2),
        ]
        for r in results["rows"]
    ]
    return _columns(rows)


SUMMARIES: dict[str, Callable[[Results], list[str]]] = {
    "bench": _bench,
    "stability": _stability,
    "experiments": _experiments,
    "scaling": _scaling,
    "compile": _compile,
    "estimate": _estimate,
}
"""The summary of each ``kind`` of results file."""


def summary(source: str | os.PathLike | Results) -> str:
    """A few plain-text lines of a results file: its machine, then its headline numbers.

    Args:
        source: A results file (or the loaded results).

    Example:
        >>> from trainopt.perf.bench.results import new_results
        >>> from trainopt.perf.bench.summary import summary
        >>> results = new_results("estimate", "cpu")
        >>> results["rows"] = [{"family": "mlp", "precision": "fp32", "optimizer": "sgd",
        ...                     "checkpointing": False, "estimate_bytes": 3 * 2**20,
        ...                     "measured_bytes": 4 * 2**20, "error": -0.25}]
        >>> print(summary(results).split("\\n", 1)[1], end="")
          family  precision  optimizer  checkpointing  estimate  measured  error
          mlp     fp32       sgd        none           3.0 MiB   4.0 MiB   -25.00%
        >>> summary("no-such-results.json")
        'no results in no-such-results.json\\n'
    """
    results = read_results(source)
    if results is None:
        return f"no results in {os.fspath(source)}\n"
    meta = results["meta"]
    head = (
        f"{results['kind']} results on {hardware(meta)}, torch {meta['torch']}, {meta['date'][:10]}"
    )
    return "\n".join([head, *SUMMARIES[results["kind"]](results)]) + "\n"
