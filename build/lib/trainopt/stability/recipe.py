"""The stability page's complete recipe, as a command that survives being killed.

``python -m trainopt.stability.recipe [--checkpoint-dir DIR] --steps N --check-every K --out FILE``
trains the digits MLP (:mod:`trainopt.models`, with dropout) with the whole stack in one object:
a warm-up and cosine schedule, clipping against the run's own history
(:class:`~trainopt.stability.clipping.norms.ZScoreClipper`), steps skipped on the device when a
batch is far outside the run's range or a value is not finite, a rollback with a halved learning
rate when the run diverges, and a checkpoint every ``K`` steps while it is stable, the position of a
:class:`~trainopt.stability.checkpointing.loader.ResumableDataLoader` included. It resumes from the
newest valid checkpoint in ``DIR`` (default ``checkpoints/recipe``, below the working directory: a
folder that outlives the process) when there is one, and at the end writes the model's
``state_dict`` to ``FILE`` with ``torch.save``.

Run it again with the same arguments after a crash, a ``kill -9`` included, and it continues as
the run it replaced: the final weights are bit for bit those of a run that was never
interrupted (on one thread; the test kills it at random moments, during checkpoint writes too).
Dropout draws random numbers on every step, so a restart that did not restore the generators
would show. ``--faults`` injects a NaN loss, a mislabelled batch and knocked-off weights at fixed
batches, to watch the stack skip two steps and roll back once. On a GPU, a bitwise restart also
needs deterministic kernels: ``--deterministic`` sets ``torch.use_deterministic_algorithms(True)``
and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` before CUDA starts, and turns cuDNN's benchmark off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from trainopt.config.cli import (
    ArgumentParser,
    UsageError,
    output_file,
    output_folder,
    positive_int,
    run_command,
)
from trainopt.models import digits_data, digits_mlp
from trainopt.schedules.adapters import cosine_annealing_schedule
from trainopt.stability.checkpointing.checkpoint import _atomic_write
from trainopt.stability.checkpointing.loader import ResumableDataLoader
from trainopt.stability.clipping.norms import ZScoreClipper
from trainopt.stability.stabilizer import TrainingStabilizer

__all__ = ["build_parser", "build_run", "main", "make_deterministic", "train"]

# Where the command keeps its checkpoints: a folder that survives a restart (not a temporary one).
DEFAULT_CHECKPOINT_DIR = "checkpoints/recipe"

# Faults by batch drawn (the data position moves on through rollbacks and restarts alike).
FAULTS = {25: "nan_loss", 145: "loss_spike", 172: "diverged_weights"}


def make_deterministic() -> None:
    """What a bitwise restart on CUDA needs besides the checkpoint: deterministic kernels.

    Sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (before CUDA starts: cuBLAS reads it once),
    ``torch.use_deterministic_algorithms(True)`` and ``torch.backends.cudnn.benchmark = False``
    (PyTorch's reproducibility notes, https://docs.pytorch.org/docs/stable/notes/randomness.html).

    Example:
        >>> import torch
        >>> from trainopt.stability.recipe import make_deterministic
        >>> make_deterministic()
        >>> enabled = torch.are_deterministic_algorithms_enabled()
        >>> torch.use_deterministic_algorithms(False)  # back to the default for what follows
        >>> enabled
        True
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def build_run(
    checkpoint_dir: str | os.PathLike[str],
    steps: int,
    check_every: int,
    seed: int = 0,
    lr: float = 3e-3,
    batch_size: int = 64,
) -> dict[str, Any]:
    """Everything the recipe trains with, built from scratch (nothing is loaded yet).

    Example:
        >>> import tempfile
        >>> from trainopt.stability.recipe import build_run
        >>> run = build_run(tempfile.mkdtemp(), steps=40, check_every=10)
        >>> sorted(run), run["stabilizer"].check_every
        (['loader', 'stabilizer'], 10)
    """
    x, y, _, _ = digits_data(seed=seed)
    model = digits_mlp(hidden=64, seed=seed, dropout=0.1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=True)
    scheduler = cosine_annealing_schedule(
        optimizer, total_steps=steps, warmup_steps=max(1, steps // 10), min_lr=lr / 10
    )
    loader = ResumableDataLoader(TensorDataset(x, y), batch_size=batch_size, seed=seed)
    stabilizer = TrainingStabilizer(
        model,
        optimizer,
        scheduler,
        checkpoint_dir=checkpoint_dir,
        check_every=check_every,
        clipper=ZScoreClipper(warmup_steps=10),
        data=loader,
    )
    return {"stabilizer": stabilizer, "loader": loader}


def train(
    run: dict[str, Any], steps: int, faults: bool = False, log: Any = None
) -> torch.nn.Module:
    """Resume from the newest checkpoint if any, then train until the stabilizer has made
    ``steps`` steps.

    Example:
        >>> import tempfile
        >>> import torch
        >>> from trainopt.stability.recipe import build_run, train
        >>> folder = tempfile.mkdtemp()
        >>> model = train(build_run(folder, steps=20, check_every=10), steps=20)
        >>> again = train(build_run(folder, steps=20, check_every=10), steps=20)  # resumes at 20
        >>> all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
        True
    """
    stabilizer, loader = run["stabilizer"], run["loader"]
    model = stabilizer.model
    start = stabilizer.resume()
    if log is not None:
        print(f"resumed at step {start}" if start is not None else "started", file=log, flush=True)
    while stabilizer.steps < steps:
        for xb, yb in loader:
            drawn = loader.epoch * len(loader) + loader.consumed
            fault = FAULTS.get(drawn) if faults else None
            if fault == "loss_spike":
                yb = (yb + 1) % 10  # a mislabelled batch
            factor = float("nan") if fault == "nan_loss" else 1.0
            stabilizer.step(lambda: F.cross_entropy(model(xb), yb) * factor)  # noqa: B023 - called at once
            if fault == "diverged_weights":
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn_like(p) * 0.5)
            if (
                log is not None
                and stabilizer.steps % stabilizer.check_every == 0
                and stabilizer.last_report
            ):
                report = stabilizer.last_report
                done = f"rolled back ({report['recovered']})" if report["recovered"] else "checked"
                print(f"step {stabilizer.steps}: batch {drawn}, {done}", file=log, flush=True)
            if stabilizer.steps >= steps:
                break
    return model


def build_parser() -> ArgumentParser:
    """The command line of ``python -m trainopt.stability.recipe``.

    Example:
        >>> from trainopt.stability.recipe import build_parser
        >>> args = build_parser().parse_args(["--steps", "50", "--out", "w.pt"])
        >>> args.steps, args.check_every, args.out.name, args.checkpoint_dir.as_posix()
        (50, 10, 'w.pt', 'checkpoints/recipe')
    """
    parser = ArgumentParser(
        prog="python -m trainopt.stability.recipe", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=output_folder,
        default=DEFAULT_CHECKPOINT_DIR,
        help=f"checkpoints: read to resume, written (default "
        f"{DEFAULT_CHECKPOINT_DIR}: rerun from the same folder to continue)",
    )
    parser.add_argument(
        "--steps", type=positive_int, required=True, help="training steps of the whole run"
    )
    parser.add_argument(
        "--check-every",
        type=positive_int,
        default=10,
        help="steps between boundaries: checks, checkpoints, rollbacks (default 10)",
    )
    parser.add_argument(
        "--out", type=output_file, required=True, help="where to torch.save the final state_dict"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the weights and the data order"
    )
    parser.add_argument(
        "--faults", action="store_true", help="inject a NaN loss, a loss spike, bad weights"
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic kernels, for bitwise restarts on a GPU (CUBLAS_WORKSPACE_CONFIG and "
        "torch.use_deterministic_algorithms)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Train (or finish training), write the final weights; one line per boundary on stdout.

    Example:
        >>> import contextlib, io, tempfile
        >>> from pathlib import Path
        >>> import torch
        >>> from trainopt.stability.recipe import main
        >>> folder = Path(tempfile.mkdtemp())
        >>> with contextlib.redirect_stdout(io.StringIO()) as printed:
        ...     code = main(["--checkpoint-dir", str(folder / "ckpt"), "--steps", "20", "--out",
        ...                  str(folder / "w.pt")])
        >>> code, printed.getvalue().splitlines()[-1], sorted(torch.load(folder / "w.pt"))[:2]
        (0, 'wrote ...w.pt', ['0.bias', '0.weight'])
    """
    args = build_parser().parse_args(argv)
    if args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
        raise UsageError("--checkpoint-dir", f"{args.checkpoint_dir} is a file, not a folder")
    if args.out.is_dir():
        raise UsageError("--out", f"{args.out} is a folder: give a file name")
    blocked = next(
        (parent for parent in args.out.parents if parent.exists() and not parent.is_dir()), None
    )
    if blocked is not None:
        raise UsageError("--out", f"{blocked} is a file, so {args.out} cannot be written below it")
    torch.set_num_threads(1)  # one thread: the same floating-point order on every run
    if args.deterministic:
        make_deterministic()
    run = build_run(args.checkpoint_dir, args.steps, args.check_every, seed=args.seed)
    model = train(run, args.steps, faults=args.faults, log=sys.stdout)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    _atomic_write(args.out, lambda f: torch.save(state, f))
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
