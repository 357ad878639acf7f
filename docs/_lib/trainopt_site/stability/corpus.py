"""The stabilizer measured like a classifier: false positives on healthy runs, misses on faulty
ones.

``python -m trainopt_site.stability.corpus --out FILE`` trains every run of two corpora, generated
by code (:mod:`trainopt_site.stability.corpus_runs`), through a
:class:`~trainopt.stability.stabilizer.TrainingStabilizer` with the stability page's set-up and
defaults (``TrainingStabilizer(model, optimizer, scheduler, checkpoint_dir=...)``), and writes
what it did:

- **healthy runs** (:data:`HEALTHY`): the digits MLP at batch 16, 32 and 64 with AdamW and with
  SGD at learning rates plain torch trains well, the GPT language model, and a fine-tune with a
  warm-up and a decay from a trained starting point. A false positive is a skipped step, a
  rollback or a
  :class:`~trainopt.stability.recovery.rollback.TrainingInstabilityError`; each run is also
  trained by plain torch (clipped at the same norm) on three seeds, and its final validation
  result must lie within their spread;
- **healthy runs whose loss rises or flattens** (:data:`RISING`): a VAE whose KL weight warms
  up, a sequence-length curriculum, a switch of the data mixture, a loss on a plateau, a
  policy-gradient loss (negative), and a language model on Python's standard-library sources.
  The divergence test must leave them alone; with nothing skipped, each ends exactly where plain
  torch does on the same random state;
- **faulty runs** (:data:`FAULTY`): one batch with every label wrong, one batch of raw pixels
  (the standardisation forgotten), a NaN loss, a NaN gradient, and a learning rate 10, 30 or 100
  times too high from a step on; and, early in a run (:data:`EARLY`), a batch of inputs times 100
  or with its labels shuffled at step 10 to 60, and a learning rate 30 times too high from step
  100 to 210. A miss is a bad batch whose step was applied, or a learning-rate
  fault that no rollback answered.

:mod:`trainopt_site.stability.corpus_table` turns the results into the page's tables.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainopt.config.cli import ArgumentParser, output_file, run_command
from trainopt.schedules.adapters import cosine_annealing_schedule
from trainopt.stability.recovery.rollback import TrainingInstabilityError
from trainopt.stability.stabilizer import TrainingStabilizer
from trainopt_site.stability.corpus_runs import build_task

__all__ = ["EARLY", "FAULTY", "HEALTHY", "RISING", "Run", "measure", "run_plain", "run_stabilized"]


@dataclass(frozen=True)
class Run:
    """One run of a corpus: the task, the optimizer, how long, and the fault (if any) at
    ``fault_at``.

    Example:
        >>> from trainopt_site.stability.corpus import Run
        >>> Run("digits", 16, "sgd", 0.1, 500, fault="labels", fault_at=250).name
        'digits sgd lr=0.1 batch=16, labels at 250'
    """

    task: str
    batch_size: int
    optimizer: str  # "adamw" (fused) or "sgd" (momentum 0.9)
    lr: float
    steps: int
    schedule: bool = False  # a 10 % warm-up, then a cosine decay to a tenth
    pretrain: int = 0  # steps on the digits 0-4 before this run (a fine-tune)
    fault: str | None = None
    fault_at: int = 0

    @property
    def name(self) -> str:
        extra = f", {self.fault} at {self.fault_at}" if self.fault else ""
        tune = ", fine-tune" if self.pretrain else ""
        return f"{self.task} {self.optimizer} lr={self.lr:g} batch={self.batch_size}{tune}{extra}"


HEALTHY = [
    *[Run("digits", b, "adamw", lr, 6 * (1438 // b)) for lr in (1e-3, 1e-2) for b in (16, 32, 64)],
    *[Run("digits", b, "sgd", 0.1, 6 * (1438 // b)) for b in (16, 32, 64)],
    Run("language", 16, "adamw", 3e-3, 400, schedule=True),
    Run("digits", 32, "adamw", 1e-3, 270, schedule=True, pretrain=200),
]

RISING = [
    Run("vae", 128, "adamw", 1e-3, 600),  # KL weight 0 to 1 over steps 100-500: loss rises to ~25
    Run("curriculum", 16, "adamw", 3e-3, 600),  # length 8, 16, 24, 32 from steps 0, 150, 300, 450
    Run("mixture", 16, "adamw", 3e-3, 500),  # a quarter of Python source from step 250
    Run("plateau", 32, "sgd", 0.05, 800),  # at the noise floor from step ~100
    Run("policy", 32, "adamw", 1e-3, 600),  # minus the reward: -0.1 falling to -1
    Run("stdlib", 16, "adamw", 3e-3, 400, schedule=True),
]

EARLY = [
    *[
        Run("digits", b, opt, lr, at + 50, fault=kind, fault_at=at)
        for kind in ("inputs_x100", "shuffled_labels")
        for at in (10, 20, 30, 60)
        for b in (16, 64)
        for opt, lr in (("adamw", 3e-3), ("sgd", 0.1))
    ],
    *[
        Run("digits", 32, opt, lr, 500, fault="lr_x30", fault_at=at)
        for opt, lr in (("adamw", 3e-3), ("sgd", 0.1))
        for at in (100, 150, 200, 210)
    ],
]

FAULTY = [
    *[
        Run("digits", b, opt, lr, at + 50, fault=kind, fault_at=at)
        for kind in ("labels", "raw_inputs")
        for at in (60, 250)
        for b in (16, 64)
        for opt, lr in (("adamw", 3e-3), ("sgd", 0.1))
    ],
    *[
        Run("digits", b, "adamw", 3e-3, 300, fault=kind, fault_at=250)
        for kind in ("nan_loss", "nan_gradient")
        for b in (16, 64)
    ],
    *[
        Run("digits", 32, opt, lr, 500, fault=f"lr_x{k}", fault_at=at)
        for opt, lr in (("adamw", 3e-3), ("sgd", 0.1))
        for k in (10, 30, 100)
        for at in (250, 280)
    ],
    Run("language", 16, "adamw", 3e-3, 300, schedule=True, fault="labels", fault_at=250),
]


def _build(run: Run, seed: int) -> tuple[Any, torch.optim.Optimizer, Any]:
    start = None
    if run.pretrain:
        base = build_task("digits0-4", run.batch_size, seed)
        opt = torch.optim.AdamW(base.model.parameters(), lr=3e-3, weight_decay=0.01, fused=True)
        for step in range(run.pretrain):
            x, y = base.batch(step)
            opt.zero_grad()
            base.loss(base.model, x, y).backward()
            opt.step()
        start = base.model
    task = build_task(run.task, run.batch_size, seed, start=start)
    params = task.model.parameters()
    optimizer = (
        torch.optim.AdamW(params, lr=run.lr, weight_decay=0.01, fused=True)
        if run.optimizer == "adamw"
        else torch.optim.SGD(params, lr=run.lr, momentum=0.9)
    )
    scheduler = (
        cosine_annealing_schedule(
            optimizer, total_steps=run.steps, warmup_steps=run.steps // 10, min_lr=run.lr / 10
        )
        if run.schedule
        else None
    )
    return task, optimizer, scheduler


def _batch(task: Any, run: Run, call: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The batch of this call, with the run's fault applied at ``fault_at``; and a loss factor."""
    x, y = task.batch(call)
    if call != run.fault_at or run.fault is None:
        return x, y, 1.0
    if run.fault == "labels":
        shift = torch.randint(
            1,
            int(y.max()) + 1 if run.task == "language" else 10,
            y.shape,
            generator=torch.Generator().manual_seed(call),
        )
        return x, (y + shift) % (int(y.max()) + 1 if run.task == "language" else 10), 1.0
    if run.fault == "raw_inputs":
        mean, std = task.inputs_scale
        return x * std + mean, y, 1.0
    if run.fault == "inputs_x100":
        return x * 100, y, 1.0
    if run.fault == "shuffled_labels":
        return x, y[torch.randperm(len(y), generator=torch.Generator().manual_seed(call))], 1.0
    return x, y, math.nan if run.fault == "nan_loss" else 1.0


