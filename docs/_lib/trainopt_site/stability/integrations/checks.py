"""The integrations' checks: one tiny run per framework, with and without trainopt.

Each ``*_run`` function trains a tiny model built from a config (no download) for a few steps in
the framework's own loop and returns the final weights and what the guard counted. The tests
(and :func:`~trainopt.perf.distributed.processes.launch`, for two ranks) compare runs: with
nothing to skip, trainopt changes nothing; with a NaN batch, it equals the run without that
batch; a resumed run equals the run it replaced. Each imports its framework when called.
"""

from __future__ import annotations

import gc
import importlib
import os
from pathlib import Path
from typing import Any

import torch

from trainopt.stability.integrations.guard import GuardedOptimizer
from trainopt.stability.integrations.tiny import VOCAB, tiny_causal_lm

__all__ = [
    "accelerate_run",
    "flat_weights",
    "hf_run",
    "lightning_run",
    "rank_run",
    "rank_runs",
    "regression_data",
]

BATCH = 4


def flat_weights(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter, flattened into one vector (detached).

    Example:
        >>> import torch
        >>> from trainopt_site.stability.integrations.checks import flat_weights
        >>> flat_weights(torch.nn.Linear(3, 2)).shape
        torch.Size([8])
    """
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def _poison(items: torch.Tensor, nan_batch: int | None, ranks: int) -> torch.Tensor:
    """NaN in the inputs of one batch; under ``ranks`` ranks, only in the rows rank 0 draws."""
    if nan_batch is not None:
        rows = torch.arange(nan_batch * BATCH * ranks, (nan_batch + 1) * BATCH * ranks)
        items = items.clone()
        items[rows[::ranks] if ranks > 1 else rows] = float("nan")
    return items


def regression_data(
    n_batches: int, nan_batch: int | None = None, drop_batch: int | None = None, ranks: int = 1
) -> torch.utils.data.TensorDataset:
    """``BATCH * ranks * n_batches`` rows of a noisy linear task; one batch NaN or left out.

    Example:
        >>> from trainopt_site.stability.integrations.checks import regression_data
        >>> len(regression_data(5)), len(regression_data(5, drop_batch=2))
        (20, 16)
    """
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n_batches * BATCH * ranks, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(len(x), 1, generator=g)
    x = _poison(x, nan_batch, ranks)
    if drop_batch is not None:
        keep = torch.ones(len(x), dtype=torch.bool)
        keep[drop_batch * BATCH : (drop_batch + 1) * BATCH] = False
        x, y = x[keep], y[keep]
    return torch.utils.data.TensorDataset(x, y)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def _optimizer_pair(model: torch.nn.Module, total: int) -> tuple[torch.optim.Optimizer, Any]:
    """Fused AdamW, warm-up then linear decay: the rate changes inside every window."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 3) * max(0.1, 1 - s / total)
    )
    return optimizer, schedule


class _LMData(torch.utils.data.Dataset):
    """Float inputs (``inputs_embeds``), so that a batch can be NaN; next-token labels."""

    def __init__(
        self, n_batches: int, nan_batch: int | None, drop_batch: int | None, ranks: int
    ) -> None:
        g = torch.Generator().manual_seed(2)
        n = n_batches * BATCH * ranks
        self.embeds = _poison(torch.randn(n, 8, 16, generator=g), nan_batch, ranks)
        self.labels = torch.randint(0, VOCAB, (n, 8), generator=g)
        if drop_batch is not None:
            keep = [i for i in range(n) if not drop_batch * BATCH <= i < (drop_batch + 1) * BATCH]
            self.embeds, self.labels = self.embeds[keep], self.labels[keep]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"inputs_embeds": self.embeds[i], "labels": self.labels[i]}


