"""The benchmark harness (trainopt.perf.bench): configurations, the timer, measuring, running a
matrix."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.models import GPT, gpt_config
from trainopt.perf.bench.configs import BenchConfig, build_matrix
from trainopt.perf.bench.harness import (
    build_model,
    build_optimizer,
    make_train_step,
    measure,
    run_matrix,
    speedup,
)
from trainopt.perf.bench.timer import interleaved_windows, spread, time_windows, warm_up
from trainopt.perf.estimate import estimate_training_memory
from trainopt.perf.precision import Precision

FAST = {"warmup_steps": 1, "max_warmup_steps": 4, "steps": 2, "windows": 2}
PEAKS = {"fp32": 1.0, "bf16": 4.0}  # TFLOP/s given for the CPU, one per precision


@pytest.fixture(scope="module")
def cpu_results() -> dict[str, Any]:
    """A small real run: the plain loop, bf16 + fused AdamW, and fp16, which a CPU can't run."""
    configs = [
        BenchConfig(batch_size=2, seq_len=16, label="plain"),
        BenchConfig(
            batch_size=2, seq_len=16, precision="bf16", optimizer="fused", label="bf16 fused"
        ),
        BenchConfig(batch_size=2, seq_len=16, precision="fp16", label="fp16"),
    ]
    results = run_matrix(configs, "cpu", peak_tflops=PEAKS, progress=False, profile_steps=1, **FAST)
    results["recipe"] = speedup(results, "plain", "bf16 fused")
    return results


# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [
        ("size", "1b"),
        ("precision", "fp8"),
        ("compile", "fast"),
        ("compile_backend", "tvm"),
        ("optimizer", "sgd"),
        ("attention", "xformers"),
        ("checkpointing", 1),
    ],
)
def test_config_names_the_field_and_the_allowed_values(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be one of \[.+\], got {field}="):
        BenchConfig(**{field: value})


@pytest.mark.parametrize(
    "field, value", [("batch_size", 0), ("batch_size", True), ("seq_len", 65), ("seq_len", -1)]
)
def test_config_rejects_bad_shapes(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        BenchConfig(**{field: value})


def test_sequence_length_zero_means_block_size() -> None:
    config = BenchConfig(size="tiny", batch_size=3)
    assert config.sequence_length == 64 and config.tokens_per_step == 3 * 64


def test_matrix_varies_one_field_at_a_time_around_the_base() -> None:
    base = BenchConfig()
    configs = build_matrix(base, {"precision": ["fp32", "bf16", "fp16"], "compile": ["default"]})
    assert configs[0] == base and len(configs) == 4
    for config in configs[1:]:
        assert sum(getattr(config, k) != getattr(base, k) for k in ("precision", "compile")) == 1


def test_grid_matrix_is_the_cartesian_product() -> None:
    configs = build_matrix(
        BenchConfig(), {"precision": ["fp32", "bf16"], "batch_size": [2, 4, 8]}, grid=True
    )
    assert {(c.precision, c.batch_size) for c in configs} == {
        (p, b) for p in ("fp32", "bf16") for b in (2, 4, 8)
    }


def test_matrix_rejects_an_unknown_axis() -> None:
    with pytest.raises(ValueError, match="axes keys must be fields of BenchConfig"):
        build_matrix(BenchConfig(), {"learning_rate": [1e-3]})


# ---------------------------------------------------------------------------------------------
# The timer: windows, spread, warm-up until stable
# ---------------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=1e-6, max_value=10.0), min_size=1, max_size=30))
def test_spread_agrees_with_numpy_percentiles(values: list[float]) -> None:
    s = spread(values)
    assert np.allclose(
        [s["q1"], s["median"], s["q3"]], np.percentile(values, [25, 50, 75]), rtol=1e-9, atol=1e-12
    )
    assert (s["min"], s["max"]) == (min(values), max(values))


class FakeClock:
    """``time.perf_counter`` that only moves when a scripted step says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def steps(self, durations: list[float]):
        remaining = iter(durations)

        def step() -> None:
            self.now += next(remaining)

        return step


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(time, "perf_counter", fake)
    return fake


def test_warm_up_runs_until_two_windows_agree_within_ten_percent(clock: FakeClock) -> None:
    step = clock.steps([5.0, 5.0] + [2.0] * 3 + [1.0] * 3 + [1.09] * 3 + [1.0] * 30)
    result = warm_up(step, "cpu", min_steps=2, window=3, max_steps=30)
    assert result["stable"] and result["steps"] == 2 + 3 * 3
    assert result["window_s"] == pytest.approx([2.0, 1.0, 1.09])


def test_warm_up_stops_at_its_cap_and_says_it_never_settled(clock: FakeClock) -> None:
    step = clock.steps(
        [1.0, 1.0, 1.12, 1.12] * 10
    )  # windows of 2: 1.0, 1.12, 1.0, ... never within 10%
    result = warm_up(step, "cpu", min_steps=0, window=2, max_steps=8)
    assert (
        not result["stable"]
        and result["steps"] == 8
        and result["window_s"] == pytest.approx([1.0, 1.12] * 2)
    )


def test_interleaved_windows_rotate_who_goes_first(clock: FakeClock) -> None:
    order: list[str] = []
    steps = {name: (lambda name=name: order.append(name)) for name in ("a", "b", "c")}
    times = interleaved_windows(steps, "cpu", steps_per_window=1, windows=3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"] and all(
        len(t) == 3 for t in times.values()
    )


def test_cpu_windows_measure_the_work_done(clock: FakeClock) -> None:
    assert time_windows(
        clock.steps([0.5, 0.7, 0.2, 0.2]), "cpu", steps=2, windows=2
    ) == pytest.approx([0.6, 0.2])


class _FakeEvent:
    log: list[str] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing

    def record(self) -> None:
        self.log.append("record")

    def synchronize(self) -> None:
        self.log.append("sync")

    def elapsed_time(self, other: _FakeEvent) -> float:
        return 30.0


def test_cuda_windows_record_two_events_each_and_sync_once_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    times = time_windows(
        lambda: _FakeEvent.log.append("step"), torch.device("cuda"), steps=3, windows=2
    )
    assert _FakeEvent.log == ["record", "step", "step", "step", "record"] * 2 + ["sync"]
    assert times == [pytest.approx(0.030 / 3)] * 2


# ---------------------------------------------------------------------------------------------
# Building and measuring
# ---------------------------------------------------------------------------------------------


def test_checkpointed_model_gives_the_same_loss_and_gradients() -> None:
    x, y = torch.randint(0, 512, (2, 2, 16))
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model(BenchConfig(checkpointing=checkpointing), "cpu")
        loss = model(x, targets=y)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[0][1], grads[1][1]))


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_uses_the_chosen_adamw_implementation(impl: str) -> None:
    optimizer = build_optimizer(BenchConfig(optimizer=impl), GPT(gpt_config("tiny")))
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults[impl] is True


def _flops_per_token_by_hand(size: str, seq_len: int) -> int:
    model = GPT(gpt_config(size))
    n = sum(p.numel() for name, p in model.named_parameters() if name != "wpe.weight")
    return 6 * n + 12 * model.config.n_layer * model.config.n_embd * seq_len


def test_tokens_per_s_and_mfu_by_hand_from_the_window_times(cpu_results: dict[str, Any]) -> None:
    for record in cpu_results["results"][:2]:
        median = statistics.median(record["window_step_times_s"])  # raw timings → median, by hand
        tokens_per_s = 2 * 16 / median
        per_token = _flops_per_token_by_hand("tiny", 16)
        peak = (
            PEAKS[record["config"]["precision"]] * 1e12
        )  # fp32 divided by the fp32 peak, bf16 by bf16's
        assert record["flops_per_token"] == per_token
        assert record["tokens_per_s"] == pytest.approx(tokens_per_s, rel=1e-12)
        assert record["mfu"] == pytest.approx(tokens_per_s * per_token / peak, rel=1e-12)
        assert (record["step_time_s"]["min"], record["step_time_s"]["max"]) == (
            min(record["window_step_times_s"]),
            max(record["window_step_times_s"]),
        )


def test_measure_records_its_warm_up(cpu_results: dict[str, Any]) -> None:
    for record in cpu_results["results"][:2]:
        warmup = record["warmup"]
        assert 1 + 2 * 2 <= warmup["steps"] <= 4 + 2 * 2 and isinstance(warmup["stable"], bool)
        assert len(warmup["window_s"]) == (warmup["steps"] - 1) // 2 and warmup["seconds"] > 0


def test_cpu_peak_memory_is_measured_and_matches_the_estimate(cpu_results: dict[str, Any]) -> None:
    plain = cpu_results["results"][0]
    assert plain["memory_method"] == "live storages"
    estimate = estimate_training_memory(
        GPT(gpt_config("tiny")), "fp32", batch_size=2, seq_len=16, implementation="foreach"
    )
    assert abs(estimate.peak / plain["peak_memory_bytes"] - 1) < 0.05


def test_measure_reports_an_unsupported_precision_instead_of_failing(
    cpu_results: dict[str, Any],
) -> None:
    record = cpu_results["results"][2]
    assert (
        record["status"] == "unsupported"
        and "fp16" in record["error"]
        and "['fp32', 'bf16']" in record["error"]
    )


def test_a_cpu_without_a_given_peak_gets_no_mfu() -> None:
    record = measure(BenchConfig(batch_size=1, seq_len=8), "cpu", **FAST)
    assert record["mfu"] is None and record["peak_flops"] is None


def test_measure_and_run_matrix_validate_step_counts_before_running() -> None:
    with pytest.raises(ValueError, match="windows must be an int >= 1, got windows=0"):
        measure(BenchConfig(), windows=0)
    with pytest.raises(ValueError, match="warmup_steps must be an int >= 0, got warmup_steps=-1"):
        run_matrix([BenchConfig()], "cpu", warmup_steps=-1, progress=False)
    with pytest.raises(ValueError, match="max_warmup_steps must be an int >= 1"):
        run_matrix([BenchConfig()], "cpu", max_warmup_steps=0, progress=False)


def test_run_matrix_on_a_gpu_missing_from_the_peak_table_fails_before_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H20")
    with pytest.raises(ValueError, match="GPU 'NVIDIA H20' is not in the peak table"):
        run_matrix([BenchConfig(precision="bf16")], "cuda", progress=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_train_step_makes_no_host_sync_on_cuda() -> None:
    config = BenchConfig(precision="bf16", optimizer="fused", batch_size=4)
    model = build_model(config, "cuda")
    step = make_train_step(
        model,
        build_optimizer(config, model),
        Precision.from_name("bf16", "cuda"),
        *torch.randint(0, 512, (2, 4, 64), device="cuda"),
    )
    step()  # the first step allocates optimizer state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---------------------------------------------------------------------------------------------
# Running a matrix
# ---------------------------------------------------------------------------------------------


def test_run_matrix_writes_results_with_their_environment(tmp_path) -> None:
    out = tmp_path / "r.json"
    run_matrix(
        [BenchConfig(batch_size=2, seq_len=8)],
        "cpu",
        out=out,
        progress=False,
        note="a test",
        **FAST,
    )
    saved = json.loads(out.read_text())
    assert (saved["schema"], saved["kind"]) == (2, "bench")
    meta = saved["meta"]
    assert meta["torch"] == torch.__version__ and meta["note"] == "a test" and meta["cpu_count"] > 0
    assert isinstance(meta["git_dirty"], bool) and len(meta["git_commit"]) == 40
    assert meta["settings"] == {
        "warmup_steps": 1,
        "max_warmup_steps": 4,
        "steps_per_window": 2,
        "windows": 2,
    }
    assert [r["status"] for r in saved["results"]] == ["ok"]


def test_time_budget_skips_a_configuration_whose_size_ran_longer_than_the_time_left(
    tmp_path,
) -> None:
    earlier = run_matrix([], "cpu", progress=False)
    earlier["results"].append(
        {"name": "slow", "config": {"size": "tiny"}, "status": "ok", "duration_s": 1000.0}
    )
    configs = [
        BenchConfig(batch_size=2, seq_len=8),
        BenchConfig(size="small", batch_size=2, seq_len=8),
    ]
    results = run_matrix(
        configs,
        "cpu",
        time_budget_s=100.0,
        progress=False,
        results=earlier,
        out=tmp_path / "r.json",
        **FAST,
    )
    assert [r["status"] for r in results["results"]] == ["ok", "skipped", "ok"]
    assert "time budget of 100 s reached" in results["results"][1]["error"]


def test_time_budget_spent_skips_everything_and_keeps_the_file(tmp_path) -> None:
    results = run_matrix(
        [BenchConfig(batch_size=2, seq_len=8)],
        "cpu",
        time_budget_s=5.0,
        started=time.perf_counter() - 10.0,
        progress=False,
        out=tmp_path / "r.json",
        **FAST,
    )
    assert [r["status"] for r in results["results"]] == ["skipped"]
    assert json.loads((tmp_path / "r.json").read_text()) == results


def test_a_failing_configuration_is_recorded_and_the_run_goes_on() -> None:
    if torch.cuda.is_available():
        pytest.skip("cuDNN attention may run on this machine")
    configs = [
        BenchConfig(batch_size=2, seq_len=8, attention="cudnn"),
        BenchConfig(batch_size=2, seq_len=8),
    ]
    results = run_matrix(configs, "cpu", progress=False, **FAST)
    assert [r["status"] for r in results["results"]] == ["error", "ok"]


def test_speedup_is_candidate_over_baseline_throughput() -> None:
    results = {
        "results": [
            {"name": "plain", "status": "ok", "tokens_per_s": 1000.0},
            {"name": "recipe", "status": "ok", "tokens_per_s": 2500.0},
            {"name": "broken", "status": "oom"},
        ]
    }
    assert speedup(results, "plain", "recipe")["speedup"] == 2.5  # an inverted ratio would give 0.4
    assert speedup(results, "plain", "broken")["speedup"] is None
    with pytest.raises(ValueError, match="no results named"):
        speedup(results, "plain", "nope")


def test_measured_speedup_by_hand_from_the_window_times(cpu_results: dict[str, Any]) -> None:
    plain, fused = cpu_results["results"][:2]
    by_hand = statistics.median(plain["window_step_times_s"]) / statistics.median(
        fused["window_step_times_s"]
    )
    assert cpu_results["recipe"]["speedup"] == pytest.approx(
        by_hand, rel=1e-12
    )  # equal shapes: a step-time ratio