def run_stabilized(run: Run, seed: int = 0, folder: str | Path | None = None) -> dict[str, Any]:
    """Train ``run`` through the page's stabilizer; what it skipped, rolled back, and the result.

    Example:
        >>> from trainopt_site.stability.corpus import Run, run_stabilized
        >>> result = run_stabilized(
        ...     Run("digits", 64, "adamw", 3e-3, 60, fault="nan_loss", fault_at=40))
        >>> result["fault_skipped"], result["skipped"], result["rollbacks"]
        (True, 1, 0)
    """
    task, optimizer, scheduler = _build(run, seed)
    model = task.model
    folder = folder or tempfile.mkdtemp(prefix="trainopt-corpus-")
    stabilizer = TrainingStabilizer(model, optimizer, scheduler, checkpoint_dir=folder)
    call, error, fault_skipped = 0, None, None
    try:
        while stabilizer.steps < run.steps:
            x, y, factor = _batch(task, run, call)
            if run.fault and run.fault.startswith("lr_x") and call == run.fault_at:
                for group in optimizer.param_groups:
                    group["lr"] *= float(run.fault[4:])
            before = stabilizer.skip_events + int(stabilizer.skipped)
            hook = (
                model.parameters().__next__().register_hook(lambda g: g * math.nan)
                if run.fault == "nan_gradient" and call == run.fault_at
                else None
            )
            stabilizer.step(lambda: task.loss(model, x, y) * factor)  # noqa: B023 - called at once
            if hook is not None:
                hook.remove()
            if call == run.fault_at and run.fault and not run.fault.startswith("lr_x"):
                fault_skipped = stabilizer.skip_events + int(stabilizer.skipped) > before
            call += 1
    except TrainingInstabilityError as exc:
        error = str(exc)
    rollbacks = len(stabilizer.recovery.history)
    return {
        "run": run.name,
        "steps": stabilizer.steps,
        "calls": call,
        "skipped": stabilizer.skip_events + int(stabilizer.skipped),
        "rollbacks": rollbacks,
        "rollback_steps": [h["restored_step"] for h in stabilizer.recovery.history],
        "error": error,
        "fault_skipped": fault_skipped,
        "result": task.evaluate(model),
    }


