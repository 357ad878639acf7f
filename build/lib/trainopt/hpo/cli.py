"""The tuning command line: tune the objective a config names, on one machine or many.

``python -m trainopt.hpo CONFIG [--n-trials N] [--storage URL]``. The config names your
objective (``objective: my_train:objective``) or, without one, tunes the digits example (see
:mod:`trainopt.hpo.config`). With ``--n-trials`` the command creates the study (or tops it up
to ``N`` trials in all) and works on it; ``--create-only`` stops after that. Without
``--n-trials`` it is one more worker on an existing study: start as many as you like, on any
machine that reaches the storage. It shows a progress bar, prints the best trial (or the Pareto
front) and writes the plots.

Every check runs before any database file is created and before the first trial: a mistake in
the config or the arguments, or a config that doesn't match the stored study (directions, space),
prints one line, ``error: <field>: <what is allowed>``, and exits with status 2. On a cluster,
``--device auto`` and ``--timeout`` pin and bound a worker, and SIGTERM returns its running
trial to the queue (see :mod:`trainopt.hpo.cluster`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy

from trainopt.config.cli import ArgumentParser, UsageError, positive_int
from trainopt.config.errors import ConfigError
from trainopt.hpo.cluster import (
    SIGTERM_STATUS,
    Terminated,
    leave_on_sigterm,
    resolve_device,
    worker_id,
)
from trainopt.hpo.config import HPOConfig, load_hpo_config
from trainopt.hpo.space import check_space_unchanged
from trainopt.hpo.storage import open_storage
from trainopt.hpo.study import best_trials_text, create_study, make_sampler
from trainopt.hpo.workers import Objective, run_worker


def positive_seconds(text: str) -> float:
    """An argparse ``type`` for ``--timeout``: a finite number of seconds above 0.

    Example:
        >>> from trainopt.hpo.cli import positive_seconds
        >>> positive_seconds("90"), positive_seconds("0.5")
        (90.0, 0.5)
    """
    import argparse

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def build_parser() -> ArgumentParser:
    """The command line's argument parser.

    Example:
        >>> from trainopt.hpo.cli import build_parser
        >>> args = build_parser().parse_args(["tune.yaml", "--n-trials", "8", "--storage",
        ...                                   "journal:tune.log"])
        >>> args.n_trials, args.storage, args.create_only
        (8, 'journal:tune.log', False)
    """
    parser = ArgumentParser(prog="python -m trainopt.hpo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "config", help="tuning config (YAML); `python -m trainopt.data hpo_digits.yaml` prints one"
    )
    parser.add_argument(
        "--n-trials",
        type=positive_int,
        help="create the study, or top it up, to N trials in "
        "all; leave out to join an existing study as a worker",
    )
    parser.add_argument(
        "--storage",
        help="sqlite:///study.db (default: <study-name>.db), "
        "postgresql+psycopg2://..., or journal:study.log",
    )
    parser.add_argument("--study-name", help="study name (default: study.name of the config)")
    parser.add_argument("--create-only", action="store_true", help="create the study, run no trial")
    parser.add_argument(
        "--plots", type=Path, help="directory for the PNG plots (default: <study-name>-plots)"
    )
    parser.add_argument(
        "--no-plots", action="store_true", help="write no plots (e.g. in all workers but one)"
    )
    parser.add_argument(
        "--device",
        help="cpu, cuda, cuda:N, or auto: cuda:<LOCAL_RANK> where CUDA is available, "
        "else cpu. The digits example trains there (default: cuda if available); "
        "for your objective a CUDA device becomes the current one",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        help="seconds after which this worker claims no new trial; the running one finishes",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--allow-space-change",
        action="store_true",
        help="go on when the config's search space differs from the one the stored study's "
        "trials were drawn from (a range, a step, an added or dropped parameter); without "
        "it that is refused before any trial. Another type can't be mixed in one study",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m trainopt.hpo``; returns the exit status.

    Example:
        >>> from pathlib import Path
        >>> from trainopt.hpo.cli import main
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> yaml_text = "search_space:\\n  lr: {type: float, low: 1.0e-4, high: 1.0e-1}\\n"
        >>> _ = (folder / "tune.yaml").write_text(yaml_text)
        >>> main([str(folder / "tune.yaml"), "--n-trials", "4", "--storage", f"sqlite:///{folder}/tune.db",
        ...       "--create-only"])
        study tune: 4 trials, 0 complete, 0 pruned, 0 fail
        no trial completed
        0
    """
    args = build_parser().parse_args(argv)
    config = load_hpo_config(args.config)
    if args.create_only and args.n_trials is None:
        raise UsageError("--create-only", "needs --n-trials N, the number of trials to create")
    if args.study_name is not None and not args.study_name.strip():
        raise UsageError("--study-name", "must be a non-empty name")
    name = args.study_name or config.name
    plots = _plots_folder(args, name)
    device = _device(args.device, config)
    url = args.storage or f"sqlite:///{name}.db"
    storage, found = _stored(url, name, config, args.allow_space_change)
    if not found and args.n_trials is None:
        raise UsageError(
            "--study-name", f"no study {name!r} in {_shown(url)}: create it with --n-trials N"
        )
    storage = storage or _open(url, config.heartbeat)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.n_trials is not None:
        study = create_study(
            name,
            args.n_trials,
            storage,
            directions=config.directions,
            sampler=config.sampler,
            pruner=config.make_pruner(),
            seed=config.seed,
            space=config.space,
            allow_space_change=args.allow_space_change,
        )
    else:
        study = optuna.load_study(
            study_name=name,
            storage=storage,
            pruner=config.make_pruner(),
            sampler=make_sampler(config.sampler, config.seed, config.space),
        )
    if not args.create_only:
        objective = _checked(config.make_objective(_digits_device(device, config)), config, device)
        start = time.monotonic()
        try:
            with leave_on_sigterm() as running:
                run_worker(
                    study,
                    config.space,
                    running.track(objective),
                    show_progress_bar=not args.no_progress,
                    reseed=args.n_trials is None,
                    timeout=args.timeout,
                    allow_space_change=args.allow_space_change,
                )
        except Terminated as stopped:
            # the worker queued the trial again (as for Ctrl-C); a requeued job or another worker
            # runs it
            where = (
                "between trials" if stopped.trial is None else f"trial {stopped.trial} queued again"
            )
            print(f"stopped by SIGTERM: {where}", file=sys.stderr)
            return SIGTERM_STATUS
        except _WrongValues as wrong:
            raise wrong.error from None  # its trial is queued again: no slot is lost
        except KeyboardInterrupt:  # Ctrl-C: run_worker queued the trial it stopped again
            print(
                "interrupted: the running trial, if any, is queued again; no slot is lost",
                file=sys.stderr,
            )
            return 130
        if args.timeout is not None and time.monotonic() - start >= args.timeout:
            print(f"--timeout: this worker claimed no trial after {args.timeout:g} s")
    print(best_trials_text(study))
    if not args.create_only and plots is not None:
        from trainopt.hpo.plots import save_plots

        for path in save_plots(study, plots):
            print(f"wrote {path}")
    return 0


