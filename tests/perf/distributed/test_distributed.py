"""Tests of trainopt.perf.distributed and its workshop (trainopt_site.perf.distributed): equivalence
with one process, communication counts, lossy hooks measured, summed losses caught,
rank-consistent decisions, launch and torchrun.

The multi-process checks run once, in one 2-process gloo group on the CPU (starting a process
that imports torch costs seconds), and each test below asserts one behaviour of the results.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.perf.distributed.agreement import (
    GradientScaleError,
    any_rank,
    check_gradient_scale,
    gradient_scale,
    nonfinite_flag,
)
from trainopt.perf.distributed.checks import raise_on_rank
from trainopt.perf.distributed.compression import MEASURED_HOOKS
from trainopt.perf.distributed.ddp import COMM_HOOKS, gradient_sync, register_comm_hook
from trainopt.perf.distributed.fsdp import fsdp2_available, memory_per_rank, memory_table
from trainopt.perf.distributed.processes import WorkerError, launch
from trainopt_site.perf.distributed.cli import all_checks, main
from trainopt_site.perf.distributed.compression import compression_table

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs/advanced/performance/distributed-training.md"
DATA = ROOT / "docs/_data/distributed_compression.json"
TOLERANCE = 1e-5  # fp32: max parameter difference from single-process training

needs_fsdp2 = pytest.mark.skipif(
    not fsdp2_available(), reason="FSDP2 (fully_shard) needs torch >= 2.4"
)


@pytest.fixture(scope="module")
def checks() -> list[dict]:
    """All multi-process checks, run once on 2 gloo processes; one result dict per rank."""
    return launch(all_checks, 2, backend="gloo", timeout=300, collective_timeout=30)


# --- equivalence with one process on the combined batch ------------------------------------


def test_ddp_training_equals_single_process_on_the_combined_batch(checks):
    for rank in checks:
        assert rank["ddp"]["max_param_diff"] <= TOLERANCE
        assert rank["ddp"]["max_param_change"] > 1000 * TOLERANCE  # training moved the weights


def test_small_buckets_mean_more_allreduce_calls_and_the_same_result(checks):
    default, small = checks[0]["ddp"], checks[0]["ddp_small_buckets"]
    assert small["allreduce_calls"] > default["allreduce_calls"]
    assert small["max_param_diff"] <= TOLERANCE


def test_static_graph_and_separate_gradients_give_the_same_training(checks):
    for rank in checks:
        assert rank["ddp_static_graph_no_view"]["max_param_diff"] <= TOLERANCE


@needs_fsdp2
def test_fsdp2_training_equals_single_process_on_the_combined_batch(checks):
    for rank in checks:
        assert rank["fsdp"]["max_param_diff"] <= TOLERANCE


@needs_fsdp2
def test_fsdp2_bf16_mixed_precision_differs_by_rounding_only(checks):
    fsdp = checks[0]["fsdp"]
    fp32, bf16 = fsdp["max_param_diff"], fsdp["max_param_diff_bf16"]
    assert fp32 < bf16 < 1e-2  # measured, not called equivalent
    assert fp32 < fsdp["max_param_diff_bf16_fp32_reduce"] < 1e-2  # bf16 compute, fp32 reduce


@needs_fsdp2
def test_hsdp_on_a_replicate_by_shard_mesh_equals_single_process(checks):
    for rank in checks:
        assert rank["fsdp"]["max_param_diff_hsdp"] <= TOLERANCE


def test_accumulation_with_no_sync_equals_the_full_batch(checks):
    for rank in checks:
        assert rank["accumulation"]["max_param_diff"] <= TOLERANCE


def test_no_sync_communicates_once_per_step_instead_of_once_per_micro_batch(checks):
    acc = checks[0]["accumulation"]
    # 4 micro-batches per step: syncing each one all-reduces 4 times as often
    assert acc["allreduce_calls_every_micro_batch"] == 4 * acc["allreduce_calls_no_sync"]
    assert acc["max_param_diff_every_micro_batch"] <= TOLERANCE  # same result, more traffic


@needs_fsdp2
def test_fsdp2_accumulation_without_gradient_sync_equals_the_full_batch(checks):
    for rank in checks:
        assert rank["fsdp_accumulation"]["max_param_diff"] <= TOLERANCE


# --- padded batches: the mean over the global batch's tokens --------------------------------


def test_ranks_holding_different_token_counts_is_the_case_tested(checks):
    counts = [rank["token_loss"]["tokens_per_rank"] for rank in checks]
    assert counts[0] != counts[1]


@pytest.mark.parametrize("split", ["ranks", "accumulation"])
def test_mean_losses_per_rank_or_micro_batch_miss_the_global_token_mean(checks, split):
    for rank in checks:
        assert rank["token_loss"][f"naive_{split}"] > 1e-2


@pytest.mark.parametrize("split", ["ranks", "accumulation"])
def test_token_normalized_loss_gives_the_global_token_mean_gradient(checks, split):
    for rank in checks:
        assert rank["token_loss"][f"helper_{split}"] < 1e-5


# --- a loss summed instead of averaged ------------------------------------------------------


def test_summed_loss_is_caught_and_the_factor_is_the_local_token_count(checks):
    summed = checks[0]["summed_loss"]
    assert summed["scale"] == pytest.approx(summed["local_tokens"], rel=1e-4)
    assert "summed over the per-rank batch" in summed["error"]


@pytest.mark.parametrize(
    "factor, kwargs, cause",
    [
        (32.0, dict(local_batch_size=32), "summed over the per-rank batch"),
        (0.5, dict(world_size=2), "averaged over ranks"),
        (4.0, dict(accumulation_steps=4), "not divided by accumulation_steps"),
        (
            128.0,
            dict(local_batch_size=32, accumulation_steps=4),
            "summed over the per-rank batch and",
        ),
        (3.0, dict(world_size=2, local_batch_size=32), "no known cause"),
    ],
)
def test_gradient_scale_mismatch_names_its_cause(factor, kwargs, cause):
    reference = [torch.randn(5, 3), torch.randn(3)]
    with pytest.raises(GradientScaleError, match=re.escape(cause)):
        check_gradient_scale([factor * g for g in reference], reference, **kwargs)


def test_equal_gradients_pass_the_scale_check():
    reference = [torch.randn(5, 3), torch.randn(3)]
    assert check_gradient_scale([g.clone() for g in reference], reference) == pytest.approx(1.0)


@settings(max_examples=25, deadline=None)
@given(scale=st.floats(min_value=1e-3, max_value=1e3), seed=st.integers(0, 1000))
def test_gradient_scale_recovers_any_constant_factor(scale, seed):
    torch.manual_seed(seed)
    reference = [torch.randn(4, 4), torch.randn(4)]
    found, cosine = gradient_scale([scale * g for g in reference], reference)
    assert found == pytest.approx(scale, rel=1e-5) and cosine == pytest.approx(1.0, abs=1e-6)


# --- lossy communication hooks are measured -------------------------------------------------


def test_fp16_compression_has_a_small_nonzero_gradient_error(checks):
    fp16, exact = checks[0]["compression"]["fp16"], checks[0]["compression"]["allreduce"]
    assert exact["max"] < 1e-5 < fp16["mean"] < 1e-2
    assert fp16["sent_fraction"] == 0.5


def test_bf16_compression_is_refused_on_gloo_with_a_reason(checks):
    assert "needs the NCCL" in checks[0]["compression"]["bf16"]["unsupported"]


def test_powersgd_sends_a_fraction_and_error_feedback_makes_the_sum_more_accurate(checks):
    for spec in ("powersgd:1", "powersgd:4"):
        record = checks[0]["compression"][spec]
        assert record["sent_fraction"] < 0.1
        assert record["cumulative"] < record["mean"]  # what one step drops, the next sends
    assert (
        checks[0]["compression"]["powersgd:4"]["sent_fraction"]
        > checks[0]["compression"]["powersgd:1"]["sent_fraction"]
    )


def test_unknown_hook_name_is_rejected_with_the_allowed_names():
    with pytest.raises(
        ValueError, match=r"name must be one of \['allreduce', 'fp16', 'bf16', 'powersgd'\]"
    ):
        register_comm_hook(None, "int8")  # type: ignore[arg-type]
    assert COMM_HOOKS == ("allreduce", "fp16", "bf16", "powersgd")


def test_recorded_compression_results_cover_every_hook_and_render():
    data = json.loads(DATA.read_text())
    assert list(data["hooks"]) == list(MEASURED_HOOKS)
    table = compression_table(DATA)
    assert table.count("\n| ") == len(MEASURED_HOOKS) + 1  # separator row + one row per hook
    assert f"{data['hooks']['fp16']['mean']:.1e}" in table


def test_the_equivalence_command_prints_each_checks_parameter_difference(capsys):
    main(["--equivalence", "--nprocs", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert {"ddp", "accumulation", "ddp_small_buckets"} <= {line.split(":")[0] for line in lines}
    line_format = r"\w+: max parameter difference \d\.\de[+-]\d\d"
    assert all(re.fullmatch(line_format, line) for line in lines), lines


def test_the_pages_compression_command_writes_json(tmp_path):
    prefix = ["python", "-m", "trainopt_site.perf.distributed"]
    (command,) = [c for c in _console_commands(PAGE) if c[:3] == prefix]
    args = command[3:]
    args[args.index("--out") + 1] = str(tmp_path / "compression.json")
    main(args + ["--iterations", "3"])
    out = tmp_path / "compression.json"
    data = json.loads(out.read_text())
    assert data["world_size"] == 2 and len(data["hooks"]["fp16"]["errors"]) == 3


# --- decisions every rank agrees on ----------------------------------------------------------


def test_agreed_skip_is_the_same_on_every_rank_when_only_rank_1_sees_a_nan(checks):
    rank0, rank1 = checks[0]["skip"]["agreed"], checks[1]["skip"]["agreed"]
    assert rank0["local_flags"] == [False, False, False] and rank1["local_flags"] == [
        False,
        True,
        False,
    ]
    assert rank0["decisions"] == rank1["decisions"] == [False, True, False]
    assert torch.isfinite(rank0["params"]).all()
    assert torch.equal(rank0["params"], rank1["params"])  # replicas stay identical


def test_local_skip_decisions_let_the_replicas_diverge(checks):
    rank0, rank1 = checks[0]["skip"]["local"], checks[1]["skip"]["local"]
    assert rank0["decisions"] != rank1["decisions"]
    assert not torch.equal(rank0["params"], rank1["params"])
    assert not torch.isfinite(rank0["params"]).all()  # rank 0 stepped on the NaN gradients


def test_step_unless_any_rank_nonfinite_skips_on_every_rank_together(checks):
    rank0, rank1 = checks[0]["skip"]["helper"], checks[1]["skip"]["helper"]
    assert rank0["decisions"] == rank1["decisions"] == [False, True, False]
    assert torch.isfinite(rank0["params"]).all() and torch.equal(rank0["params"], rank1["params"])
    assert torch.equal(rank0["params"], checks[0]["skip"]["agreed"]["params"])


def test_rank0_chooses_and_every_rank_gets_its_choice(checks):
    assert [r["broadcast"] for r in checks] == ["checkpoint chosen by rank 0"] * 2
    assert [r["is_main_process"] for r in checks] == [True, False]


def test_any_rank_and_nonfinite_flag_work_without_a_process_group():
    assert bool(any_rank(torch.tensor(False))) is False and bool(any_rank(torch.tensor(1))) is True
    layer = torch.nn.Linear(3, 1)
    layer(torch.ones(2, 3)).sum().backward()
    assert not nonfinite_flag(torch.tensor(1.0), layer.parameters())
    layer.weight.grad[0, 0] = float("inf")
    assert nonfinite_flag(torch.tensor(1.0), layer.parameters())


def test_gradient_sync_on_a_plain_module_just_accumulates():
    layer, x = torch.nn.Linear(3, 1), torch.randn(4, 3)
    with gradient_sync(layer, enabled=False):
        layer(x[:2]).sum().backward()
    layer(x[2:]).sum().backward()
    assert torch.allclose(layer.weight.grad, x.sum(0, keepdim=True))


# --- launch ---------------------------------------------------------------------------------


def test_launch_names_the_failing_rank_and_stops_the_others():
    with pytest.raises(WorkerError, match="rank 1 failed") as info:
        launch(raise_on_rank, 2, 1, backend="gloo", timeout=120, collective_timeout=30)
    assert info.value.rank == 1 and "raises on purpose" in str(info.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(nprocs=0), "nprocs must be an int >= 1"),
        (dict(nprocs=2, backend="mpi"), "backend must be 'gloo', 'nccl' or None"),
        (dict(nprocs=2, timeout=0), "timeout must be a positive number of seconds, got timeout=0"),
        (
            dict(nprocs=2, collective_timeout="60"),
            "collective_timeout must be a positive number of seconds",
        ),
    ],
)
def test_launch_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        launch(raise_on_rank, **kwargs)


# --- memory per rank ------------------------------------------------------------------------


@pytest.mark.parametrize("stage, gigabytes", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_memory_per_rank_matches_the_zero_paper(stage, gigabytes):
    # ZeRO (Rajbhandari et al., 2020), Figure 1: 7.5B parameters, 64 GPUs, mixed precision Adam
    assert memory_per_rank(7.5e9, 64, stage)["total"] / 1e9 == pytest.approx(gigabytes, abs=0.05)


@settings(max_examples=25, deadline=None)
@given(n_params=st.floats(1e3, 1e12), world_size=st.integers(1, 4096))
def test_each_zero_stage_needs_no_more_memory_than_the_one_before(n_params, world_size):
    totals = [memory_per_rank(n_params, world_size, stage)["total"] for stage in range(4)]
    assert all(a >= b for a, b in zip(totals, totals[1:]))
    assert math.isclose(totals[3] * world_size, totals[0], rel_tol=1e-9)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(stage=4), "stage must be one of [0, 1, 2, 3]"),
        (dict(stage=1, world_size=0), "world_size must be an int >= 1"),
    ],
)
def test_memory_per_rank_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        memory_per_rank(1e9, **{"world_size": 8, **kwargs})


def test_memory_table_has_a_row_per_stage():
    assert memory_table(350e6, 8).count("GiB |") == 4 * 4


# --- the page's torchrun commands -----------------------------------------------------------


def _console_commands(page: Path) -> list[list[str]]:
    text, commands = page.read_text(), []
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        commands += [shlex.split(line[2:]) for line in joined.splitlines() if line.startswith("$ ")]
    return commands


def test_every_torchrun_command_on_the_page_parses_with_torchruns_own_parser():
    from torch.distributed.run import get_args_parser

    torchrun = [c for c in _console_commands(PAGE) if c[0] == "torchrun"]
    assert len(torchrun) >= 2
    multi_node = 0
    for command in torchrun:
        args = get_args_parser().parse_args(command[1:])
        assert args.training_script.endswith(".py") or args.module
        if not args.standalone:
            multi_node += 1
            assert int(args.nnodes) > 1 and args.rdzv_backend == "c10d"
            assert int(args.rdzv_endpoint.rpartition(":")[2]) == 29400
    assert multi_node >= 1


def test_a_wrong_torchrun_flag_fails_the_parser():
    from torch.distributed.run import get_args_parser

    with pytest.raises(SystemExit):
        get_args_parser().parse_args(["--nodes", "2", "train.py"])


def test_context_parallel_all_gathers_keys_and_values_by_default() -> None:
    # distributed-training.md, "Sequence, context and pipeline parallelism"
    from torch.distributed.tensor.experimental._context_parallel import _attention

    assert _attention._cp_options.rotate_method is _attention._RotateMethod.ALL_GATHER
