"""Ranks agree by default: with torch.distributed initialised, a TrainingStabilizer built with no
distributed argument makes every decision the same on every rank.

One launch of 2 gloo processes runs ``rank_agreement_check`` (DDP on the digits MLP): a loss
spike that rank 1 alone sees, a NaN loss that rank 0 alone sees, then ten loss spikes in a row on
rank 1 alone that call for a rollback. The control run lets each rank agree only with itself.
"""

from __future__ import annotations

import pytest
import torch

from trainopt.perf.distributed.processes import launch
from trainopt_site.stability.rank_agreement import rank_agreement_check


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    # A broken agreement (ranks calling different collectives) fails in seconds instead of hanging:
    # a collective waits 20 s at most, and ranks still running after 180 s are stopped.
    return launch(
        rank_agreement_check,
        2,
        str(tmp_path_factory.mktemp("agreement")),
        backend="gloo",
        timeout=180,
        collective_timeout=20,
    )


def test_a_spike_or_a_nan_seen_by_one_rank_is_skipped_on_both_and_the_ranks_stay_bitwise_equal(
    ranks,
) -> None:
    zero, one = ranks[0]["agreed"], ranks[1]["agreed"]
    assert torch.equal(zero["weights"], one["weights"])
    assert (
        zero["skip_events"] == one["skip_events"] >= 2 + 10
    )  # the spike, the NaN, the 10 later spikes
    window = zero["reports"][2]
    assert window["step"] == 30 and window["skipped"] == 2 == one["reports"][2]["skipped"]


def test_boundary_statistics_are_reduced_before_deciding(ranks) -> None:
    zero, one = ranks[0]["agreed"], ranks[1]["agreed"]
    assert zero["reports"] == one["reports"]
    assert (
        zero["reports"][2]["spikes"] == 1 and zero["reports"][2]["nonfinite"] == 1
    )  # each from one rank


def test_a_rollback_triggered_by_one_ranks_statistics_happens_on_all_ranks(ranks) -> None:
    zero, one = ranks[0]["agreed"], ranks[1]["agreed"]
    assert zero["rollbacks"] == one["rollbacks"] == [40]
    assert zero["lr"] == one["lr"] == pytest.approx(1.5e-3)


def test_checkpoints_have_one_writer(ranks) -> None:
    assert ranks[0]["agreed"]["writes"] >= 2 and ranks[1]["agreed"]["writes"] == 0


def test_the_control_without_agreement_drifts_apart(ranks) -> None:
    """Each rank agreeing with itself alone: rank 1 skips the spike rank 0 applies, and so on."""
    zero, one = ranks[0]["rank_local"], ranks[1]["rank_local"]
    assert not torch.equal(zero["weights"], one["weights"])
    assert zero["skip_events"] != one["skip_events"]
    assert zero["rollbacks"] != one["rollbacks"]