def _plots_folder(args: Any, name: str) -> Path | None:
    """Where the plots go (``None``: nowhere); a file in the way is a mistake, found before any
    trial."""
    if args.no_plots:
        if args.plots is not None:
            raise UsageError("--no-plots", "can't be combined with --plots; give one of them")
        return None
    folder = args.plots or Path(f"{name}-plots")
    if folder.exists() and not folder.is_dir():
        raise UsageError("--plots", f"{folder} is a file; give a folder (it is created if missing)")
    return folder


def _device(text: str | None, config: HPOConfig) -> str | None:
    """``--device`` checked against this machine: a typo or a missing GPU fails before anything
    runs."""
    if text is None:
        return None
    try:
        device = resolve_device(text)
    except ValueError as exc:
        raise UsageError("--device", str(exc)) from None
    if config.objective is not None and text == "cpu":
        raise UsageError(
            "--device",
            "cpu is for the digits example; your objective picks its own device "
            "(cuda:N or auto make a CUDA device its current one)",
        )
    return device


def _digits_device(device: str | None, config: HPOConfig) -> str | None:
    """The device the digits example trains on; for your objective, make a CUDA device the current
    one."""
    if config.objective is None:
        return device
    if device is not None and device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(torch.device(device))
    return None


class _WrongValues(SystemExit):
    """Your objective returned another number of values than the study has directions.

    An interrupt, not an ``Exception``: Optuna doesn't record the trial as FAIL, and the worker
    queues it again, so the mistake costs no slot of the budget.
    """

    def __init__(self, error: UsageError) -> None:
        super().__init__(2)
        self.error = error