def run_plain(run: Run, seed: int = 0) -> float:
    """Train ``run`` by plain torch, clipped at 1.0 like the stabilizer; its final validation
    result.

    Example:
        >>> from trainopt_site.stability.corpus import Run, run_plain, run_stabilized
        >>> run = Run("digits", 64, "sgd", 0.1, 40)
        >>> run_plain(run) == run_stabilized(run)["result"]  # nothing to skip: the same run
        True
    """
    task, optimizer, scheduler = _build(run, seed)
    for step in range(run.steps):
        x, y, _ = _batch(task, run, step)
        optimizer.zero_grad()
        task.loss(task.model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(task.model.parameters(), 1.0)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return task.evaluate(task.model)


def measure(
    healthy: Sequence[Run] = (*HEALTHY, *RISING),
    faulty: Sequence[Run] = (*FAULTY, *EARLY),
    seeds: Sequence[int] = (0, 1, 2),
) -> dict[str, Any]:
    """Both corpora through the stabilizer on each of ``seeds``; plain torch on the same seeds.

    A healthy run's result is within noise when it lies within the plain runs' range over the
    seeds, widened by that range on each side.

    Example:
        >>> from trainopt_site.stability.corpus import Run, measure
        >>> results = measure([Run("digits", 64, "sgd", 0.1, 40)],
        ...                   [Run("digits", 64, "sgd", 0.1, 40, fault="nan_loss", fault_at=30)],
        ...                   seeds=(0,))
        >>> results["healthy_flagged_runs"], results["misses"]
        (0, 0)
    """
    rows = []
    for run in healthy:
        plain = [run_plain(run, seed) for seed in seeds]
        spread = max(plain) - min(plain)
        for seed in seeds:
            result = run_stabilized(run, seed=seed)
            result.update(
                kind="healthy",
                seed=seed,
                plain=plain,
                within_noise=min(plain) - spread <= result["result"] <= max(plain) + spread,
                false_positive=bool(result["skipped"] or result["rollbacks"] or result["error"]),
            )
            rows.append(result)
    for run in faulty:
        for seed in seeds:
            result = run_stabilized(run, seed=seed)
            caught = (
                bool(result["rollbacks"])
                if run.fault.startswith("lr_x")
                else bool(result["fault_skipped"])
            )
            result.update(
                kind="faulty", seed=seed, fault=run.fault, fault_at=run.fault_at, caught=caught
            )
            rows.append(result)
    healthy_rows = [r for r in rows if r["kind"] == "healthy"]
    faulty_rows = [r for r in rows if r["kind"] == "faulty"]
    return {
        "rows": rows,
        "seeds": list(seeds),
        "healthy_runs": len(healthy_rows),
        "healthy_flagged_runs": sum(r["false_positive"] for r in healthy_rows),
        "healthy_skipped_steps": sum(r["skipped"] for r in healthy_rows),
        "healthy_steps": sum(r["steps"] for r in healthy_rows),
        "healthy_rollbacks": sum(r["rollbacks"] for r in healthy_rows),
        "healthy_errors": sum(bool(r["error"]) for r in healthy_rows),
        "healthy_within_noise": sum(r["within_noise"] for r in healthy_rows),
        "faulty_runs": len(faulty_rows),
        "misses": sum(not r["caught"] for r in faulty_rows),
    }


def _provenance() -> dict[str, Any]:
    import datetime
    import platform

    from trainopt.config.provenance import git_state

    return {
        "torch": torch.__version__,
        "machine": f"{platform.machine()} CPU, 1 thread",
        "date": datetime.date.today().isoformat(),
        **git_state(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Measure both corpora and write the results as JSON (the stability page renders them)."""
    parser = ArgumentParser(
        prog="python -m trainopt_site.stability.corpus", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=output_file, required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {**measure(), "made": _provenance()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(
        f"healthy: {results['healthy_flagged_runs']} of {results['healthy_runs']} runs flagged, "
        f"{results['healthy_skipped_steps']} of {results['healthy_steps']} steps skipped; "
        f"faulty: {results['misses']} of {results['faulty_runs']} missed; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
