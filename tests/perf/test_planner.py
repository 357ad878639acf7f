"""The layout planner (trainopt.perf.planner): its accounting, its command line, and its three
checks (a fake-tensor trace, a measured gloo step, published runs)."""

from __future__ import annotations

import io
import json
import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trainopt.config.cli import run_command
from trainopt.models import GPT, gpt_config
from trainopt.perf.bench.mfu import PEAK_TFLOPS, gpu_table
from trainopt.perf.distributed import launch
from trainopt.perf.distributed.fsdp import memory_per_rank
from trainopt.perf.estimate import gpt_activation_bytes
from trainopt.perf.planner import (
    Cluster,
    Layout,
    ModelShape,
    Training,
    communication_per_step,
    memory_per_gpu,
    plan,
    rank_layouts,
    step_time,
)
from trainopt.perf.planner.cli import main
from trainopt.perf.planner.memory import block_activation_bytes
from trainopt.perf.planner.shape import PRESETS
from trainopt_site.perf.planner.checks import (
    TP_CASES,
    TRACED_CASES,
    measured_peaks,
    traced_fsdp_peak,
    traced_tensor_parallel_peak,
)
from trainopt_site.perf.planner.tables import (
    GPU_COUNTS,
    MODELS,
    decision_table,
    published_comparison,
)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/advanced/scale/layout-planner.md"
SHAPE_8B = PRESETS["llama3-8b"]
STATES = ModelShape(
    layers=1, hidden=1, heads=1, ffn_hidden=1, vocab=1, seq_len=1,
    layer_parameters=7_500_000_000, other_parameters=0,
)  # fmt: skip


# --- accounting ------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_model_states_are_zeros_for_every_stage(stage):
    memory = memory_per_gpu(STATES, Training(precision="bf16"), Layout(dp=64, zero=stage))
    assert memory.model_states == pytest.approx(memory_per_rank(7.5e9, 64, stage)["total"], 1e-6)


def test_each_zero_stage_needs_less_memory_per_gpu_than_the_one_before():
    peaks = [
        memory_per_gpu(SHAPE_8B, Training(), Layout(dp=64, zero=stage)).peak for stage in range(4)
    ]
    assert peaks == sorted(peaks, reverse=True) and peaks[3] < peaks[0] / 2


def test_block_activations_agree_with_the_gpt_formula_of_the_memory_page():
    config = gpt_config("small")
    with torch.device("meta"):
        model = GPT(config)
    shape = ModelShape.from_module(model, seq_len=256, heads=config.n_head)
    planned = block_activation_bytes(shape, Training(micro_batch=8, precision="fp32"), Layout())
    formula = gpt_activation_bytes(config, 8, 256, "fp32")["blocks"] / config.n_layer
    assert planned == pytest.approx(formula, rel=1e-3)


def test_tensor_and_context_parallelism_divide_the_activations():
    base = block_activation_bytes(SHAPE_8B, Training(), Layout())
    assert block_activation_bytes(SHAPE_8B, Training(), Layout(tp=8)) == base // 8
    assert block_activation_bytes(SHAPE_8B, Training(), Layout(cp=4)) == base // 4
    no_sp = block_activation_bytes(SHAPE_8B, Training(), Layout(tp=8, sequence_parallel=False))
    assert base // 8 < no_sp < base


def test_full_checkpointing_keeps_one_input_per_block_and_one_block_recomputed():
    plain = memory_per_gpu(SHAPE_8B, Training(), Layout(dp=8, zero=3))
    recomputed = memory_per_gpu(SHAPE_8B, Training(checkpointing="full"), Layout(dp=8, zero=3))
    kept = SHAPE_8B.layers * 2 * SHAPE_8B.seq_len * SHAPE_8B.hidden
    block = block_activation_bytes(SHAPE_8B, Training(), Layout())
    saved = plain.parts["activations"] - recomputed.parts["activations"]
    assert saved == SHAPE_8B.layers * block - kept - block


