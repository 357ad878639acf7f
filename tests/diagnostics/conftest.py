"""Fixtures of the diagnostics tests: the generated runs, and the logs real frameworks write,
each trained once per session.

The framework logs come from tiny CPU runs, written as each framework's documentation shows: a
Hugging Face ``Trainer`` (``trainer_state.json``, checkpoints and, with
``report_to="tensorboard"``, TensorBoard events), Lightning's ``CSVLogger`` and
``TensorBoardLogger`` (``self.log("train_loss", ...)``, ``grad_norm(self, norm_type=2)`` and a
``LearningRateMonitor``), a ``SummaryWriter`` logging ``Loss/train`` and ``GradNorm/train`` as
PyTorch's TensorBoard tutorial does, and the CSV that W&B exports of a run (wandb itself is not a
dependency: the file is written with the columns of W&B's export).
"""

from __future__ import annotations

import copy
import csv
import math
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tiny_runs
import torch
import torch.nn.functional as F
from extras import require

from trainopt.diagnostics import generate_run
from trainopt.models import digits_data, digits_mlp
from trainopt_site.diagnostics.generate import RunSpec, run_grid

VOCAB, SEQ = 32, 16
STEPS = 160


@pytest.fixture(scope="session")
def generated_runs() -> list[tuple[RunSpec, list[dict]]]:
    """Every cause of :func:`run_grid` on 3 seeds and 2 widths: 66 runs of 300 steps (~20 s of
    CPU)."""
    return [(spec, generate_run(*spec)) for spec in run_grid(seeds=(0, 1, 2), widths=(32, 128))]


@pytest.fixture(scope="session")
def one_thread() -> Iterator[None]:
    """The frameworks' tiny runs on one thread, the heap frozen (:mod:`tiny_runs`)."""
    with tiny_runs.one_thread(freeze_heap=True):
        yield


