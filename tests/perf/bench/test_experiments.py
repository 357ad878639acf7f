"""The measurements behind the precision, memory, profiling and monitoring pages
(trainopt.perf.bench.experiments)."""

from __future__ import annotations

import copy
import pickle
import statistics
from typing import Any

import pytest
import torch

from trainopt.perf.bench import experiments
from trainopt.perf.bench.experiments import _relative, run, write_snapshot
from trainopt_site.perf.bench.report import render

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
BATCH, SEQ = 2, 16


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    return run(
        "tiny",
        device="cpu",
        batch_size=BATCH,
        seq_len=SEQ,
        steps=3,
        warmup=1,
        max_warmup=6,
        command="python -m trainopt.perf.bench experiments --size tiny",
        note="a test",
    )


def _median_ms(row: dict[str, Any]) -> float:
    return statistics.median(row["step_times_ms"])  # from the raw per-step times, by hand


def test_results_hold_every_section_and_their_environment(results: dict[str, Any]) -> None:
    assert results["kind"] == "experiments" and results["meta"]["note"] == "a test"
    assert set(results) >= {
        "meta",
        "model",
        "optimizer",
        "precision",
        "checkpointing",
        "phases",
        "top_operators",
    }
    assert (
        results["meta"]["torch"] == torch.__version__
        and results["model"]["tokens_per_step"] == BATCH * SEQ
    )


def test_unsupported_precisions_are_recorded_with_the_reason(results: dict[str, Any]) -> None:
    rows = {r["precision"]: r for r in results["precision"]}
    assert rows["fp32"]["supported"] and rows["bf16"]["supported"]
    assert not rows["fp16"]["supported"] and "needs a CUDA GPU" in rows["fp16"]["reason"]


def test_throughput_and_speedup_by_hand_from_the_step_times(results: dict[str, Any]) -> None:
    rows = {r["precision"]: r for r in results["precision"] if r["supported"]}
    fp32 = _median_ms(rows["fp32"])
    for row in rows.values():
        median = _median_ms(row)
        assert row["step_time_median_ms"] == pytest.approx(median, rel=1e-12)
        assert row["tokens_per_s"] == pytest.approx(BATCH * SEQ * 1e3 / median, rel=1e-12)
        assert row["samples_per_s"] == pytest.approx(BATCH * 1e3 / median, rel=1e-12)
        assert row["speedup_vs_fp32"] == pytest.approx(
            fp32 / median, rel=1e-12
        )  # > 1 means faster than fp32
        assert row["mfu"] is None and row["warmup"]["steps"] >= 1 + 2 * 3


def test_the_estimate_is_within_5_percent_of_the_peak_measured_on_this_cpu(
    results: dict[str, Any],
) -> None:
    rows = [r for r in results["precision"] if r["supported"]] + results["checkpointing"]["rows"][
        1:
    ]
    estimated = [r for r in rows if r.get("estimate_bytes") is not None]
    assert (
        len(estimated) == 4
    )  # fp32, bf16, every block, every 2nd block (selective has no estimate)
    for row in estimated:
        assert row["estimate_error"] == pytest.approx(
            row["estimate_bytes"] / row["peak_memory_bytes"] - 1
        )
        assert abs(row["estimate_error"]) < 0.05, row


def test_checkpointing_rows_against_the_same_baseline_by_hand(results: dict[str, Any]) -> None:
    section = results["checkpointing"]
    rows = {r["policy"]: r for r in section["rows"]}
    assert list(rows) == ["none", "every block", "every 2nd block", "selective"]
    assert [r["checkpointed_layers"] for r in rows.values()] == [0, 2, 1, 2]
    base = rows["none"]
    for row in rows.values():
        assert row["time_change"] == pytest.approx(
            row["step_time_median_ms"] / base["step_time_median_ms"] - 1
        )
        assert row["memory_change"] == pytest.approx(
            row["peak_memory_bytes"] / base["peak_memory_bytes"] - 1
        )
    # at 2 × 16 tokens the gradients, not the activations, set the peak: checkpointing can only
    # keep it
    assert (
        rows["every block"]["peak_memory_bytes"]
        <= rows["every 2nd block"]["peak_memory_bytes"]
        <= base["peak_memory_bytes"]
    )


def test_goal_is_thirty_percent_less_memory_for_at_most_twenty_percent_more_time() -> None:
    base = {
        "policy": "none",
        "checkpointed_layers": 0,
        "step_time_median_ms": 100.0,
        "step_time_ms": {},
        "peak_memory_bytes": 1000,
        "estimate_bytes": None,
        "estimate_error": None,
    }
    good = base | {"policy": "every block", "step_time_median_ms": 118.0, "peak_memory_bytes": 650}
    assert _relative(good, base)["memory_change"] == pytest.approx(-0.35)
    assert _relative(good, base)["meets_goal"] is True
    assert _relative(good | {"step_time_median_ms": 125.0}, base)["meets_goal"] is False
    assert _relative(good | {"peak_memory_bytes": 750}, base)["meets_goal"] is False


