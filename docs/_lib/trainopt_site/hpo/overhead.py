"""What a trainopt study costs per trial, against plain Optuna: the hyperparameter page's evidence.

``python -m trainopt_site.hpo.overhead`` measures it, from a clone in its development
environment.
Both sides run the same trivial objective (one float suggested, and returned) with the same
sampler (random: it reads no trials), so that what is timed is the framework: claiming a trial,
recording its parameter and its value, and for trainopt its budget, heartbeat and worker
attribute as well. Plain Optuna is ``optuna.create_study(storage=url).optimize(objective,
n_trials=N)``; trainopt is :func:`~trainopt.hpo.create_study` then
:func:`~trainopt.hpo.run_worker`. The per-trial time is the wall time between the first and
the last trial's completion, over ``N - 1``, the median of a few repeats (the two sides
alternate, so a busy machine slows both). The "flat" column compares the last tenth of the
trials with the first: a claim that read every trial left to run would grow with ``N``.

The results file has the shape of the benchmark results (``schema``, ``kind``, ``meta``):
``python -m trainopt_site.hpo.overhead --trials 200 1000 --out docs/_data/hpo_overhead_cpu.json``
writes the file the page's table renders (:func:`render_overhead`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path
from typing import Any

import optuna

from trainopt.config.provenance import git_state
from trainopt.hpo.space import SearchSpace
from trainopt.hpo.storage import open_storage
from trainopt.hpo.study import create_study
from trainopt.hpo.workers import run_worker

SCHEMA = 2
KIND = "hpo_overhead"
SPACE = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})


def _per_trial(study: optuna.Study, url: str) -> tuple[float, float, float]:
    """Seconds per trial over the whole run, its first tenth and its last tenth (from completion
    times); then the study is deleted."""
    done = sorted(
        t.datetime_complete.timestamp()
        for t in study.get_trials(deepcopy=False)
        if t.datetime_complete is not None
    )
    optuna.delete_study(study_name=study.study_name, storage=open_storage(url, heartbeat=None))
    tenth = max(2, len(done) // 10)

    def rate(times: list[float]) -> float:
        return (times[-1] - times[0]) / (len(times) - 1)

    return rate(done), rate(done[:tenth]), rate(done[-tenth:])


def run_plain(url: str, n_trials: int) -> tuple[float, float, float]:
    """Plain Optuna's seconds per trial (all, first tenth, last tenth) on a new study at ``url``.

    Example:
        >>> import tempfile
        >>> from trainopt_site.hpo.overhead import run_plain
        >>> all(seconds > 0 for seconds in run_plain(f"sqlite:///{tempfile.mkdtemp()}/p.db", 4))
        True
    """
    study = optuna.create_study(
        study_name=f"plain-{uuid.uuid4().hex[:8]}",
        storage=url,
        sampler=optuna.samplers.RandomSampler(seed=0),
    )
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=n_trials)
    return _per_trial(study, url)


def run_trainopt(url: str, n_trials: int) -> tuple[float, float, float]:
    """trainopt's seconds per trial (all, first tenth, last tenth) on a new study at ``url``.

    Example:
        >>> import tempfile
        >>> from trainopt_site.hpo.overhead import run_trainopt
        >>> all(seconds > 0 for seconds in run_trainopt(f"sqlite:///{tempfile.mkdtemp()}/t.db", 4))
        True
    """
    study = create_study(
        f"trainopt-{uuid.uuid4().hex[:8]}",
        n_trials,
        open_storage(url, heartbeat=60),
        sampler="random",
        pruner=None,
        seed=0,
    )
    run_worker(study, SPACE, lambda trial, params: params["x"])
    return _per_trial(study, url)


def measure(url: str, n_trials: int, repeats: int = 3) -> dict[str, Any]:
    """One row of the table: both sides at ``n_trials`` trials on the storage ``url``, ``repeats``
    times.

    Example:
        >>> import tempfile
        >>> from trainopt_site.hpo.overhead import measure
        >>> row = measure(f"sqlite:///{tempfile.mkdtemp()}/o.db", 12, repeats=1)
        >>> row["n_trials"], row["plain_s"] > 0, row["ratio"] == row["trainopt_s"] / row["plain_s"]
        (12, True, True)
    """
    plain, mine = [], []
    for repeat in range(repeats):  # alternate which side goes first
        for side in ((run_plain, plain), (run_trainopt, mine))[:: 1 if repeat % 2 == 0 else -1]:
            fresh = url  # an SQLite file per run, as a user's study has: no pages of earlier runs
            if url.startswith("sqlite:///") and url.endswith(".db"):
                fresh = f"{url[:-3]}-{uuid.uuid4().hex[:8]}.db"
            side[1].append(side[0](fresh, n_trials))
    row: dict[str, Any] = {"n_trials": n_trials, "repeats": repeats}
    for name, runs in (("plain", plain), ("trainopt", mine)):
        row[f"{name}_s"] = statistics.median(r[0] for r in runs)
        row[f"{name}_flat"] = statistics.median(r[2] / r[1] for r in runs)
        row[f"{name}_runs_s"] = [r[0] for r in runs]
    row["ratio"] = row["trainopt_s"] / row["plain_s"]
    return row


def _meta(command: str, note: str | None, settings: dict[str, Any]) -> dict[str, Any]:
    """The ``meta`` of the benchmark results files (see
    ``trainopt.perf.bench.results.environment``)."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **git_state(),
        "command": command,
        "note": note,
        "device": "cpu",
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "optuna": version("optuna"),
        "sqlalchemy": version("sqlalchemy"),
        "settings": settings,
    }


