"""Hooks never see a skipped step (issue 21, requirement 5).

- :func:`check_no_step_hooks` refuses an optimizer with step hooks, its own or torch's global
  ones, pre or post, and names each;
- :func:`masked_update_parameters` is ``AveragedModel.update_parameters`` bit for bit on an
  applied step, for every kind of average, and changes nothing on a skipped one;
- an EMA kept that way over a run with a skipped bad batch equals the EMA of plain torch run
  without that batch, ``n_averaged`` included, while the EMA kept by a step hook does not;
- it makes no host sync.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn, get_ema_multi_avg_fn

from trainopt.stability import HostSyncCounter, UnsupportedOptimizerError, fused_step, masked_step
from trainopt.stability.skipping.averaging import masked_update_parameters
from trainopt.stability.skipping.optimizers import check_no_step_hooks

# --- check_no_step_hooks ----------------------------------------------------------------------


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])


def keep_an_ema(optimizer, args, kwargs) -> None:
    pass


@pytest.mark.parametrize(
    "register, kind",
    [
        (lambda opt, hook: opt.register_step_pre_hook(hook), "pre hook of this optimizer"),
        (lambda opt, hook: opt.register_step_post_hook(hook), "post hook of this optimizer"),
        (lambda opt, hook: register_optimizer_step_pre_hook(hook), "global pre hook"),
        (lambda opt, hook: register_optimizer_step_post_hook(hook), "global post hook"),
    ],
    ids=["pre", "post", "global-pre", "global-post"],
)
def test_an_optimizer_with_step_hooks_is_refused_and_each_hook_is_named(register, kind) -> None:
    optimizer = _optimizer()
    check_no_step_hooks(optimizer)
    handle = register(optimizer, keep_an_ema)
    try:
        with pytest.raises(UnsupportedOptimizerError) as info:
            check_no_step_hooks(optimizer)
    finally:
        handle.remove()
    message = str(info.value)
    assert f"{kind} keep_an_ema" in message and message.startswith("AdamW cannot be stabilized")
    assert "averaged=" in message and "AveragedModel" in message
    check_no_step_hooks(optimizer)  # removed: accepted again


def test_every_hook_is_named() -> None:
    optimizer = _optimizer()
    handles = [
        optimizer.register_step_post_hook(keep_an_ema),
        optimizer.register_step_pre_hook(copy.deepcopy),
    ]
    try:
        with pytest.raises(
            UnsupportedOptimizerError,
            match="pre hook of this optimizer deepcopy, post hook of this optimizer keep_an_ema",
        ):
            check_no_step_hooks(optimizer)
    finally:
        for handle in handles:
            handle.remove()


# --- masked_update_parameters against AveragedModel.update_parameters -------------------------


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    )


AVERAGES = {
    "running mean": {},
    "ema multi_avg_fn": {"multi_avg_fn": get_ema_multi_avg_fn(0.9)},
    "ema avg_fn": {"avg_fn": get_ema_avg_fn(0.8)},
    "own avg_fn": {"avg_fn": lambda avg, new, n: avg * 0.5 + new * 0.25 + n * 0.125},
    "own multi_avg_fn": {
        "multi_avg_fn": lambda avgs, news, n: torch._foreach_add_(avgs, news, alpha=0.3)
    },
    "running mean with buffers": {"use_buffers": True},
    "ema with buffers": {"multi_avg_fn": get_ema_multi_avg_fn(0.9), "use_buffers": True},
}


def _tensors(averaged: AveragedModel) -> list[torch.Tensor]:
    return [t.detach().cpu().clone() for t in averaged.state_dict().values()]


@pytest.mark.parametrize("kwargs", AVERAGES.values(), ids=AVERAGES.keys())
def test_an_applied_update_is_torchs_and_a_skipped_one_changes_nothing(kwargs) -> None:
    model = _model()
    ours, theirs = AveragedModel(model, **kwargs), AveragedModel(model, **kwargs)
    for step, skip in enumerate([True, False, True, False, False, True, False]):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        model(torch.randn(5, 3))  # train mode: BatchNorm's running statistics move
        before = _tensors(ours)
        masked_update_parameters(ours, model, torch.tensor(skip))
        if skip:
            assert all(torch.equal(a, b) for a, b in zip(before, _tensors(ours))), step
        else:
            theirs.update_parameters(model)
        assert all(torch.equal(a, b) for a, b in zip(_tensors(ours), _tensors(theirs))), step
    assert int(ours.n_averaged) == 4


def test_the_update_makes_no_host_sync() -> None:
    model = _model()
    for kwargs in AVERAGES.values():
        averaged = AveragedModel(model, **kwargs)
        with HostSyncCounter() as counter:
            for skip in (True, False, True, False):
                masked_update_parameters(averaged, model, torch.tensor(skip))
        assert counter.count == 0, counter.stacks
    with HostSyncCounter() as counter:
        averaged.update_parameters(model)  # torch's own reads n_averaged on the host
    assert counter.count >= 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_running_mean_on_a_gpu_is_torchs_bit_for_bit() -> None:
    model = _model().cuda()
    ours, theirs = AveragedModel(model), AveragedModel(model)
    for _ in range(4):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        masked_update_parameters(ours, model, torch.tensor(False, device="cuda"))
        theirs.update_parameters(model)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(ours), _tensors(theirs)))


# --- an EMA over a run with a skipped batch ---------------------------------------------------

BAD = 3  # the batch with a NaN input


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(8, 3, generator=generator), torch.randint(0, 2, (8,), generator=generator))
        for _ in range(8)
    ]
    batches[BAD][0][0, 0] = float("nan")
    return batches


def _run(fused: bool, how: str) -> AveragedModel:
    """how: "plain" (torch, the bad batch left out), "masked" (skipped, masked_update_parameters),
    or "hook" (skipped, the EMA kept by a step post hook)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=fused)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.8))
    if how == "hook":
        optimizer.register_step_post_hook(lambda *_: ema.update_parameters(model))
    for index, (x, y) in enumerate(_batches()):
        if how == "plain" and index == BAD:
            continue
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if how == "plain":
            optimizer.step()
            ema.update_parameters(model)
            continue
        grads = torch.stack([p.grad.isfinite().all() for p in model.parameters()])
        skip = ~grads.all()
        (fused_step if fused else masked_step)(optimizer, skip.to(torch.float32))
        if how == "masked":
            masked_update_parameters(ema, model, skip)
    return ema


@pytest.mark.parametrize("fused", [False, True], ids=["masked AdamW", "fused AdamW"])
def test_an_ema_leaves_out_the_skipped_step_as_if_the_batch_was_never_there(fused: bool) -> None:
    plain, masked = _run(fused, "plain"), _run(fused, "masked")
    assert int(plain.n_averaged) == int(masked.n_averaged) == 7
    assert all(torch.equal(a, b) for a, b in zip(_tensors(plain), _tensors(masked)))
    hooked = _run(fused, "hook")  # what the refused hook does: NaN, or one step counted too many
    assert not all(torch.equal(a, b) for a, b in zip(_tensors(plain), _tensors(hooked)))
