"""``python -m trainopt.diagnostics PATH``: name the likely problem of a run from its log.

``PATH`` is a Hugging Face ``trainer_state.json`` or ``Trainer`` output folder, TensorBoard event
files or their folder, or a CSV or JSON Lines file with named columns
(:func:`trainopt.diagnostics.logs.read_log`). The command prints the file it read (for a folder,
the newest log in it, and which others it holds), the run's settings the log carries, then each
finding (:func:`~trainopt.diagnostics.diagnose`), root cause first, with its cause and fix; or
that it found nothing. It exits 0 either way; a mistake (no such file, a log it can't read, a bad
option) is one line ``error: <field>: <what is allowed>`` and exit status 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainopt.config.cli import ArgumentParser, UsageError, positive_int
from trainopt.diagnostics.symptoms import diagnose


def build_parser() -> ArgumentParser:
    """The argument parser of ``python -m trainopt.diagnostics``.

    Example:
        >>> from trainopt.diagnostics.cli import build_parser
        >>> build_parser().parse_args(["trainer_state.json", "--classes", "10"]).classes
        10
    """
    parser = ArgumentParser(
        prog="python -m trainopt.diagnostics", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "path",
        metavar="PATH",
        help="a trainer_state.json, Trainer output folder, TensorBoard "
        "event file or folder, or a .csv or .jsonl log",
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--classes",
        type=positive_int,
        default=None,
        help="classes of a cross-entropy loss: a fresh model starts near log(classes)",
    )
    start.add_argument(
        "--initial-loss",
        type=float,
        default=None,
        help="the loss a fresh model should start at, for any other loss",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Read the log, print the findings; returns 0.

    Example:
        >>> import contextlib, io, json, tempfile
        >>> from pathlib import Path
        >>> from trainopt.diagnostics.cli import main
        >>> state = Path(tempfile.mkdtemp()) / "trainer_state.json"
        >>> history = [{"step": t, "loss": 2.3 * 0.98**t, "grad_norm": 1.0, "learning_rate": 1e-3}
        ...            for t in range(100)]
        >>> history[60]["grad_norm"] = 50.0
        >>> _ = state.write_text(json.dumps({"log_history": history}))
        >>> with contextlib.redirect_stdout(io.StringIO()) as printed:
        ...     code = main([str(state)])
        >>> lines = printed.getvalue().splitlines()
        >>> code, lines[0].startswith(f"{state}: trainer_state log"), lines[1].split(":")[0]
        (0, True, 'gradient_explosion (from step 60)')
    """
    from trainopt.diagnostics.logs import read_log

    args = build_parser().parse_args(argv)
    if args.initial_loss is not None and not math.isfinite(args.initial_loss):
        raise UsageError("--initial-loss", f"must be a finite number, got {args.initial_loss}")
    if args.classes == 1:
        raise UsageError("--classes", "must be at least 2")
    log = read_log(args.path)
    records = log.records
    columns = [c for c in ("loss", "grad_norm", "lr") if any(c in r for r in records)]
    steps = f"steps {records[0]['step']}-{records[-1]['step']}" if records else "no steps"
    print(
        f"{', '.join(str(f) for f in log.files)}: {log.format} log, {len(records)} records "
        f"({steps}; {', '.join(columns)})"
    )
    if log.others:
        shown = ", ".join(str(f) for f in log.others[-3:])
        print(
            f"  the newest of {len(log.others) + 1} logs in {args.path}; not read: "
            f"{'..., ' if len(log.others) > 3 else ''}{shown}"
        )
    if log.settings:
        print(f"  settings: {', '.join(f'{k}={v:g}' for k, v in log.settings.items())}")
    findings = diagnose(log, classes=args.classes, initial_loss=args.initial_loss)
    for finding in findings:
        print(finding)
    if not findings:
        print("no problem found")
    return 0