def trainer_run(
    cause: str,
    out: Path,
    *,
    max_steps: int = 100,
    logging_steps: int = 1,
    save_steps: int | None = None,
    save_state: bool = True,
) -> Path:
    """A tiny GPT-2 (2 layers, width 32) learning counting sequences with the ``Trainer`` on a
    CPU, into the output folder ``out``: ``healthy``, ``lr_too_high``, ``lr_too_low``, or
    ``nan_weight`` (a weight turns NaN at step 50, as after an overflow)."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    class PoisonWeight(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 50:
                with torch.no_grad():
                    model.transformer.wte.weight[0, 0] = math.nan

    g = torch.Generator().manual_seed(0)
    start, stride = (
        torch.randint(0, VOCAB, (1024, 1), generator=g),
        torch.randint(1, 3, (1024, 1), generator=g),
    )
    ids = (start + stride * torch.arange(SEQ)) % VOCAB
    data = [{"input_ids": row, "labels": row} for row in ids]
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=2,
            vocab_size=VOCAB,
            n_positions=SEQ,
            bos_token_id=0,
            eos_token_id=0,
        )
    )
    lr = {"healthy": 3e-3, "lr_too_high": 1.0, "nan_weight": 3e-3, "lr_too_low": 1e-6}[cause]
    args = TrainingArguments(
        str(out),
        max_steps=max_steps,
        per_device_train_batch_size=8,
        learning_rate=lr,
        lr_scheduler_type="constant",
        logging_steps=logging_steps,
        report_to=["tensorboard"],
        save_strategy="no" if save_steps is None else "steps",
        save_steps=save_steps or 500,
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
        log_level="error",
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        callbacks=[PoisonWeight()] if cause == "nan_weight" else [],
    )
    trainer.train()
    if save_state:
        trainer.save_state()
    return out


@pytest.fixture(scope="session")
def trainer_runs(tmp_path_factory, one_thread) -> dict[str, Path]:
    """The output folder of a 100-step ``Trainer`` run of each cause (``trainer_state.json`` and
    events under ``runs/``)."""
    require("transformers", "hf")
    causes = ("healthy", "lr_too_high", "nan_weight", "lr_too_low")
    return {cause: trainer_run(cause, tmp_path_factory.mktemp(cause)) for cause in causes}


@pytest.fixture(scope="session")
def trainer_folders(tmp_path_factory, one_thread) -> dict[str, Path]:
    """``sparse``: a healthy run logged every 3 of its 100 steps (the run's summary comes at step
    100, which logs nothing else), with checkpoints at steps 50 and 100 and ``save_state``;
    ``two_runs``: the same folder, into which a run at a learning rate far too high then saved
    ``checkpoint-40``: the newest run, and the lower checkpoint number."""
    require("transformers", "hf")
    sparse = trainer_run(
        "healthy",
        tmp_path_factory.mktemp("sparse"),
        logging_steps=3,
        save_steps=50,
    )
    two_runs = tmp_path_factory.mktemp("two") / "output"
    shutil.copytree(sparse, two_runs)  # copy2: the files keep their times
    trainer_run("lr_too_high", two_runs, max_steps=40, save_steps=40, save_state=False)
    return {"sparse": sparse, "two_runs": two_runs}


def digits_loop(
    log: Callable[[int, float, float, float], None],
    steps: range,
    *,
    lr: float = 1e-3,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    poison: int | None = None,
    bad_batch: int | None = None,
    checkpoint: int | None = None,
) -> tuple[torch.nn.Module, torch.optim.Optimizer, tuple | None]:
    """A plain PyTorch loop: the digits MLP with AdamW, one ``log(step, loss, grad_norm, lr)`` a
    step. ``poison``: a weight turns NaN after that step (every step after is NaN); ``bad_batch``:
    that step's batch holds a NaN, and the step is skipped (the run goes on). Returns the model,
    the optimizer, and their states before step ``checkpoint``."""
    x, y, _, _ = digits_data(seed=0)
    model = model or digits_mlp(hidden=32, seed=0)
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=lr)
    batches = torch.Generator().manual_seed(steps.start)
    saved = None
    for step in steps:
        if step == checkpoint:
            saved = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
        idx = torch.randint(0, len(x), (64,), generator=batches)
        xb = x[idx].clone()
        if step == bad_batch:
            xb[0, 0] = math.nan
        loss = F.cross_entropy(model(xb), y[idx])
        optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        if torch.isfinite(loss):
            optimizer.step()
        if step == poison:
            with torch.no_grad():
                next(model.parameters())[0, 0] = math.nan
        log(step, loss.item(), norm.item(), optimizer.param_groups[0]["lr"])
    return model, optimizer, saved


def _resume(saved: tuple, **loop) -> dict:
    model = digits_mlp(hidden=32, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    return {"model": model, "optimizer": optimizer, **loop}


def tutorial_run(log_dir: Path, steps: range = range(STEPS), **loop) -> tuple | None:
    """A plain loop logging as PyTorch's TensorBoard tutorial does:
    ``writer.add_scalar("Loss/train", loss, step)``, and the gradient norm as ``GradNorm/train``.
    Returns the checkpoint the loop was asked for."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(log_dir)) as writer:

        def log(step: int, loss: float, norm: float, lr: float) -> None:
            writer.add_scalar("Loss/train", loss, step)
            writer.add_scalar("GradNorm/train", norm, step)

        return digits_loop(log, steps, **loop)[2]


WANDB_COLUMNS = [
    "_step",
    "_runtime",
    "_timestamp",
    "train/loss",
    "train/grad_norm",
    "train/learning_rate",
    "train/global_step",
    "train/epoch",
]


