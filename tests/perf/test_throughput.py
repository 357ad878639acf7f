"""Tests of trainopt.perf.throughput: the monitor, its MFU, its outputs and alerts."""

from __future__ import annotations

import sys
from itertools import count

import pytest
import torch
from extras import require
from hypothesis import given
from hypothesis import strategies as st

from trainopt.models import GPT, gpt_config
from trainopt.perf import throughput
from trainopt.perf.bench.mfu import mfu
from trainopt.perf.throughput import (
    MemoryNearLimitAlert,
    ThroughputDropAlert,
    ThroughputMonitor,
    read_jsonl,
)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture
def clock(monkeypatch):
    """perf_counter that advances by the seconds in ``clock.steps`` (default 0.1 s) per call."""
    ticks = count()

    class Clock:
        step = 0.1

    def fake() -> float:
        return next(ticks) * Clock.step

    monkeypatch.setattr(throughput.time, "perf_counter", fake)
    return Clock


@pytest.mark.parametrize(
    "precision, tflops", [("fp32", 66.9), ("tf32", 494.7), ("bf16", 989.4), ("fp16", 989.4)]
)
def test_monitor_divides_by_the_peak_of_the_precision_it_trains_in(monkeypatch, precision, tflops):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monitor = ThroughputMonitor(
        tokens_per_step=8, flops_per_token=1e6, precision=precision, device="cuda"
    )
    assert monitor.peak == pytest.approx(
        tflops * 1e12, rel=1e-12
    )  # the data sheet's dense figure, typed here by hand


def test_monitor_on_a_gpu_missing_from_the_table_asks_for_its_peak(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H20")
    with pytest.raises(ValueError, match="GPU 'NVIDIA H20' is not in the peak table"):
        ThroughputMonitor(tokens_per_step=8, flops_per_token=1e6, device="cuda")
    assert (
        ThroughputMonitor(
            tokens_per_step=8, flops_per_token=1e6, device="cuda", peak_flops=3e14
        ).peak
        == 3e14
    )


def test_monitor_on_a_cpu_reports_no_mfu_without_a_given_peak(clock):
    monitor = ThroughputMonitor(tokens_per_step=100, flops_per_token=1e9, log_every=2)
    for _ in range(3):
        monitor.step()
    assert monitor.peak is None and "mfu" not in monitor.records[0]


@given(flops=st.floats(1e6, 1e12), tokens=st.floats(1.0, 1e7), peak=st.floats(1e12, 1e16))
def test_mfu_is_linear_in_throughput(flops, tokens, peak):
    assert mfu(flops, 2 * tokens, peak) == pytest.approx(2 * mfu(flops, tokens, peak))


def test_mfu_of_gpt_uses_its_flops_per_token():
    model = GPT(gpt_config("tiny"))
    per_token = model.flops_per_token(64)
    assert per_token == 6 * model.num_parameters(non_embedding=True) + 12 * 2 * 64 * 64
    assert mfu(per_token, 1e6, per_token * 2e6) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="peak must be positive"):
        mfu(per_token, 1.0, 0.0)


def test_monitor_reports_tokens_samples_step_time_and_mfu(clock):
    monitor = ThroughputMonitor(
        tokens_per_step=1000, samples_per_step=4, flops_per_token=1e9, peak_flops=1e14, log_every=5
    )
    for _ in range(11):  # the first call only marks the start: 10 intervals of 0.1 s
        monitor.step()
    assert len(monitor.records) == 2
    record = monitor.records[-1]
    assert record["step"] == 11 and record["steps"] == 5
    assert record["step_time_median_ms"] == pytest.approx(100.0)
    assert record["tokens_per_s"] == pytest.approx(10_000.0)
    assert record["samples_per_s"] == pytest.approx(40.0)
    assert record["mfu"] == pytest.approx(1e9 * 1e4 / 1e14)
    assert "memory_peak_bytes" not in record  # no allocator statistics on a CPU


def test_flush_writes_the_partial_window(clock):
    monitor = ThroughputMonitor(tokens_per_step=10, log_every=100)
    for _ in range(4):
        monitor.step()
    monitor.flush()
    assert [r["steps"] for r in monitor.records] == [3]