def hf_run(
    out_dir: str,
    guard: dict[str, Any] | None = None,
    *,
    n_batches: int = 12,
    nan_batch: int | None = None,
    drop_batch: int | None = None,
    save_steps: int | None = None,
    resume: str | None = None,
    count_syncs: bool = False,
    max_grad_norm: float = 1.0,
    ranks: int = 1,
) -> dict[str, Any]:
    """Train the tiny Llama with the ``Trainer``; ``guard``: ``GuardedOptimizer`` options, or
    ``None`` for plain.

    Example:
        >>> import tempfile
        >>> from trainopt_site.stability.integrations.checks import hf_run
        >>> hf_run(tempfile.mkdtemp(), {"check_every": 2}, n_batches=4, nan_batch=1)["skipped"]
        1
    """
    from transformers import (
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        get_scheduler,
    )

    from trainopt.stability.integrations.hf import stabilize
    from trainopt.stability.syncs import HostSyncCounter

    model = tiny_causal_lm()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, fused=True)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=3, num_training_steps=n_batches)
    optimizers, callbacks = (optimizer, scheduler), []
    if guard is not None:
        optimizers, callback = stabilize(model, optimizer, scheduler, **guard)
        callbacks.append(callback)
    counter = HostSyncCounter() if count_syncs else None
    per_step: list[int] = []

    class _Syncs(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            per_step.append(counter.count)

    if counter is not None:
        callbacks.append(_Syncs())
    args = TrainingArguments(
        out_dir,
        per_device_train_batch_size=BATCH,
        num_train_epochs=1,
        max_grad_norm=max_grad_norm,
        train_sampling_strategy="sequential",
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        logging_steps=1000,
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
        save_only_model=False,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=_LMData(n_batches, nan_batch, drop_batch, ranks),
        optimizers=optimizers,
        callbacks=callbacks,
    )
    trainer.remove_callback(PrinterCallback)  # no metrics printed
    if counter is not None:
        with counter:
            trainer.train(resume_from_checkpoint=resume)
    else:
        trainer.train(resume_from_checkpoint=resume)
    guarded = optimizers[0] if guard is not None else None
    return {
        "weights": flat_weights(model),
        "syncs": [b - a for a, b in zip(per_step, per_step[1:])],
        "skipped": None if guarded is None else guarded.skipped_steps,
        "lr": float(optimizer.param_groups[0]["lr"]),
    }


def lightning_run(
    out_dir: str,
    guard: dict[str, Any] | None = None,
    *,
    n_batches: int = 12,
    nan_batch: int | None = None,
    drop_batch: int | None = None,
    epochs: int = 1,
    stop_after: int | None = None,
    resume: str | None = None,
    count_syncs: bool = False,
    ranks: int = 1,
) -> dict[str, Any]:
    """Train the tiny MLP with Lightning (automatic optimization) for ``epochs`` (or stop after
    ``stop_after``).

    Example:
        >>> import tempfile
        >>> from trainopt_site.stability.integrations.checks import lightning_run
        >>> lightning_run(tempfile.mkdtemp(), {"check_every": 2}, n_batches=4,
        ...               nan_batch=1)["skipped"]
        1
    """
    import lightning as L

    from trainopt.stability.integrations.lightning import stabilizer_callback
    from trainopt.stability.syncs import HostSyncCounter

    counter = HostSyncCounter() if count_syncs else None
    per_step: list[int] = []
    held: dict[str, Any] = {}

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            if counter is not None:
                per_step.append(counter.count)
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> dict[str, Any]:
            optimizer, scheduler = _optimizer_pair(self, n_batches * epochs)
            if guard is not None:
                optimizer = held["guarded"] = GuardedOptimizer(optimizer, scheduler, **guard)
                scheduler = optimizer.scheduler
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }

    module = Regression()
    data = torch.utils.data.DataLoader(
        regression_data(n_batches, nan_batch, drop_batch, ranks), batch_size=BATCH
    )
    trainer = L.Trainer(
        max_epochs=stop_after or epochs,
        accelerator="cpu",
        devices=ranks,
        strategy="ddp" if ranks > 1 else "auto",
        gradient_clip_val=1.0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out_dir,
        callbacks=[stabilizer_callback()] if guard is not None else [],
        enable_checkpointing=False,
    )
    if counter is not None:
        with counter:
            trainer.fit(module, data, ckpt_path=resume)
    else:
        trainer.fit(module, data, ckpt_path=resume)
    trainer.save_checkpoint(Path(out_dir) / "last.ckpt")
    guarded = held.get("guarded")
    return {
        "weights": flat_weights(module),
        "syncs": [b - a for a, b in zip(per_step, per_step[1:])],
        "skipped": None if guarded is None else guarded.skipped_steps,
    }