def wandb_export(path: Path, restart_at: int | None = None, **loop) -> Path:
    """The CSV W&B exports of a run that logged, each step, what the ``Trainer``'s W&B callback
    logs: ``_step`` counts the ``wandb.log`` calls, ``train/global_step`` is the training step.
    ``restart_at``: the run dies at ``STEPS - 40`` and is resumed (``resume="allow"``) from a
    checkpoint at that step: W&B's ``_step`` goes on, the global step goes back."""
    rows: list[list] = []
    began = time.time()

    def log(step: int, loss: float, norm: float, lr: float) -> None:
        now = time.time()
        rows.append([len(rows), now - began, now, loss, norm, lr, step, step / 22.5])

    if restart_at is None:
        digits_loop(log, range(STEPS), **loop)
    else:
        saved = digits_loop(log, range(STEPS - 40), poison=restart_at + 10, checkpoint=restart_at)[
            2
        ]
        digits_loop(log, range(restart_at, STEPS), **_resume(saved))
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(WANDB_COLUMNS)
        writer.writerows(
            ["NaN" if isinstance(v, float) and math.isnan(v) else v for v in row] for row in rows
        )
    return path


def lightning_run(out: Path, grow_from: int | None = None) -> Path:
    """The digits MLP trained by Lightning's ``Trainer`` for :data:`STEPS` steps, logged by a
    ``CSVLogger`` (under ``out/csv``) and a ``TensorBoardLogger`` (under ``out/tb``) as Lightning's
    documentation shows. ``grow_from``: from that step on, the gradient grows 30 % a step (the
    loss it is taken of is scaled up), as in a run that is blowing up."""
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from lightning.pytorch.utilities import grad_norm

    class Digits(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = digits_mlp(hidden=32, seed=0)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = F.cross_entropy(self.model(x), y)
            self.log("train_loss", loss)
            if grow_from is not None and self.global_step >= grow_from:
                return loss * 1.3 ** (self.global_step - grow_from + 1)
            return loss

        def on_before_optimizer_step(self, optimizer):
            self.log_dict(grad_norm(self, norm_type=2))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    x, y, _, _ = digits_data(seed=0)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y),
        batch_size=64,
        shuffle=True,
        generator=torch.Generator().manual_seed(0),
    )
    trainer = L.Trainer(
        max_steps=STEPS,
        logger=[CSVLogger(out / "csv"), TensorBoardLogger(out / "tb")],
        callbacks=[LearningRateMonitor(logging_interval="step")],
        log_every_n_steps=1,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Digits(), data)
    return out


@pytest.fixture(scope="session")
def framework_logs(tmp_path_factory, one_thread) -> dict[str, Path]:
    """The logs of plain loops and of Lightning, by name: ``tutorial``, ``tutorial_two_runs``
    (a healthy run, then one at a learning rate far too high, in one ``runs/`` folder),
    ``tutorial_restart`` (a run whose weights turn NaN after step 100, restarted from its step-90
    checkpoint into the same log folder), ``wandb``, ``wandb_bad_batch`` and
    ``wandb_early_bad_batch`` (one batch with a NaN at step 120, or 50, skipped),
    ``wandb_restart``, ``lightning`` and ``lightning_growth`` (the gradient grows 30 % a step
    from step 100)."""
    require("tensorboard", "test")
    root = tmp_path_factory.mktemp("frameworks")
    logs = {
        "tutorial": root / "tutorial" / "runs",
        "wandb": wandb_export(root / "wandb.csv"),
        "wandb_bad_batch": wandb_export(root / "wandb_bad_batch.csv", bad_batch=120),
        "wandb_early_bad_batch": wandb_export(root / "wandb_early_bad_batch.csv", bad_batch=50),
        "wandb_restart": wandb_export(root / "wandb_restart.csv", restart_at=90),
    }
    tutorial_run(root / "tutorial" / "runs" / "a")
    tutorial_run(root / "two" / "runs" / "a")
    tutorial_run(root / "two" / "runs" / "b", lr=0.3)
    logs["tutorial_two_runs"] = root / "two" / "runs"
    restart = root / "restart"
    saved = tutorial_run(restart, range(120), poison=100, checkpoint=90)
    tutorial_run(restart, range(90, STEPS), **_resume(saved))
    logs["tutorial_restart"] = restart
    require("lightning", "lightning")
    logs["lightning"] = lightning_run(root / "lightning")
    logs["lightning_growth"] = lightning_run(root / "lightning_growth", grow_from=100)
    return logs