def test_records_go_to_jsonl(clock, tmp_path):
    path = tmp_path / "logs" / "throughput.jsonl"
    monitor = ThroughputMonitor(tokens_per_step=10, log_every=2, jsonl_path=path)
    for _ in range(5):
        monitor.step()
    assert read_jsonl(path) == monitor.records and len(monitor.records) == 2


def test_records_go_to_a_writer_with_add_scalar(clock):
    calls = []

    class Writer:
        def add_scalar(self, tag, value, step):
            calls.append((tag, value, step))

    monitor = ThroughputMonitor(tokens_per_step=10, log_every=2, writer=Writer())
    for _ in range(3):
        monitor.step()
    assert ("throughput/tokens_per_s", pytest.approx(100.0), 3) in calls


def test_missing_tensorboard_warns_and_keeps_jsonl(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if it were not installed
    with pytest.warns(RuntimeWarning, match="tensorboard is not installed"):
        monitor = ThroughputMonitor(tokens_per_step=10, tensorboard_dir=tmp_path)
    assert monitor.writer is None


def test_tensorboard_writes_event_files(clock, tmp_path):
    require("tensorboard", "test")
    monitor = ThroughputMonitor(tokens_per_step=10, log_every=2, tensorboard_dir=tmp_path)
    for _ in range(3):
        monitor.step()
    monitor.writer.flush()
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_throughput_drop_alert_fires_on_a_slow_window(clock):
    messages = []
    monitor = ThroughputMonitor(
        tokens_per_step=100,
        log_every=2,
        alerts=[ThroughputDropAlert(0.8)],
        on_alert=messages.append,
    )
    for _ in range(5):
        monitor.step()
    assert messages == []
    clock.step = 0.2  # steps now take twice as long
    for _ in range(2):
        monitor.step()
    assert len(messages) == 1 and "throughput dropped" in messages[0]


def test_default_alert_handler_is_a_warning(clock):
    monitor = ThroughputMonitor(tokens_per_step=100, log_every=1, alerts=[lambda r, h: "slow"])
    monitor.step()
    with pytest.warns(RuntimeWarning, match="slow"):
        monitor.step()


def test_memory_alert_uses_limit_or_device_total():
    alert = MemoryNearLimitAlert(0.9)
    assert alert({"step": 1, "memory_peak_bytes": 95, "memory_total_bytes": 100}, []) is not None
    assert alert({"step": 1, "memory_peak_bytes": 85, "memory_total_bytes": 100}, []) is None
    assert (
        MemoryNearLimitAlert(0.5, limit_bytes=100)({"step": 1, "memory_peak_bytes": 60}, [])
        is not None
    )
    assert alert({"step": 1}, []) is None  # CPU records carry no memory


def test_state_dict_round_trip_continues_counting(clock):
    monitor = ThroughputMonitor(tokens_per_step=10, log_every=2)
    for _ in range(5):
        monitor.step()
    resumed = ThroughputMonitor(tokens_per_step=10, log_every=2)
    resumed.load_state_dict(monitor.state_dict())
    for _ in range(3):
        resumed.step()
    assert resumed.steps == 8 and len(resumed.records) == 3 and resumed.records[-1]["step"] == 8


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tokens_per_step": 0}, "tokens_per_step must be an int >= 1"),
        ({"tokens_per_step": 8, "log_every": 0}, "log_every must be an int >= 1"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ThroughputMonitor(**kwargs)


@needs_cuda
def test_cuda_monitor_never_syncs_in_step_and_resolves_later(monkeypatch):
    monitor = ThroughputMonitor(
        tokens_per_step=100, log_every=2, device="cuda", peak_flops=1e15, flops_per_token=1e6
    )

    def forbidden(*args, **kwargs):
        raise AssertionError("host-device sync in the hot path")

    monkeypatch.setattr(torch.cuda, "synchronize", forbidden)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", forbidden)
    for _ in range(5):
        torch.cuda._sleep(20_000_000)  # keep the GPU behind the host
        monitor.step()
    assert len(monitor.records) < 2  # the GPU has not reached those events yet
    monkeypatch.undo()
    monitor.flush()
    assert len(monitor.records) == 2 and monitor.records[0]["memory_total_bytes"] > 0
    assert monitor.records[0]["tokens_per_s"] > 0 and 0 < monitor.records[0]["mfu"]
