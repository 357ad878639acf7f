"""The tuning command line: tune the objective a config names, on one machine or many.

``python -m trainopt.hpo CONFIG [--n-trials N] [--storage URL]``. The config names your objective (``objective: my_train:objective``) or, without one, tunes the
digits example (see :mod:`trainopt.hpo.config`). With ``--n-trials`` the command creates the
study (or tops it up to ``N`` trials in all) and works on it; ``--create-only`` stops after
that. Without ``--n-trials`` it is one more worker on an existing study: start as many as you
like, on any machine that reaches the storage. It shows a progress bar, prints the best trial
(or the Pareto front) and writes the plots. A mistake in the config or the arguments prints
one line, ``error: <field>: <what is allowed>``, and exits with status 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import optuna
import sqlalchemy

from trainopt.config.cli import ArgumentParser, UsageError, positive_int
from trainopt.config.errors import ConfigError
from trainopt.hpo.config import load_hpo_config
from trainopt.hpo.storage import open_storage
from trainopt.hpo.study import best_trials_text, create_study, make_sampler
from trainopt.hpo.workers import run_worker


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
    parser.add_argument("config", help="tuning config (YAML); `python -m trainopt.data hpo_digits.yaml` prints one")
    parser.add_argument("--n-trials", type=positive_int, help="create the study, or top it up, to N trials in "
                                                              "all; leave out to join an existing study as a worker")
    parser.add_argument("--storage", help="sqlite:///study.db (default: <study-name>.db), "
                                          "postgresql+psycopg2://..., or journal:study.log")
    parser.add_argument("--study-name", help="study name (default: study.name of the config)")
    parser.add_argument("--create-only", action="store_true", help="create the study, run no trial")
    parser.add_argument("--plots", type=Path, help="directory for the PNG plots (default: <study-name>-plots)")
    parser.add_argument("--no-plots", action="store_true", help="write no plots (e.g. in all workers but one)")
    parser.add_argument("--device", help="where the digits example trains (default: cuda if available, else cpu)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
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
    if args.device and config.objective is not None:
        raise UsageError("--device", "is for the digits example; your objective picks its own device")
    name = args.study_name or config.name
    url = args.storage or f"sqlite:///{name}.db"
    storage = _open(url, config.heartbeat)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.n_trials is not None:
        study = create_study(name, args.n_trials, storage, directions=config.directions,
                             sampler=config.sampler, pruner=config.make_pruner(), seed=config.seed,
                             space=config.space)
    else:
        try:
            study = optuna.load_study(study_name=name, storage=storage, pruner=config.make_pruner(),
                                      sampler=make_sampler(config.sampler, config.seed, config.space))
        except KeyError:
            raise UsageError("--study-name",
                             f"no study {name!r} in {_shown(url)}: create it with --n-trials N") from None
    if not args.create_only:
        run_worker(study, config.space, config.make_objective(args.device), show_progress_bar=not args.no_progress,
                   reseed=args.n_trials is None)
    print(best_trials_text(study))
    if not args.create_only and not args.no_plots:
        from trainopt.hpo.plots import save_plots

        for path in save_plots(study, args.plots or Path(f"{name}-plots")):
            print(f"wrote {path}")
    return 0


def _open(url: str, heartbeat: int | None) -> optuna.storages.BaseStorage:
    """:func:`open_storage`, with what can go wrong reported against ``--storage``."""
    try:
        return open_storage(url, heartbeat)
    except ConfigError as exc:
        raise UsageError("--storage", str(exc).removeprefix(f"{exc.field}: ")) from None
    except ImportError as exc:
        raise UsageError("--storage", f"{_shown(url)} needs a database driver ({exc}); for PostgreSQL, "
                                      "pip install psycopg2-binary and write postgresql+psycopg2://") from None
    except sqlalchemy.exc.SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise UsageError("--storage", f"cannot open {_shown(url)}: {reason}") from None


def _shown(url: str) -> str:
    """``url`` with its password hidden, to print."""
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url
