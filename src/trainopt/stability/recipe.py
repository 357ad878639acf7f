"""The stability page's complete recipe, as a command that survives being killed.

``python -m trainopt.stability.recipe --checkpoint-dir DIR --steps N --check-every K --out FILE``
trains the digits MLP (:mod:`trainopt.models`) with the whole stack: a warm-up and cosine
schedule, clipping against the run's own history (:class:`~trainopt.stability.clipping.ZScoreClipper`),
steps skipped on the device when the loss spikes or a gradient is not finite, a rollback with a
halved learning rate when the run diverges, and a checkpoint every ``K`` steps while it is
stable. It resumes from the newest valid checkpoint in ``DIR`` when there is one, and at the end
writes the model's ``state_dict`` to ``FILE`` with ``torch.save``.

Run it again with the same arguments after a crash, a ``kill -9`` included, and it continues as
the run it replaced: the final weights are bit for bit those of a run that was never
interrupted (on one thread; the test kills it at random moments, during checkpoint writes too).
``--faults`` injects a NaN loss, a loss spike and knocked-off weights at fixed batches, to watch
the stack skip two steps and roll back once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainopt.config.cli import ArgumentParser, UsageError, positive_int, run_command
from trainopt.models import digits_data, digits_mlp
from trainopt.schedules.adapters import cosine_annealing_schedule
from trainopt.stability.checkpoint import CheckpointManager, _atomic_write
from trainopt.stability.clipping import ZScoreClipper
from trainopt.stability.data import ResumableSampler
from trainopt.stability.recovery import TrainingRecovery
from trainopt.stability.stabilizer import TrainingStabilizer

__all__ = ["build_parser", "build_run", "main", "train"]

# Faults by batch drawn (the data position moves on through rollbacks and restarts alike).
FAULTS = {25: "nan_loss", 45: "loss_spike", 72: "diverged_weights"}


def build_run(checkpoint_dir: str | os.PathLike[str], steps: int, check_every: int, seed: int = 0,
              lr: float = 3e-3, batch_size: int = 64) -> dict[str, Any]:
    """Everything the recipe trains with, built from scratch (nothing is loaded yet).

    Example:
        >>> import tempfile
        >>> from trainopt.stability.recipe import build_run
        >>> run = build_run(tempfile.mkdtemp(), steps=40, check_every=10)
        >>> sorted(run), run["stabilizer"].check_every
        (['data', 'stabilizer', 'x', 'y'], 10)
    """
    x, y, _, _ = digits_data(seed=seed)
    model = digits_mlp(hidden=64, seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=True)
    scheduler = cosine_annealing_schedule(optimizer, total_steps=steps, warmup_steps=max(1, steps // 10),
                                          min_lr=lr / 10)
    manager = CheckpointManager(checkpoint_dir, save_frequency=check_every, keep_last=3)
    recovery = TrainingRecovery(model, optimizer, manager, scheduler=scheduler, lr_factor=0.5)
    sampler = ResumableSampler(len(x), batch_size, seed=seed)
    stabilizer = TrainingStabilizer(model, optimizer, scheduler, clipper=ZScoreClipper(warmup_steps=10),
                                    check_every=check_every, recovery=recovery, data=sampler)
    return {"stabilizer": stabilizer, "data": sampler, "x": x, "y": y}


def train(run: dict[str, Any], steps: int, faults: bool = False, log: Any = None) -> torch.nn.Module:
    """Resume from the newest checkpoint if any, then train until the stabilizer has made ``steps`` steps.

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
    stabilizer, sampler, x, y = run["stabilizer"], run["data"], run["x"], run["y"]
    model = stabilizer.model
    start = stabilizer.resume()
    if log is not None:
        print(f"resumed at step {start}" if start is not None else "started", file=log, flush=True)
    while stabilizer.steps < steps:
        index = sampler.next_batch()
        drawn = sampler.epoch * len(sampler) + sampler.position
        fault = FAULTS.get(drawn) if faults else None
        xb, yb = x[index], y[index]
        if fault == "loss_spike":
            yb = (yb + 1) % 10  # a mislabelled batch
        factor = float("nan") if fault == "nan_loss" else 1.0
        stabilizer.step(lambda: F.cross_entropy(model(xb), yb) * factor)
        if fault == "diverged_weights":
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.5)
        if log is not None and stabilizer.steps % stabilizer.check_every == 0 and stabilizer.last_report:
            report = stabilizer.last_report
            done = f"rolled back ({report['recovered']})" if report["recovered"] else "checked"
            print(f"step {stabilizer.steps}: batch {drawn}, {done}", file=log, flush=True)
    return model


def build_parser() -> ArgumentParser:
    """The command line of ``python -m trainopt.stability.recipe``.

    Example:
        >>> from trainopt.stability.recipe import build_parser
        >>> args = build_parser().parse_args(["--checkpoint-dir", "ckpt", "--steps", "50", "--out",
        ...                                   "w.pt"])
        >>> args.steps, args.check_every, args.out.name
        (50, 10, 'w.pt')
    """
    parser = ArgumentParser(prog="python -m trainopt.stability.recipe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-dir", type=Path, required=True, help="checkpoints: read to resume, written")
    parser.add_argument("--steps", type=positive_int, required=True, help="training steps of the whole run")
    parser.add_argument("--check-every", type=positive_int, default=10,
                        help="steps between boundaries: checks, checkpoints, rollbacks (default 10)")
    parser.add_argument("--out", type=Path, required=True, help="where to torch.save the final state_dict")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the data order")
    parser.add_argument("--faults", action="store_true", help="inject a NaN loss, a loss spike, bad weights")
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
    torch.set_num_threads(1)  # one thread: the same floating-point order on every run
    run = build_run(args.checkpoint_dir, args.steps, args.check_every, seed=args.seed)
    model = train(run, args.steps, faults=args.faults, log=sys.stdout)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    state = model.state_dict()
    _atomic_write(args.out, lambda f: torch.save(state, f))
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