def test_phases_are_measured_on_a_cpu_too(results: dict[str, Any]) -> None:
    rows = {r["phase"]: r for r in results["phases"]["rows"]}
    assert list(rows) == ["forward", "backward", "optimizer"]
    assert all(r["reserved"] is None and r["peak"] >= r["allocated"] > 0 for r in rows.values())
    assert (
        rows["optimizer"]["allocated"] < rows["backward"]["allocated"]
    )  # zero_grad freed the gradients


def test_top_operators_are_sorted_by_self_time(results: dict[str, Any]) -> None:
    times = [r["self_cpu_us"] for r in results["top_operators"]["rows"]]
    assert times == sorted(times, reverse=True) and len(times) == 10


def test_a_failing_configuration_is_recorded_and_the_rest_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = experiments.measure

    def flaky(**kwargs: Any) -> dict[str, Any]:
        if kwargs.get("policy") == "every 2nd block":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(**kwargs)

    monkeypatch.setattr(experiments, "measure", flaky)
    out = run("tiny", device="cpu", batch_size=1, seq_len=8, steps=1, warmup=1, max_warmup=2)
    rows = {r["policy"]: r for r in out["checkpointing"]["rows"]}
    assert rows["every 2nd block"]["error"].startswith("OutOfMemoryError: CUDA out of memory")
    assert "error" not in rows["every block"] and "error" not in rows["selective"]
    assert "| every 2nd block | failed: OutOfMemoryError" in render(out, ["checkpointing"])


def _with_changes(
    results: dict[str, Any], changes: dict[str, tuple[float, float]]
) -> dict[str, Any]:
    changed = copy.deepcopy(results)
    for row in changed["checkpointing"]["rows"]:
        if row["policy"] in changes:
            row["memory_change"], row["time_change"] = changes[row["policy"]]
            row["meets_goal"] = row["memory_change"] <= -0.30 and row["time_change"] <= 0.20
    return changed


def test_recommendation_picks_the_cheapest_policy_meeting_the_goal(results: dict[str, Any]) -> None:
    changed = _with_changes(
        results,
        {
            "every block": (-0.40, 0.18),
            "every 2nd block": (-0.31, 0.09),
            "selective": (-0.10, 0.02),
        },
    )
    assert render(changed, ["recommendation"]).startswith(
        "Recommended on this setup: **every 2nd block** (-31% peak memory, +9% step time)"
    )


def test_recommendation_says_when_no_policy_meets_the_goal(results: dict[str, Any]) -> None:
    changed = _with_changes(
        results,
        {
            "every block": (-0.29, 0.22),
            "every 2nd block": (-0.15, 0.11),
            "selective": (-0.05, 0.03),
        },
    )
    text = render(changed, ["recommendation"])
    assert "No policy met the goal" in text and "largest saving came from **every block**" in text
    assert "cheapest policy was **selective**" in text


def test_cpu_tables_leave_out_mfu_and_say_why_in_one_line(results: dict[str, Any]) -> None:
    for part in ("precision", "throughput"):
        text = render(results, [part])
        assert "MFU" not in text.splitlines()[0 if part == "precision" else 2]
        assert sum("a CPU has none" in line for line in text.splitlines()) == 1


def test_a_snapshot_needs_a_cuda_device(tmp_path) -> None:
    with pytest.raises(ValueError, match="device must be a CUDA device, got 'cpu'"):
        write_snapshot(
            tmp_path / "s.pickle", "tiny", "fp32", torch.device("cpu"), batch_size=2, seq_len=16
        )
    assert not (tmp_path / "s.pickle").exists()


@needs_cuda
def test_a_snapshot_of_three_steps_is_written_and_loads(tmp_path) -> None:
    path = write_snapshot(
        tmp_path / "s.pickle", "tiny", "bf16", torch.device("cuda"), batch_size=2, seq_len=16
    )
    with open(path, "rb") as f:
        snapshot = pickle.load(f)  # noqa: S301 - our own file
    assert any(event["action"] == "alloc" for trace in snapshot["device_traces"] for event in trace)


@needs_cuda
def test_a_gpu_run_measures_memory_with_the_allocator_and_mfu_with_its_peak() -> None:
    out = run("tiny", device="cuda", batch_size=2, seq_len=16, steps=2, warmup=1, max_warmup=4)
    rows = [r for r in out["precision"] if r["supported"]]
    assert all(r["mfu"] is not None and 0 < r["mfu"] < 1 for r in rows)
    assert (
        all(r["peak_memory_bytes"] > 0 for r in rows)
        and out["phases"]["rows"][0]["reserved"] is not None
    )
