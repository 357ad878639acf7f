"""trainopt inside the Hugging Face Trainer (2 ranks: test_ranks.py).

Equal runs, a NaN batch as if removed, no added sync, bitwise resume; on a real Trainer with a
tiny torch model: a x1e4 gradient skipped under the default clipping, which the guard takes over,
the loss the Trainer optimises monitored, a plateau scheduler's cut.
"""

from __future__ import annotations

import functools
import types

import pytest
import torch
from extras import require

require("transformers", "hf")

from trainopt_site.stability.integrations.checks import hf_run  # noqa: E402

TOLERANCE = 1e-6  # a rate that changes inside a window reaches the optimizer as a float32 tensor


def max_diff(a: dict, b: dict) -> float:
    return float((a["weights"] - b["weights"]).abs().max())


def test_with_nothing_to_skip_the_run_equals_the_plain_run(tmp_path) -> None:
    plain, guarded = (
        hf_run(str(tmp_path / "a"), None),
        hf_run(str(tmp_path / "b"), {"check_every": 4}),
    )
    assert max_diff(plain, guarded) <= TOLERANCE and guarded["skipped"] == 0


def test_a_nan_batch_is_as_if_removed_from_the_data(tmp_path) -> None:
    guarded = hf_run(str(tmp_path / "a"), {"check_every": 4}, n_batches=13, nan_batch=5)
    removed = hf_run(str(tmp_path / "b"), None, n_batches=13, drop_batch=5)
    assert guarded["skipped"] == 1 and max_diff(guarded, removed) <= TOLERANCE


def test_trainopt_adds_no_host_sync_per_step(tmp_path) -> None:
    """In steady state (no boundary), the same count per step as without trainopt: the Trainer's own
    3 per step (its NaN filter on the logged loss)."""
    plain = hf_run(str(tmp_path / "a"), None, count_syncs=True)["syncs"]
    guarded = hf_run(str(tmp_path / "b"), {"check_every": 100}, count_syncs=True)["syncs"]
    assert len(guarded) >= 10 and guarded == plain


def test_resuming_from_the_frameworks_checkpoint_continues_bitwise(tmp_path) -> None:
    full = hf_run(
        str(tmp_path), {"check_every": 4}, nan_batch=2, save_steps=5
    )  # checkpoint-5: mid-window
    resumed = hf_run(
        str(tmp_path), {"check_every": 4}, nan_batch=2, resume=str(tmp_path / "checkpoint-5")
    )
    assert (
        torch.equal(full["weights"], resumed["weights"])
        and resumed["skipped"] == full["skipped"] == 1
    )


# -- a real Trainer on a tiny torch model: clipping, the loss it optimises, a metric scheduler -----


class _Net(torch.nn.Module):
    """A linear model with the Trainer's calling convention; one training call's gradients x1e4.

    ``loss + 9999 * (loss - loss.detach())`` has the loss's value and 1e4 times its gradients: only
    the gradient monitor can see that step, and only on the unclipped gradients.
    """

    def __init__(self, outputs: int, boost_call: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(8, outputs)
        self.boost_call, self.calls = boost_call, 0
        self.config = types.SimpleNamespace(problem_type=None)  # what label smoothing reads

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        out = {"logits": self.net(x)}
        if labels is not None:
            loss = (
                torch.nn.functional.mse_loss(out["logits"], labels)
                if labels.is_floating_point()
                else torch.nn.functional.cross_entropy(out["logits"], labels)
            )
            if self.training and self.calls == self.boost_call:
                loss = loss + 9999 * (loss - loss.detach())
            out["loss"] = loss
        self.calls += self.training
        return out


def _data(n: int, classes: int | None = None) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g)
    if classes is None:  # large targets: every step's gradient norm is well above 1 (clipped)
        y = 10 * x @ torch.randn(8, 1, generator=g) + 5
    else:
        y = torch.randint(0, classes, (n,), generator=g)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def _trainer(tmp_path, model, data, guard_options, scheduler=None, **args) -> tuple:
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from trainopt.stability.integrations.hf import stabilize

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.pop("lr", 1e-3), fused=True)
    compute_loss_func = args.pop("compute_loss_func", None)
    optimizers, callback = stabilize(
        model, optimizer, scheduler and scheduler(optimizer), **guard_options
    )
    weights = []  # after each optimizer step

    class _Weights(TrainerCallback):
        def on_step_end(self, *a, **k) -> None:
            weights.append(torch.cat([p.detach().flatten().clone() for p in model.parameters()]))

    arguments = TrainingArguments(
        str(tmp_path),
        per_device_train_batch_size=4,
        num_train_epochs=1,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
        save_strategy="no",
        train_sampling_strategy="sequential",
        **args,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=data,
        optimizers=optimizers,
        callbacks=[callback, _Weights()],
        compute_loss_func=compute_loss_func,
    )
    trainer.remove_callback(PrinterCallback)
    return trainer, optimizers[0], weights


def _spy(guarded) -> list[torch.Tensor]:
    """The losses the guard is given (each ``observe``), recorded."""
    seen, observe = [], guarded.observe
    guarded.observe = lambda loss: (seen.append(loss.detach().clone()), observe(loss))[1]
    return seen


