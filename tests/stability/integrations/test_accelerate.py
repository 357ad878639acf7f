"""trainopt inside an Accelerate loop: equal runs, a NaN batch as if removed, no added sync, bitwise
resume (2 ranks: test_ranks.py)."""

from __future__ import annotations

import torch
from extras import require

require("accelerate", "hf")

from trainopt_site.stability.integrations.checks import accelerate_run  # noqa: E402

TOLERANCE = 1e-6  # a rate that changes inside a window reaches the optimizer as a float32 tensor


def max_diff(a: dict, b: dict) -> float:
    return float((a["weights"] - b["weights"]).abs().max())


def test_with_nothing_to_skip_the_run_equals_the_plain_run(tmp_path) -> None:
    plain, guarded = (
        accelerate_run(str(tmp_path / "a"), None),
        accelerate_run(str(tmp_path / "b"), {"check_every": 4}),
    )
    assert max_diff(plain, guarded) <= TOLERANCE and guarded["skipped"] == 0


def test_a_nan_batch_is_as_if_removed_from_the_data(tmp_path) -> None:
    guarded = accelerate_run(str(tmp_path / "a"), {"check_every": 4}, n_batches=13, nan_batch=5)
    removed = accelerate_run(str(tmp_path / "b"), None, n_batches=13, drop_batch=5)
    assert guarded["skipped"] == 1 and max_diff(guarded, removed) <= TOLERANCE


def test_trainopt_adds_no_host_sync_per_step(tmp_path) -> None:
    """In steady state (no boundary), the same count per step as without trainopt: none."""
    plain = accelerate_run(str(tmp_path / "a"), None, count_syncs=True)["syncs"]
    guarded = accelerate_run(str(tmp_path / "b"), {"check_every": 100}, count_syncs=True)["syncs"]
    assert len(guarded) >= 10 and guarded == plain


def test_resuming_from_the_frameworks_checkpoint_continues_bitwise(tmp_path) -> None:
    full = accelerate_run(
        str(tmp_path), {"check_every": 4}, nan_batch=2, save_at=5
    )  # save_state at step 5
    resumed = accelerate_run(str(tmp_path), {"check_every": 4}, nan_batch=2, resume=5)
    assert (
        torch.equal(full["weights"], resumed["weights"])
        and resumed["skipped"] == full["skipped"] == 1
    )