def test_the_first_pipeline_stage_holds_pp_micro_batches_in_flight():
    def activations(global_batch):
        training = Training(global_batch=global_batch)
        return memory_per_gpu(SHAPE_8B, training, Layout(pp=4)).phases["backward start"]

    one, many = activations(1), activations(16)  # 1 micro-batch in flight, then 4
    block = block_activation_bytes(SHAPE_8B, Training(), Layout(pp=4))
    assert many["activations"] - one["activations"] == 3 * (SHAPE_8B.layers // 4) * block


def test_fsdp_sends_one_and_a_half_times_ddps_bytes_and_more_with_accumulation():
    def sent(layout, global_batch=8):
        training = Training(global_batch=global_batch)
        return sum(c.bytes_per_gpu for c in communication_per_step(SHAPE_8B, training, layout))

    assert sent(Layout(dp=8, zero=3)) == pytest.approx(1.5 * sent(Layout(dp=8)))
    assert sent(Layout(dp=8, zero=1)) == pytest.approx(sent(Layout(dp=8)))
    assert sent(Layout(dp=8), 64) == sent(Layout(dp=8))  # DDP syncs once per step
    assert sent(Layout(dp=8, zero=3), 64) > 7 * sent(Layout(dp=8, zero=3))  # FSDP per micro-batch


def test_the_bubble_shrinks_with_micro_batches_and_is_pp_minus_one_over_m():
    cluster = Cluster.of("H100 SXM", gpus=8)
    for m in (8, 32):
        t = step_time(SHAPE_8B, Training(global_batch=m), Layout(pp=8), cluster)
        assert t.bubble == pytest.approx((t.seconds - t.bubble) * 7 / m, rel=1e-9)


def test_cross_node_groups_run_at_the_network_bandwidth():
    cluster = Cluster.of("H100 SXM", gpus=16)
    training = Training(global_batch=16)
    inside = step_time(SHAPE_8B, training, Layout(dp=2, tp=8), cluster)
    across = step_time(SHAPE_8B, training, Layout(dp=2, tp=8), replace(cluster, gpus_per_node=4))
    assert across.exposed_communication > 5 * inside.exposed_communication


def test_ranked_layouts_all_fit_and_come_fastest_first():
    plans = rank_layouts(SHAPE_8B, Training(global_batch=64), Cluster.of("H100 SXM", gpus=16))
    assert plans and all(p.fits and p.layout.gpus == 16 for p in plans)
    times = [p.time.seconds for p in plans]
    assert times == sorted(times)


def test_a_model_too_large_for_the_cluster_has_no_layout():
    assert rank_layouts(PRESETS["llama3-405b"], Training(), Cluster.of("H100 SXM", gpus=8)) == []


def test_the_gpu_table_has_a_source_for_every_row_and_is_the_mfu_peak_table():
    rows = {row["name"]: row for row in gpu_table()}
    for name in ("H100 SXM", "H100 PCIe", "H200", "B200", "GB200", "A100", "L40S", "MI300X"):
        assert name in rows
    assert {"MI325X", "MI355X"} <= set(rows)
    for row in rows.values():
        assert row["source"].startswith("https://") and row["memory_gb"] > 0
        assert row["peak_tflops"]["bf16"] > 0 and row["scale_up_gb_per_s"] > 0
        if "fp8" in row["peak_tflops"]:
            assert row["peak_tflops"]["fp8"] == pytest.approx(2 * row["peak_tflops"]["bf16"], 0.03)
    for name, peaks in PEAK_TFLOPS.items():
        assert peaks["bf16"] == rows[name]["peak_tflops"]["bf16"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(layers=0), "ModelShape.layers must be an int >= 1"),
        (dict(hidden=100, heads=3), "ModelShape.hidden must be divisible by heads"),
        (dict(heads=32, kv_heads=5), "ModelShape.heads must be a multiple of kv_heads"),
    ],
)
def test_bad_shapes_name_the_field(kwargs, message):
    fields = dict(layers=2, hidden=4096, heads=32, ffn_hidden=8, vocab=8, seq_len=8)
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelShape(**{**fields, **kwargs})


def test_bad_training_and_layout_name_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"Training.precision must be one of \['fp32', 'bf16'"):
        Training(precision="fp16")
    with pytest.raises(ValueError, match=r"Layout.zero must be one of \[0, 1, 2, 3\], got 4"):
        Layout(zero=4)
    with pytest.raises(ValueError, match=r"gpu must be one of \["):
        Cluster.of("H20", gpus=8)
    with pytest.raises(ValueError, match="layout needs 16 GPUs, the cluster has 8"):
        plan(SHAPE_8B, Training(), Layout(dp=16), Cluster.of("H100 SXM", gpus=8))