def run(
    sizes: Sequence[int],
    storages: dict[str, str],
    repeats: int = 3,
    command: str = "",
    note: str | None = None,
) -> dict[str, Any]:
    """The results document: a row per storage and number of trials.

    Example:
        >>> import tempfile
        >>> from trainopt_site.hpo.overhead import run
        >>> results = run([8], {"sqlite": f"sqlite:///{tempfile.mkdtemp()}/o.db"}, repeats=1)
        >>> results["kind"], [(r["storage"], r["n_trials"]) for r in results["rows"]]
        ('hpo_overhead', [('sqlite', 8)])
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.perf_counter()
    rows = [
        {"storage": kind, **measure(url, n, repeats)}
        for kind, url in storages.items()
        for n in sizes
    ]
    meta = _meta(
        command,
        note,
        {
            "sizes": list(sizes),
            "repeats": repeats,
            "storages": sorted(storages),
            "sampler": "random",
            "heartbeat_s": 60,
        },
    )
    meta["elapsed_s"] = time.perf_counter() - start
    return {"schema": SCHEMA, "kind": KIND, "meta": meta, "rows": rows}


def render_overhead(source: str | os.PathLike | dict[str, Any]) -> str:
    """The page's table (MyST Markdown) of a results file; one line naming the command if there is
    none.

    Example:
        >>> from trainopt_site.hpo.overhead import render_overhead
        >>> meta = {"date": "2026-11-27T10:00:00+00:00", "git_commit": "0123456789abcdef",
        ...         "git_dirty": False, "cpu_count": 2, "optuna": "5.0.0", "note": None}
        >>> row = {"storage": "sqlite", "n_trials": 200, "plain_s": 0.008, "trainopt_s": 0.0088,
        ...        "ratio": 1.1, "plain_flat": 1.0, "trainopt_flat": 1.02}
        >>> lines = render_overhead({"schema": 2, "kind": "hpo_overhead", "meta": meta,
        ...                          "rows": [row]}).splitlines()
        >>> lines[0].split(" | ")[2:]
        ['plain Optuna (ms/trial)', 'trainopt (ms/trial)', 'ratio', 'flat (last/first tenth) |']
        >>> lines[2]
        '| sqlite | 200 | 8.0 | 8.8 | 1.10× | 1.00 / 1.02 |'
        >>> lines[3:]
        ['', '*2 CPU cores, Optuna 5.0.0, 2026-11-27, commit `0123456789`.*']
    """
    if isinstance(source, dict):
        results = source
    else:
        path = Path(source)
        if not path.exists():
            return (
                "*No results yet: "
                f"`python -m trainopt_site.hpo.overhead --out {path.name}` writes them.*"
            )
        results = json.loads(path.read_text())
    if results.get("schema") != SCHEMA or results.get("kind") != KIND:
        raise ValueError(f"not a results file of kind {KIND!r}, schema {SCHEMA}")
    lines = [
        "| storage | trials | plain Optuna (ms/trial) | trainopt (ms/trial) | ratio "
        "| flat (last/first tenth) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results["rows"]:
        lines.append(
            f"| {r['storage']} | {r['n_trials']:,} | {r['plain_s'] * 1e3:.1f} "
            f"| {r['trainopt_s'] * 1e3:.1f} "
            f"| {r['ratio']:.2f}× | {r['plain_flat']:.2f} / {r['trainopt_flat']:.2f} |"
        )
    meta = results["meta"]
    dirty = " with uncommitted changes" if meta.get("git_dirty") else ""
    note = f"; {meta['note']}" if meta.get("note") else ""
    lines += [
        "",
        f"*{meta['cpu_count']} CPU cores, Optuna {meta['optuna']}, {meta['date'][:10]}, "
        f"commit `{(meta.get('git_commit') or 'unknown')[:10]}`{dirty}{note}.*",
    ]
    return "\n".join(lines)


def _postgres_url(text: str) -> str | None:
    """An argparse ``type``: a ``postgresql://`` or ``postgresql+<driver>://`` URL, checked before
    measuring; an empty value measures SQLite only (whatever ``$TRAINOPT_POSTGRES_URL`` says)."""
    if text == "":
        return None
    if not re.match(r"^postgresql(\+\w+)?://", text):
        raise argparse.ArgumentTypeError(
            f"must be a postgresql:// or postgresql+<driver>:// URL, or empty "
            f"for SQLite only, got {text!r}"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    """The command line.

    Example:
        >>> from trainopt_site.hpo.overhead import build_parser
        >>> args = build_parser().parse_args(["--postgres", "", "--out", "o.json"])
        >>> args.trials, args.repeats, args.postgres
        ([200, 1000], 3, None)
    """
    from trainopt.config.cli import ArgumentParser, output_file, output_folder, positive_int

    parser = ArgumentParser(
        prog="python -m trainopt_site.hpo.overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--trials",
        type=positive_int,
        nargs="+",
        default=[200, 1000],
        help="study sizes in trials (default 200 1000)",
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="runs of each side per size (median)"
    )
    parser.add_argument(
        "--dir",
        type=output_folder,
        help="folder of the SQLite files (default: a new temporary one)",
    )
    parser.add_argument(
        "--postgres",
        type=_postgres_url,
        help="a PostgreSQL URL to measure too (default: $TRAINOPT_POSTGRES_URL; "
        "empty: SQLite only)",
        default=os.environ.get("TRAINOPT_POSTGRES_URL") or None,
    )
    parser.add_argument("--note", help="recorded with the results")
    parser.add_argument("--out", type=output_file, required=True, help="results JSON file to write")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, write the results file, print the table; returns the exit status.

    Example:
        >>> import contextlib, io, json, tempfile
        >>> from pathlib import Path
        >>> from trainopt_site.hpo.overhead import main
        >>> out = Path(tempfile.mkdtemp()) / "overhead.json"
        >>> with contextlib.redirect_stdout(io.StringIO()) as printed:
        ...     code = main(["--trials", "6", "--repeats", "1", "--postgres", "",
        ...                  "--out", str(out)])
        >>> code, "| sqlite | 6 |" in printed.getvalue(), json.loads(out.read_text())["kind"]
        (0, True, 'hpo_overhead')
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="trainopt-overhead-"))
    folder.mkdir(parents=True, exist_ok=True)
    storages = {"sqlite": f"sqlite:///{folder / 'overhead.db'}"}
    if args.postgres:
        storages["postgresql"] = args.postgres
    results = run(
        args.trials,
        storages,
        args.repeats,
        shlex.join(["python", "-m", "trainopt_site.hpo.overhead", *argv]),
        args.note,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, allow_nan=False) + "\n")
    os.replace(tmp, args.out)
    print(render_overhead(results))
    return 0


if __name__ == "__main__":
    from trainopt.config.cli import run_command

    sys.exit(run_command(main))
