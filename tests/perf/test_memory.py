"""Tests of trainopt.perf.memory, .estimate and .peak: checkpointing, saved bytes, the estimate of
the peak against the peak measured on a CPU (and on CUDA where present), trackers, snapshots."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.models import GPT, Block, gpt_config, synthetic_batch
from trainopt.perf.estimate import (
    CUDA_WORKSPACE_BYTES,
    bytes_per_parameter,
    estimate_training_memory,
    gpt_activation_bytes,
)
from trainopt.perf.memory import (
    MemoryTracker,
    allocator_settings,
    apply_activation_checkpointing,
    expandable_segments_in_use,
    record_memory_history,
    remove_activation_checkpointing,
    saved_activation_bytes,
)
from trainopt.perf.peak import LiveStorageTracker, measure_peak_memory

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _tiny(n_layer: int = 2, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(gpt_config("tiny", n_layer=n_layer))


def _grads(model: GPT, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    model(x, targets=y).backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("selective", [False, True])
def test_checkpointing_gives_the_same_gradients_as_storing(selective):
    model = _tiny()
    reference = copy.deepcopy(model)
    apply_activation_checkpointing(model, Block, selective=selective)
    x, y = synthetic_batch(model.config, 2, 16, generator=torch.Generator().manual_seed(0))
    for got, expected in zip(_grads(model, x, y), _grads(reference, x, y)):
        torch.testing.assert_close(got, expected)


def test_every_k_checkpoints_every_kth_matching_module():
    model = _tiny(n_layer=5)
    assert apply_activation_checkpointing(model, Block, every=2) == [
        "blocks.0",
        "blocks.2",
        "blocks.4",
    ]


def test_predicate_selects_modules():
    model = _tiny(n_layer=3)
    chosen = apply_activation_checkpointing(model, lambda m: isinstance(m, torch.nn.LayerNorm))
    assert chosen == [
        "blocks.0.ln_1",
        "blocks.0.ln_2",
        "blocks.1.ln_1",
        "blocks.1.ln_2",
        "blocks.2.ln_1",
        "blocks.2.ln_2",
        "ln_f",
    ]


@pytest.mark.parametrize("every", [0, -1, 1.5])
def test_every_must_be_a_positive_int(every):
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        apply_activation_checkpointing(_tiny(), Block, every=every)


def test_modules_must_be_type_or_predicate():
    with pytest.raises(TypeError, match="modules must be"):
        apply_activation_checkpointing(_tiny(), "Block")


def test_checkpointing_twice_raises_and_remove_restores():
    model = _tiny()
    apply_activation_checkpointing(model, Block)
    with pytest.raises(ValueError, match="already checkpointed"):
        apply_activation_checkpointing(model, Block)
    assert remove_activation_checkpointing(model) == ["blocks.0", "blocks.1"]
    x, y = synthetic_batch(model.config, 2, 16)
    stored = sum(gpt_activation_bytes(model.config, 2, 16, "fp32").values())
    assert abs(saved_activation_bytes(model, lambda: model(x, targets=y)) - stored) <= 4


def test_checkpointed_model_runs_unchanged_without_grad():
    model = _tiny()
    x, _ = synthetic_batch(model.config, 2, 16)
    with torch.no_grad():
        before = model(x)
        apply_activation_checkpointing(model, Block)
        after = model(x)
    torch.testing.assert_close(before, after)


def test_checkpointing_every_block_saves_less_than_storing():
    model = _tiny(n_layer=4)
    x, y = synthetic_batch(model.config, 4, 64)
    stored = saved_activation_bytes(model, lambda: model(x, targets=y))
    apply_activation_checkpointing(model, Block)
    assert saved_activation_bytes(model, lambda: model(x, targets=y)) < 0.7 * stored


@settings(max_examples=12, deadline=None)
@given(
    batch=st.integers(1, 3),
    seq=st.integers(4, 64),
    n_layer=st.integers(1, 3),
    precision=st.sampled_from(["fp32", "bf16"]),
    data=st.data(),
)
def test_activation_formula_matches_what_autograd_saves(batch, seq, n_layer, precision, data):
    checkpointed = data.draw(st.integers(0, n_layer))
    model = _tiny(n_layer=n_layer)
    if checkpointed:
        blocks = list(model.blocks)[:checkpointed]
        apply_activation_checkpointing(model, lambda m: any(m is b for b in blocks))
    x, y = (t.clone() for t in synthetic_batch(model.config, batch, seq))  # own storages

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            return model(x, targets=y)

    measured = saved_activation_bytes(model, forward)
    predicted = sum(
        gpt_activation_bytes(model.config, batch, seq, precision, checkpointed).values()
    )
    assert abs(measured - predicted) <= 4  # all but the scalar weight of the mean loss


def test_activation_bytes_rejects_bad_arguments():
    config = gpt_config("tiny")
    with pytest.raises(ValueError, match="precision must be one of"):
        gpt_activation_bytes(config, 1, 8, "int8")
    with pytest.raises(ValueError, match="checkpointed_layers must be in"):
        gpt_activation_bytes(config, 1, 8, "fp32", checkpointed_layers=3)


def test_bytes_per_parameter_for_common_setups():
    assert sum(bytes_per_parameter("adamw").values()) == 16
    assert sum(bytes_per_parameter("sgd").values()) == 8
    assert bytes_per_parameter("sgd_momentum")["optimizer_states"] == 4
    assert bytes_per_parameter("adamw", torch.bfloat16, master_weights=True) == {
        "weights": 2,
        "gradients": 2,
        "optimizer_states": 8,
        "master_weights": 4,
    }
    with pytest.raises(ValueError, match="optimizer must be one of"):
        bytes_per_parameter("lion")


def test_estimate_static_part_is_bytes_per_parameter_times_parameters():
    model = _tiny()
    n = model.num_parameters()
    est = estimate_training_memory(model, "bf16", "adamw", batch_size=2, seq_len=16)
    assert (est.weights, est.gradients, est.optimizer_states) == (4 * n, 4 * n, 8 * n)
    # weights, AdamW's two moments, gradients, the foreach sqrt copy of one moment, int64 ids and
    # targets
    assert est.phases["optimizer step"] == 4 * n + 8 * n + 4 * n + 4 * n + 16 * 2 * 16
    fused = estimate_training_memory(
        model, "bf16", "adamw", batch_size=2, seq_len=16, implementation="fused"
    )
    assert fused.phases["optimizer step"] == 16 * n + 16 * 2 * 16
    vocab, h = (
        model.config.vocab_size,
        model.config.n_embd,
    )  # tied embedding: its two gradients summed into a third
    assert est.phases["end of backward"] == 16 * n + 16 * 2 * 16 + 8 * vocab * h


def test_peak_is_the_largest_phase_plus_the_workspace_on_cuda_only():
    with torch.device("meta"):
        model = GPT(gpt_config("124m"))
    cpu = estimate_training_memory(model, "bf16", batch_size=1, seq_len=128, device="cpu")
    cuda = estimate_training_memory(model, "bf16", batch_size=1, seq_len=128, device="cuda")
    assert cpu.peak == max(cpu.phases.values()) and cpu.workspace == 0
    assert cuda.peak == cpu.peak + CUDA_WORKSPACE_BYTES
    # at one sequence of 128 tokens, AdamW's step (20 bytes a parameter) is the peak, not the
    # backward pass
    assert cpu.peak_phase == "optimizer step" and cpu.peak >= 20 * model.num_parameters()


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 64), every=st.sampled_from([0, 1, 2, 3, 4, 6, 12]))
def test_estimate_grows_with_batch_and_never_grows_with_checkpointing(batch, every):
    with torch.device("meta"):
        model = GPT(gpt_config("124m"))
    small = estimate_training_memory(
        model, "bf16", batch_size=batch, seq_len=1024, checkpoint_every=every
    )
    assert (
        estimate_training_memory(
            model, "bf16", batch_size=batch + 1, seq_len=1024, checkpoint_every=every
        ).peak
        > small.peak
    )  # 1024 tokens more: the loss's backward
    assert (
        small.peak <= estimate_training_memory(model, "bf16", batch_size=batch, seq_len=1024).peak
    )


def test_estimate_rejects_bad_arguments():
    model = _tiny()
    with pytest.raises(ValueError, match="implementation must be one of"):
        estimate_training_memory(model, implementation="apex")
    with pytest.raises(ValueError, match="checkpoint_every must be an int >= 0"):
        estimate_training_memory(model, checkpoint_every=-1)


# The estimate against the peak measured on a CPU: 3 model sizes × 3 batch sizes × fp32 and bf16.
PEAK_MODELS = {
    "tiny": gpt_config("tiny"),
    "small": gpt_config("small"),
    "medium": gpt_config("small", n_layer=6, n_head=6, n_embd=384, vocab_size=8192),
}


def _measured_cpu_peak(
    model: GPT, optimizer: torch.optim.Optimizer, precision: str, batch: int, seq: int
) -> int:
    x, y = synthetic_batch(model.config, batch, seq, generator=torch.Generator().manual_seed(0))

    def step(x: torch.Tensor = x, y: torch.Tensor = y) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(x, targets=y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # AdamW creates its state on the first step: measure the steady state. The state does not
    # depend on the batch, so one sequence makes it (bf16 matmuls are slow on a CPU without
    # AVX-512).
    step(x[:1], y[:1])
    return measure_peak_memory(step, model, optimizer, [x, y])


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("size", list(PEAK_MODELS))
def test_estimate_is_the_peak_measured_on_a_cpu_within_5_percent(size, batch, precision):
    torch.manual_seed(0)
    model = GPT(PEAK_MODELS[size])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    measured = _measured_cpu_peak(model, optimizer, precision, batch, 64)
    estimate = estimate_training_memory(
        model, precision, batch_size=batch, seq_len=64, implementation="foreach"
    )
    assert abs(estimate.peak / measured - 1) < 0.05, (estimate.peak_phase, estimate.peak, measured)


@pytest.mark.parametrize(
    "implementation, every", [("fused", 0), ("fused", 1), ("fused", 2), ("for-loop", 0)]
)
def test_estimate_follows_the_optimizer_kernels_and_checkpointing(implementation, every):
    torch.manual_seed(0)
    model = GPT(gpt_config("small"))
    if every:
        apply_activation_checkpointing(model, Block, every=every)
    kernels = {"fused": {"fused": True}, "for-loop": {"foreach": False}}[implementation]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **kernels)
    for batch in (1, 16):
        measured = _measured_cpu_peak(model, optimizer, "bf16", batch, 64)
        estimate = estimate_training_memory(
            model,
            "bf16",
            batch_size=batch,
            seq_len=64,
            checkpoint_every=every,
            implementation=implementation,
        )
        assert abs(estimate.peak / measured - 1) < 0.05, (batch, estimate.phases, measured)


def test_live_storage_tracker_counts_new_storages_and_their_release():
    weight = torch.randn(256, 256, requires_grad=True)  # 256 KiB
    tracker = LiveStorageTracker("cpu")
    tracker.count([weight, weight[:10]])  # a view shares its storage: counted once
    assert tracker.current == 256 * 256 * 4
    with tracker:
        hidden = (weight @ weight).relu()  # the matmul output dies at once, relu keeps its own
        after_forward = tracker.current
        hidden.sum().backward()
        del hidden
    assert after_forward == 2 * 256 * 256 * 4
    assert tracker.current == 2 * 256 * 256 * 4  # the weight and its new gradient
    assert tracker.peak >= 3 * 256 * 256 * 4


def test_memory_tracker_on_cpu_reports_unavailable():
    tracker = MemoryTracker("cpu")
    with tracker.phase("forward"):
        torch.ones(4).sum()
    assert not tracker.available and tracker.peak is None
    assert "unavailable" in tracker.table()


def test_record_memory_history_refuses_a_cpu_device(tmp_path):
    with pytest.raises(ValueError, match="device must be a CUDA device, got 'cpu'"):
        with record_memory_history(tmp_path / "snap.pickle", device="cpu"):
            pass
    assert not (tmp_path / "snap.pickle").exists()


def test_record_memory_history_without_cuda_says_so(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this checks the error raised where no accelerator is present")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        with record_memory_history(tmp_path / "snap.pickle"):
            pass


def test_expandable_segments_reads_every_segment():
    assert expandable_segments_in_use([{"is_expandable": True}] * 3) is True
    assert expandable_segments_in_use([{"is_expandable": True}, {"is_expandable": False}]) is False
    assert expandable_segments_in_use([{}]) is False and expandable_segments_in_use([]) is False


def test_allocator_settings_parse_and_reject_malformed(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert allocator_settings() == {"expandable_segments": "True"}
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")
    assert allocator_settings() == {"max_split_size_mb": "64"}
    with pytest.raises(ValueError, match="key:value"):
        allocator_settings("expandable_segments")


@needs_cuda
def test_memory_tracker_on_cuda_sees_activations_freed_by_backward():
    model = GPT(gpt_config("small")).cuda()
    x, y = synthetic_batch(model.config, 8, 256, device="cuda")
    tracker = MemoryTracker("cuda")
    with tracker.phase("forward"):
        loss = model(x, targets=y)
    with tracker.phase("backward"):
        loss.backward()
    forward, backward = tracker.phases
    assert forward.allocated > backward.allocated  # saved activations were released
    assert backward.peak >= forward.allocated and tracker.peak == max(forward.peak, backward.peak)
    assert "| forward |" in tracker.table()


@needs_cuda
def test_memory_snapshot_is_written_and_loads(tmp_path):
    with record_memory_history(tmp_path / "snap.pickle") as path:
        torch.randn(1024, 1024, device="cuda").sum()
    with open(path, "rb") as f:
        snapshot = pickle.load(f)  # noqa: S301 - our own file
    assert "segments" in snapshot and "device_traces" in snapshot
    assert any(event["action"] == "alloc" for trace in snapshot["device_traces"] for event in trace)


@needs_cuda
@pytest.mark.parametrize("batch, seq, fused", [(4, 512, True), (1, 128, False)])
def test_estimate_is_the_peak_cuda_measures_within_5_percent(batch, seq, fused):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT(gpt_config("124m"))
    opt = torch.optim.AdamW(model.parameters(), **({"fused": True} if fused else {"foreach": True}))
    x, y = synthetic_batch(model.config, batch, seq, device="cuda")
    for step in range(3):
        if step == 2:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, targets=y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    measured = torch.cuda.max_memory_allocated()
    estimate = estimate_training_memory(
        model, "bf16", batch_size=batch, seq_len=seq, implementation="fused" if fused else "foreach"
    )
    assert abs(estimate.peak / measured - 1) < 0.05, (estimate.phases, estimate.peak, measured)


@needs_cuda
def test_live_storage_tracker_agrees_with_the_cuda_allocator():
    torch.manual_seed(0)
    model = GPT(gpt_config("small")).cuda()
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    x, y = synthetic_batch(model.config, 8, 256, device="cuda")

    def step() -> None:
        model(x, targets=y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    counted = measure_peak_memory(step, model, opt, [x, y], device="cuda")
    torch.cuda.synchronize()
    assert abs(counted / torch.cuda.max_memory_allocated() - 1) < 0.05


def _expandable_in_subprocess(conf: str | None) -> str:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    }
    if conf is not None:
        env["PYTORCH_ALLOC_CONF"] = conf
    code = "from trainopt.perf.memory import expandable_segments_in_use as f; print(f())"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@needs_cuda
def test_expandable_segments_env_var_reaches_the_allocator():
    assert _expandable_in_subprocess("expandable_segments:True") == "True"
    assert _expandable_in_subprocess(None) == "False"


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        v.untyped_storage().nbytes()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


@pytest.mark.parametrize("name", ["adamw", "adafactor"])
def test_optimizer_state_bytes_is_what_torch_allocates(name):
    from trainopt.perf.estimate import optimizer_state_bytes

    if name == "adafactor" and not hasattr(torch.optim, "Adafactor"):
        pytest.skip("torch.optim.Adafactor needs torch >= 2.5")
    model = _tiny()
    optimizer = {"adamw": torch.optim.AdamW, "adafactor": getattr(torch.optim, "Adafactor", None)}[
        name
    ](model.parameters())
    x, y = synthetic_batch(model.config, batch_size=2, seq_len=16)
    model(x, targets=y).backward()
    optimizer.step()
    assert _state_bytes(optimizer) == optimizer_state_bytes(model.parameters(), name)


def test_optimizer_state_bytes_of_8bit_adamw_is_a_quarter_of_adamw_on_large_tensors():
    from trainopt.perf.estimate import optimizer_state_bytes

    large, small = torch.empty(4096, 4096, device="meta"), torch.empty(100, device="meta")
    assert optimizer_state_bytes([large], "adamw8bit") == 2 * 4096**2 + 2 * 4 * 4096**2 // 256 + 4
    assert optimizer_state_bytes([small], "adamw8bit") == optimizer_state_bytes([small], "adamw")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        optimizer_state_bytes([small], "lion")


def test_torch_accelerator_reads_the_allocator_statistics_the_page_names() -> None:
    # memory-optimization.md, "Measure the peak on any device": not only torch.cuda has them
    for name in ("memory_allocated", "max_memory_allocated", "memory_stats"):
        assert callable(getattr(torch.accelerator, name))