def _checked(objective: Objective, config: HPOConfig, device: str | None) -> Objective:
    """``objective`` that records the worker and device on each trial and checks its number of
    values."""
    worker = worker_id()

    def run(trial: optuna.Trial, params: dict[str, Any]) -> Any:
        for key, value in (("worker_id", worker), ("device", device)):
            if value is not None:
                trial.set_user_attr(key, value)
        result = objective(trial, params)
        count = len(result) if isinstance(result, (list, tuple)) else 1
        if count != len(config.directions or ()):
            field = "study.directions" if config.objective is not None else "study.objectives"
            raise _WrongValues(
                UsageError(
                    field,
                    f"has {len(config.directions or ())} directions, but "
                    f"{config.objective or 'the objective'} returned {count} "
                    f"value{'s' if count != 1 else ''}",
                )
            )
        return result

    return run


def _stored(
    url: str, name: str, config: HPOConfig, allow_space_change: bool = False
) -> tuple[optuna.storages.BaseStorage | None, bool]:
    """The storage at ``url`` (``None`` if not opened) and whether it holds the study ``name``.

    A stored study is checked against ``config``. Nothing is created here: an SQLite or journal
    file that doesn't exist holds no study, and is not opened.
    """
    if url == ":memory:":
        return None, False
    if url.startswith("journal:") or (url.endswith(".log") and "://" not in url):
        if not Path(url.removeprefix("journal:")).exists():
            return None, False
    elif url.startswith("sqlite:"):
        try:
            database = sqlalchemy.engine.make_url(url).database
        except sqlalchemy.exc.ArgumentError as exc:
            raise UsageError("--storage", f"is not a valid URL ({exc})") from None
        if not database or database == ":memory:" or not Path(database).exists():
            return None, False
    storage = _open(url, config.heartbeat)
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return storage, False
    stored = tuple(d.name.lower() for d in storage.get_study_directions(study_id))
    if stored != config.directions:
        field = "study.directions" if config.objective is not None else "study.objectives"
        raise UsageError(
            field,
            f"must match the stored study {name!r} in {_shown(url)}, which has directions "
            f"{list(stored)}; got {list(config.directions or ())} (give another "
            f"--study-name for a new study)",
        )
    check_space_unchanged(
        config.space,
        storage.get_all_trials(study_id, deepcopy=False),
        name,
        allow_change=allow_space_change,
        opt_in="pass --allow-space-change",
    )
    return storage, True


def _open(url: str, heartbeat: int | None) -> optuna.storages.BaseStorage:
    """:func:`open_storage`, with what can go wrong reported against ``--storage``."""
    try:
        return open_storage(url, heartbeat)
    except ConfigError as exc:
        raise UsageError("--storage", str(exc).removeprefix(f"{exc.field}: ")) from None
    except ImportError as exc:
        raise UsageError(
            "--storage",
            f"{_shown(url)} needs a database driver ({exc}); for PostgreSQL, "
            "pip install psycopg2-binary and write postgresql+psycopg2://",
        ) from None
    except sqlalchemy.exc.SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise UsageError("--storage", f"cannot open {_shown(url)}: {reason}") from None


def _shown(url: str) -> str:
    """``url`` with its password hidden, to print."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url