def test_a_1e4_gradient_is_skipped_with_the_trainers_default_clipping(tmp_path) -> None:
    """Default ``max_grad_norm=1.0``, a guard that does not clip: it sees the unclipped norm."""
    from transformers import TrainingArguments

    assert TrainingArguments(str(tmp_path)).max_grad_norm == 1.0  # the default the page relies on
    model = _Net(1, boost_call=25)
    trainer, guarded, weights = _trainer(tmp_path, model, _data(4 * 30), {"check_every": 5})
    trainer.train()
    assert guarded.skipped_steps == 1 and guarded.steps == 30
    assert torch.equal(weights[25], weights[24])  # the x1e4 step (the 26th) moved nothing
    assert not torch.equal(weights[26], weights[25])  # and the next one trained
    assert trainer.args.max_grad_norm == 1.0 and guarded.max_grad_norm is None  # handed back


def test_the_guard_clips_at_the_trainers_max_grad_norm(tmp_path) -> None:
    """The step applied is the step of the gradients clipped to ``max_grad_norm``, once."""
    from transformers import Trainer, TrainingArguments

    runs = []
    for guarded_run in (False, True):
        model = _Net(1)
        if guarded_run:
            trainer, _, _ = _trainer(
                tmp_path / "g", model, _data(4 * 6), {"check_every": 3}, max_grad_norm=0.5
            )
        else:  # the same optimizer, unguarded, clipped by the Trainer
            args = TrainingArguments(
                str(tmp_path / "p"),
                per_device_train_batch_size=4,
                max_grad_norm=0.5,
                num_train_epochs=1,
                report_to="none",
                use_cpu=True,
                seed=0,
                disable_tqdm=True,
                save_strategy="no",
                train_sampling_strategy="sequential",
            )
            adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            constant = torch.optim.lr_scheduler.LambdaLR(adamw, lambda step: 1.0)
            trainer = Trainer(
                model=model, args=args, train_dataset=_data(4 * 6), optimizers=(adamw, constant)
            )
        trainer.train()
        runs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert float((runs[0] - runs[1]).abs().max()) <= 1e-6


def test_a_guard_that_clips_beside_a_trainer_that_clips_is_refused(tmp_path) -> None:
    trainer, _, _ = _trainer(tmp_path, _Net(1), _data(8), {"check_every": 2, "max_grad_norm": 1.0})
    with pytest.raises(ValueError, match="clip once"):
        trainer.train()


@pytest.mark.parametrize("accumulation", [1, 2])
@pytest.mark.parametrize("how", ["label_smoothing_factor", "compute_loss_func"])
def test_the_loss_the_trainer_optimises_is_monitored(tmp_path, how, accumulation) -> None:
    """Label smoothing or ``compute_loss_func``: the loss is computed outside the model."""
    options = (
        {"label_smoothing_factor": 0.3}
        if how == "label_smoothing_factor"
        else {
            "compute_loss_func": lambda out, labels, num_items_in_batch=None: (
                3 * torch.nn.functional.cross_entropy(out["logits"], labels)
            )
        }
    )
    model = _Net(4)
    trainer, guarded, weights = _trainer(
        tmp_path,
        model,
        _data(4 * 8, classes=4),
        {"check_every": 2},
        gradient_accumulation_steps=accumulation,
        **options,
    )
    seen = _spy(guarded)
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    monitored = torch.stack(seen).view(-1, accumulation).mean(1)  # the guard's mean per step
    assert len(logged) == 8 // accumulation == guarded.steps and guarded.skipped_steps == 0
    assert torch.allclose(monitored, torch.tensor(logged), rtol=1e-6, atol=0)
    assert not torch.equal(weights[0], weights[-1])  # it trained


def test_a_reduce_on_plateau_scheduler_cuts_the_rate_on_a_plateau(tmp_path) -> None:
    """The guard steps the plateau scheduler with each window's median loss, as torch would."""
    lr = 1e-7  # too small to learn: the loss plateaus
    plateau = functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, patience=0, factor=0.5)
    model = _Net(1)
    trainer, guarded, _ = _trainer(
        tmp_path, model, _data(4 * 12), {"check_every": 2}, plateau, lr=lr
    )
    trainer.train()
    medians = [report["loss"]["median"] for report in guarded.reports]
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    replay = plateau(reference)
    for median in medians:
        replay.step(median)
    assert len(medians) == 6 and reference.param_groups[0]["lr"] < lr  # a cut happened
    assert float(guarded.optimizer.param_groups[0]["lr"]) == reference.param_groups[0]["lr"]


def test_without_the_trainer_at_hand_the_models_loss_is_monitored(tmp_path, monkeypatch) -> None:
    """The fallback (no ``Trainer`` found up the stack): each training forward's
    ``outputs.loss``."""
    from trainopt.stability.integrations import hf

    monkeypatch.setattr(hf, "_calling_trainer", lambda callback: None)
    trainer, guarded, weights = _trainer(
        tmp_path, _Net(1, boost_call=25), _data(4 * 30), {"check_every": 5}
    )
    seen = _spy(guarded)
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert torch.allclose(torch.stack(seen), torch.tensor(logged), rtol=1e-6, atol=0)
    assert guarded.skipped_steps == 1 and torch.equal(weights[25], weights[24])
