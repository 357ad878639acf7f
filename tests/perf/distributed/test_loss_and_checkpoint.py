"""The token-normalised loss (one process) and sharded checkpoints (two gloo processes)."""

from __future__ import annotations

import os
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from trainopt.models import GPT, gpt_config
from trainopt.perf.distributed.checkpoint import load_sharded, save_sharded
from trainopt.perf.distributed.checks import sharded_checkpoint_check
from trainopt.perf.distributed.fsdp import fsdp2_available
from trainopt.perf.distributed.loss import IGNORE_INDEX, global_token_count, token_normalized_loss
from trainopt.perf.distributed.processes import free_port, init_from_env, launch


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=2, max_size=8),
    micro_batches=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_micro_batch_losses_add_up_to_the_mean_over_every_counted_token(
    lengths, micro_batches, seed
):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(lengths), 6, 5, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, 5, (len(lengths), 6), generator=generator)
    targets[torch.arange(6) >= torch.tensor(lengths)[:, None]] = IGNORE_INDEX
    chunks = list(zip(logits.chunk(micro_batches), targets.chunk(micro_batches)))
    tokens = global_token_count([t for _, t in chunks])
    total = sum(token_normalized_loss(logit, t, tokens) for logit, t in chunks)
    assert int(tokens) == sum(lengths)
    if sum(lengths) == 0:
        assert total == 0  # nothing counted: no gradient, not a NaN
    else:
        expected = F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX
        )
        torch.testing.assert_close(total, expected)


def test_an_int_token_count_gives_the_same_loss_as_a_tensor():
    logits, targets = torch.randn(3, 4, 7), torch.randint(0, 7, (3, 4))
    assert torch.equal(
        token_normalized_loss(logits, targets, 12),
        token_normalized_loss(logits, targets, torch.tensor(12)),
    )


def test_token_count_of_no_tensor_is_an_error():
    with pytest.raises(ValueError, match="at least one tensor"):
        global_token_count([])


def test_init_from_env_joins_the_group_the_environment_describes():
    env = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    with mock.patch.dict(os.environ, env):
        device = init_from_env("gloo")
    try:
        assert device == torch.device("cpu") and dist.get_world_size() == 1
    finally:
        dist.destroy_process_group()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_init_from_env_sets_the_cuda_device_of_the_local_rank():
    local_rank = torch.cuda.device_count() - 1
    env = {
        "RANK": "0",
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    with mock.patch.dict(os.environ, env):
        device = init_from_env("nccl")
    try:
        assert (
            device
            == torch.device("cuda", local_rank)
            == torch.device("cuda", torch.cuda.current_device())
        )
    finally:
        dist.destroy_process_group()


def test_a_checkpoint_round_trip_restores_model_and_optimizer(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).square().sum().backward()
        optimizer.step()
    save_sharded(tmp_path, model, optimizer)
    copy = torch.nn.Linear(4, 3)
    copy_optimizer = torch.optim.AdamW(copy.parameters(), lr=0.1)
    load_sharded(tmp_path, copy, copy_optimizer)
    assert torch.equal(copy.weight, model.weight) and torch.equal(copy.bias, model.bias)
    saved, loaded = optimizer.state_dict()["state"], copy_optimizer.state_dict()["state"]
    for key in ("step", "exp_avg", "exp_avg_sq"):
        assert torch.equal(saved[0][key], loaded[0][key])


@pytest.mark.skipif(not fsdp2_available(), reason="FSDP2 (fully_shard) needs torch >= 2.4")
def test_a_checkpoint_saved_by_two_fsdp2_ranks_resumes_and_loads_into_one_plain_model(tmp_path):
    ranks = launch(
        sharded_checkpoint_check,
        2,
        str(tmp_path),
        backend="gloo",
        timeout=300,
        collective_timeout=30,
    )
    assert [r["max_param_diff"] for r in ranks] == [0.0, 0.0]
    assert [r["resumed_step"] for r in ranks] == [2.0, 2.0]
    plain = GPT(gpt_config("tiny"))
    before = {name: p.detach().clone() for name, p in plain.named_parameters()}
    load_sharded(tmp_path, plain)
    for name, param in plain.named_parameters():
        assert torch.equal(param, ranks[0]["weights"][name])
        assert not torch.equal(param, before[name])  # the load changed it
