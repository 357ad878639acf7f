"""Tests of trainopt.perf.profiling: percentiles, the step timer and the profiler wrapper."""

from __future__ import annotations

import json
from itertools import count

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from trainopt.perf import profiling
from trainopt.perf.profiling import StepProfiler, StepTimer, percentile, profile_steps, summarize

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@given(values=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), q=st.floats(0, 100))
def test_percentile_agrees_with_numpy(values, q):
    assert percentile(values, q) == pytest.approx(
        float(np.percentile(values, q)), rel=1e-9, abs=1e-6
    )


def test_percentile_rejects_empty_and_out_of_range():
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"q must be in \[0, 100\]"):
        percentile([1.0], 101)


def test_summarize_reports_median_and_tails():
    stats = summarize([float(v) for v in range(1, 101)])
    assert (
        stats["median_ms"] == 50.5
        and stats["p90_ms"] == pytest.approx(90.1)
        and stats["count"] == 100
    )


def test_cpu_timer_drops_warmup_and_measures_intervals(monkeypatch):
    ticks = count()
    monkeypatch.setattr(profiling.time, "perf_counter", lambda: float(next(ticks)) * 0.01)
    timer = StepTimer("cpu", warmup=2)
    for _ in range(5):
        with timer.step():
            pass
    assert timer.times_ms() == pytest.approx([10.0, 10.0, 10.0])  # 3 of 5 steps, 10 ms each


def test_timer_without_timed_steps_says_so():
    timer = StepTimer("cpu", warmup=3)
    with timer.step():
        pass
    with pytest.raises(ValueError, match="no timed steps after warmup=3"):
        timer.summary()


def test_timer_rejects_negative_warmup():
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        StepTimer("cpu", warmup=-1)


def test_timer_reset_forgets_steps():
    timer = StepTimer("cpu", warmup=0)
    with timer.step():
        pass
    timer.reset()
    assert timer.times_ms() == []


def test_profiler_schedule_length_and_invalid_arguments():
    assert StepProfiler("cpu", wait=2, warmup=1, active=3, repeat=2).total_steps == 12
    with pytest.raises(ValueError, match="active must be an int >= 1"):
        StepProfiler("cpu", active=0)


def test_profiler_writes_one_chrome_trace_per_cycle(tmp_path):
    model = torch.nn.Linear(16, 16)
    prof = profile_steps(
        lambda: model(torch.randn(4, 16)).sum().backward(),
        "cpu",
        wait=0,
        warmup=1,
        active=1,
        repeat=2,
        trace_dir=tmp_path,
    )
    assert [p.name for p in prof.traces] == ["trace_0.json", "trace_1.json"]
    trace = json.loads(prof.traces[0].read_text())
    assert any(e.get("name") == "aten::addmm" for e in trace["traceEvents"])


def test_top_operators_are_sorted_by_self_time_and_table_lists_them():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
    prof = profile_steps(lambda: model(torch.randn(32, 64)).sum().backward(), "cpu", active=2)
    ops = prof.top_operators(5)
    assert len(ops) == 5
    assert [op.self_cpu_us for op in ops] == sorted((op.self_cpu_us for op in ops), reverse=True)
    assert ops[0].name in prof.table(row_limit=5)


@needs_cuda
def test_cuda_timer_measures_gpu_time_without_syncing_each_step(monkeypatch):
    timer = StepTimer("cuda", warmup=1)
    real_sync = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("synced in a step"))
    for cycles in (1_000, 1_000, 50_000_000):
        with timer.step():
            torch.cuda._sleep(cycles)  # GPU busy-wait; returns to Python at once
    monkeypatch.setattr(torch.cuda, "synchronize", real_sync)
    short, long = timer.times_ms()
    assert long > 10 * short  # perf_counter around the launch would see ~0 for both


@needs_cuda
def test_cuda_profiler_reports_device_time():
    model = torch.nn.Linear(256, 256).cuda()
    prof = profile_steps(
        lambda: model(torch.randn(64, 256, device="cuda")).sum().backward(), "cuda", active=2
    )
    assert prof.top_operators(3)[0].self_device_us > 0


def test_loader_wait_measures_the_time_blocked_in_next(monkeypatch):
    ticks = iter([0.0, 0.25, 1.0, 1.5, 2.0, 2.0])  # start/end of next() for 2 batches, then the end
    monkeypatch.setattr(profiling.time, "perf_counter", lambda: next(ticks))
    loader = profiling.LoaderWait(["a", "b"])
    assert list(loader) == ["a", "b"] and len(loader) == 2
    assert loader.wait_s == [0.25, 0.5]  # by hand from the ticks


def test_loader_wait_sees_a_slow_loader_and_not_a_fast_one():
    import time as real_time

    def slow():
        for batch in range(3):
            real_time.sleep(0.02)
            yield batch

    slow_wait, fast_wait = profiling.LoaderWait(slow()), profiling.LoaderWait(range(3))
    assert list(slow_wait) == list(fast_wait) == [0, 1, 2]
    assert min(slow_wait.wait_s) >= 0.02 and max(fast_wait.wait_s) < 0.01