def accelerate_run(
    out_dir: str,
    guard: dict[str, Any] | None = None,
    *,
    n_batches: int = 12,
    nan_batch: int | None = None,
    drop_batch: int | None = None,
    save_at: int | None = None,
    resume: int | None = None,
    count_syncs: bool = False,
    ranks: int = 1,
) -> dict[str, Any]:
    """Train the tiny MLP in an Accelerate loop; save at step ``save_at`` or resume from that save.

    Example:
        >>> import tempfile
        >>> from trainopt_site.stability.integrations.checks import accelerate_run
        >>> accelerate_run(tempfile.mkdtemp(), {"check_every": 2}, n_batches=4,
        ...                nan_batch=1)["skipped"]
        1
    """
    from accelerate import Accelerator

    from trainopt.stability.integrations.accelerate import prepare
    from trainopt.stability.syncs import HostSyncCounter

    accelerator = Accelerator(cpu=True)
    model = _mlp()
    optimizer, scheduler = _optimizer_pair(model, n_batches)
    loader = torch.utils.data.DataLoader(
        regression_data(n_batches, nan_batch, drop_batch, ranks), batch_size=BATCH
    )
    if guard is not None:
        model, optimizer, scheduler, loader = prepare(
            accelerator, model, optimizer, scheduler, loader, **guard
        )
    else:
        model, optimizer, scheduler, loader = accelerator.prepare(
            model, optimizer, scheduler, loader
        )
    state = os.path.join(out_dir, "state")
    if resume is not None:
        accelerator.load_state(state)
        loader = accelerator.skip_first_batches(loader, resume)
    counter = HostSyncCounter() if count_syncs else None
    per_step = []
    step = resume or 0
    for x, y in loader:
        with counter if counter is not None else torch.enable_grad():
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step(lambda: loss)
            scheduler.step()
            optimizer.zero_grad()
        step += 1
        if counter is not None:
            per_step.append(counter.count)
        if step == save_at:
            accelerator.save_state(state)
    guarded = optimizer.optimizer if guard is not None else None
    return {
        "weights": flat_weights(accelerator.unwrap_model(model)),
        "syncs": [b - a for a, b in zip(per_step, per_step[1:])],
        "skipped": None if guarded is None else guarded.skipped_steps,
    }


def rank_run(framework: str, out_dir: str) -> dict[str, Any]:
    """One rank of a 2-rank run (:func:`~trainopt.perf.distributed.processes.launch`): rank 0 alone
    sees a NaN batch.

    Example:
        >>> from trainopt_site.stability.integrations.checks import rank_run
        >>> try:
        ...     rank_run("keras", ".")
        ... except ValueError as error:
        ...     print(error)
        framework must be 'hf', 'lightning' or 'accelerate', got 'keras'
    """
    runs = {"hf": hf_run, "lightning": lightning_run, "accelerate": accelerate_run}
    if framework not in runs:
        raise ValueError(f"framework must be 'hf', 'lightning' or 'accelerate', got {framework!r}")
    result = runs[framework](out_dir, {"check_every": 4}, n_batches=8, nan_batch=2, ranks=2)
    return {"weights": result["weights"], "skipped": result["skipped"]}


def rank_runs(frameworks: list[str], out_dir: str) -> dict[str, dict[str, Any]]:
    """:func:`rank_run` for each of ``frameworks`` in turn, in one process per rank: one launch for
    all of them.

    Each rank trains on one CPU thread (the ranks share the machine's cores, and the models are
    tiny), with the imported frameworks' objects frozen out of the garbage collector
    (``gc.freeze``: the ``Trainer`` and Accelerate run ``gc.collect()`` after training); both are
    restored afterwards.

    Example:
        >>> from trainopt_site.stability.integrations.checks import rank_runs
        >>> rank_runs([], ".")
        {}
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for name in (
        frameworks
    ):  # import first, then freeze: the frameworks' gc.collect() calls skip their objects
        if name == "hf":
            from transformers import Trainer  # noqa: F401
        importlib.import_module({"hf": "accelerate"}.get(name, name))
    gc.freeze()
    try:
        return {name: rank_run(name, os.path.join(out_dir, name)) for name in frameworks}
    finally:
        gc.unfreeze()
        torch.set_num_threads(threads)