# --- command line ----------------------------------------------------------------------------


def _run(argv):
    err, out = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out):
        status = run_command(main, argv, stderr=err)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--model", "llama3-8b", "--gpus", "0"], "error: --gpus: "),
        (["--layers", "2"], "error: --model: give a named shape or every shape field"),
        (["--model", "llama3-8b", "--layout", "dp=2,zero=7"], "error: --layout: Layout.zero"),
        (["--model", "llama3-8b", "--layout", "dp=x"], "error: --layout: must be comma-separated"),
        (["--model", "llama3-8b", "--gpus", "8", "--layout", "dp=16"], "error: --layout: uses 16"),
        (["--model", "llama3-8b", "--gpu", "H20"], "error: --gpu: invalid choice"),
        (["--model", "llama3-8b", "--gpu", "A100", "--precision", "fp8"], "error: --precision: "),
    ],
)
def test_argument_mistakes_print_one_line_and_exit_2(argv, line):
    status, _, err = _run(argv)
    assert status == 2 and err.startswith(line) and err.count("\n") == 1


def test_every_command_on_the_page_runs_and_prints_its_table():
    commands = re.findall(r"^\$ python -m trainopt\.perf\.planner (.*)$", PAGE.read_text(), re.M)
    assert len(commands) == 2
    for command in commands:
        status, out, err = _run(shlex.split(command))
        assert status == 0 and not err and "| " in out


def test_the_json_output_has_the_parts_and_the_collectives():
    status, out, _ = _run(
        ["--model", "llama3-8b", "--gpus", "8", "--layout", "dp=8,zero=3", "--json"]
    )
    data = json.loads(out)
    assert status == 0 and data["layout"] == "FSDP 8"
    assert data["memory"]["peak"] == sum(
        data["memory"][k] for k in ("parameters", "gradients", "optimizer_states", "activations",
                                    "communication_buffers", "temporaries")
    )  # fmt: skip
    assert {c["name"] for c in data["communication"]} == {"all-gather", "reduce-scatter"}


# --- the three checks ------------------------------------------------------------------------


@pytest.mark.parametrize("case", TRACED_CASES[1:], ids=lambda c: f"{c['world_size']}ranks")
def test_fsdp2_per_rank_peak_is_within_5_percent_of_the_fake_process_group_trace(case):
    result = traced_fsdp_peak(**case)
    assert abs(result["planned"] / result["traced"] - 1) < 0.05


def test_tensor_parallel_per_rank_peak_is_within_5_percent_of_the_fake_process_group_trace():
    result = traced_tensor_parallel_peak(**TP_CASES[1])
    assert abs(result["planned"] / result["traced"] - 1) < 0.05


def test_measured_ddp_and_fsdp2_peaks_on_two_gloo_ranks_are_within_5_percent():
    for rank in launch(measured_peaks, 2, backend="gloo", timeout=300, collective_timeout=60):
        for wrap in ("ddp", "fsdp"):
            measured, planned = rank[wrap]["measured"], rank[wrap]["planned"]
            assert abs(planned / measured - 1) < 0.05, (wrap, measured, planned)


def test_published_runs_are_within_bounds_or_the_page_says_why():
    rows = published_comparison()
    assert len({row["id"] for row in rows}) >= 4
    for row in rows:
        assert row["url"].startswith("https://") and row["source"]
        if abs(row["error"]) > row["tolerance"]:
            assert row["why"], f"{row['id']} {row['metric']}: {row['error']:+.0%} unexplained"
    within = [row for row in rows if abs(row["error"]) <= row["tolerance"]]
    assert {row["metric"] for row in within} >= {"tflops_per_gpu_with_recompute", "memory_gib"}


def test_the_decision_table_has_a_cell_per_model_and_cluster_and_scales_sensibly():
    lines = decision_table("layout").splitlines()
    assert len(lines) == 2 + len(MODELS)
    cells = [line.split(" | ")[1:] for line in lines[2:]]
    assert all(len(row) == len(GPU_COUNTS) for row in cells)
    assert "does not fit" not in cells[0][0]  # 1B on one GPU
    assert cells[3][2].strip() == "does not fit"  # 405B on 64 GPUs: 6.5 TB of states
    assert "does not fit" not in cells[3][3]  # ... fits on 1,024
