"""trainopt inside Lightning, automatic optimization (2 ranks: test_ranks.py).

Equal runs, a NaN batch as if removed, no added sync, bitwise resume; a x1e4 gradient skipped
under ``gradient_clip_val``, which the guard takes over, and the clipping it cannot take refused.
"""

from __future__ import annotations

import pytest
import torch
from extras import require

require("lightning", "lightning")

from trainopt_site.stability.integrations.checks import lightning_run  # noqa: E402

TOLERANCE = 1e-6  # a rate that changes inside a window reaches the optimizer as a float32 tensor


def max_diff(a: dict, b: dict) -> float:
    return float((a["weights"] - b["weights"]).abs().max())


def test_with_nothing_to_skip_the_run_equals_the_plain_run(tmp_path) -> None:
    plain, guarded = (
        lightning_run(str(tmp_path / "a"), None),
        lightning_run(str(tmp_path / "b"), {"check_every": 4}),
    )
    assert max_diff(plain, guarded) <= TOLERANCE and guarded["skipped"] == 0


def test_a_nan_batch_is_as_if_removed_from_the_data(tmp_path) -> None:
    guarded = lightning_run(str(tmp_path / "a"), {"check_every": 4}, n_batches=13, nan_batch=5)
    removed = lightning_run(str(tmp_path / "b"), None, n_batches=13, drop_batch=5)
    assert guarded["skipped"] == 1 and max_diff(guarded, removed) <= TOLERANCE


def test_trainopt_adds_no_host_sync_per_step(tmp_path) -> None:
    """In steady state (no boundary), the same count per step as without trainopt: none."""
    plain = lightning_run(str(tmp_path / "a"), None, count_syncs=True)["syncs"]
    guarded = lightning_run(str(tmp_path / "b"), {"check_every": 100}, count_syncs=True)["syncs"]
    assert len(guarded) >= 10 and guarded == plain


def test_resuming_from_the_frameworks_checkpoint_continues_bitwise(tmp_path) -> None:
    full = lightning_run(str(tmp_path / "full"), {"check_every": 5}, nan_batch=2, epochs=2)
    lightning_run(
        str(tmp_path / "a"), {"check_every": 5}, nan_batch=2, epochs=2, stop_after=1
    )  # 12 steps: mid-window
    resumed = lightning_run(
        str(tmp_path / "b"),
        {"check_every": 5},
        nan_batch=2,
        epochs=2,
        resume=str(tmp_path / "a" / "last.ckpt"),
    )
    assert (
        torch.equal(full["weights"], resumed["weights"])
        and resumed["skipped"] == full["skipped"] == 2
    )


def _boosted_fit(tmp_path, boost_batch: int | None, guard_options: dict, **trainer_options) -> dict:
    """A real ``lightning.Trainer`` on a linear task whose gradient norms stay above the clip (1).

    Batch ``boost_batch``'s gradients are x1e4 at an unchanged loss value
    (``loss + 9999 * (loss - loss.detach())``): only the gradient monitor, reading the unclipped
    norm, can see it.
    """
    import lightning as L

    from trainopt.stability.integrations import GuardedOptimizer
    from trainopt.stability.integrations.lightning import stabilizer_callback

    held, weights = {}, []
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4 * 30, 8, generator=g)
    y = 10 * x @ torch.randn(8, 1, generator=g) + 5

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, index):
            loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
            return loss + 9999 * (loss - loss.detach()) if index == boost_batch else loss

        def on_train_batch_end(self, outputs, batch, index) -> None:
            weights.append(torch.cat([p.detach().flatten().clone() for p in self.parameters()]))

        def configure_optimizers(self):
            adamw = torch.optim.AdamW(self.parameters(), lr=1e-3, fused=True)
            held["guard"] = GuardedOptimizer(adamw, **guard_options)
            return held["guard"]

    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
        callbacks=[stabilizer_callback()],
        **trainer_options,
    )
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    trainer.fit(Net(), data)
    return {"guard": held["guard"], "weights": weights, "trainer": trainer}


def test_a_1e4_gradient_is_skipped_with_gradient_clip_val(tmp_path) -> None:
    """``gradient_clip_val=1.0`` clips inside the closure: the guard takes it over."""
    run = _boosted_fit(tmp_path, 25, {"check_every": 5}, gradient_clip_val=1.0)
    guard, weights = run["guard"], run["weights"]
    assert guard.skipped_steps == 1 and guard.steps == 30
    assert torch.equal(weights[25], weights[24]) and not torch.equal(weights[26], weights[25])
    assert run["trainer"].gradient_clip_val == 1.0 and guard.max_grad_norm is None  # handed back


def test_the_guard_clips_at_gradient_clip_val(tmp_path) -> None:
    """The weights equal those of Lightning clipping an unguarded optimizer at the same norm."""
    import lightning as L

    run = _boosted_fit(tmp_path / "g", None, {"check_every": 5}, gradient_clip_val=0.5)
    guarded = run["weights"][-1]
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 1)

    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, index):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3, fused=True)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(4 * 30, 8, generator=g)
    y = 10 * x @ torch.randn(8, 1, generator=g) + 5
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path / "p"),
        gradient_clip_val=0.5,
    )
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
    trainer.fit(Plain(), data)
    plain = torch.cat([p.detach().flatten() for p in net.parameters()])
    assert float((guarded - plain).abs().max()) <= 1e-6


@pytest.mark.parametrize(
    ("guard_options", "trainer_options", "match"),
    [
        ({"max_grad_norm": 1.0}, {"gradient_clip_val": 1.0}, "clip once"),
        (
            {},
            {"gradient_clip_val": 1.0, "gradient_clip_algorithm": "value"},
            "gradient_clip_algorithm",
        ),
    ],
)
def test_clipping_the_guard_cannot_take_over_is_refused(
    tmp_path, guard_options, trainer_options, match
) -> None:
    with pytest.raises(ValueError, match=match):
        _boosted_fit(tmp_path, None, {"check_every": 5, **guard_options}, **trainer_options)
