"""A skipped step is a no-op, for every optimizer of torch.optim, in each implementation it offers.

For each configuration of ``optimizer_configs`` (every class of the installed ``torch.optim``,
hyperparameter variants, ``foreach=False``/``foreach=True``/``fused=True``): a step skipped by
:class:`TrainingStabilizer`, at the first step or mid-run, followed by clean steps, gives bit for
bit the weights and optimizer state of plain torch running the clean steps only. Freed memory
is filled with NaN first, so state that a skipped step leaves uninitialised shows. The
configurations that cannot be skipped exactly are refused when the stabilizer is built.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from optimizer_configs import (
    CONFIGS,
    HELD,
    REFUSED,
    REFUSED_CONFIGS,
    assert_same,
    ids,
    nan_allocator,
    optimizer_state,
)

from trainopt.stability.scaling.scaler import DynamicLossScaler
from trainopt.stability.skipping.optimizers import UnsupportedOptimizerError, check_skippable
from trainopt.stability.skipping.step import fused_step, masked_step
from trainopt.stability.stabilizer import TrainingStabilizer

CLEAN_STEPS = 4


def _batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator))
        for _ in range(n)
    ]


def _loss(model, batch, factor: float = 1.0):
    x, y = batch
    return F.cross_entropy(model(x), y) * factor


def _plain_run(config, batches):
    model = config.model()
    opt = config.build(model.parameters())
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        _loss(model, batch).backward()
        opt.step()
    return model, opt


def _stabilized_run(config, batches, skip_at: int):
    model = config.model()
    nan_allocator([p.shape for p in model.parameters()])
    opt = config.build(model.parameters())
    stabilizer = TrainingStabilizer(model, opt, max_grad_norm=None, check_every=1000)
    clean = iter(batches)
    for step in range(len(batches) + 1):
        if step == skip_at:
            stabilizer.step(lambda: _loss(model, batches[0], math.nan))
        else:
            batch = next(clean)
            stabilizer.step(lambda: _loss(model, batch))
    assert int(stabilizer.skipped) == 1
    return model, opt


@pytest.mark.parametrize("skip_at", [0, 2], ids=["first step", "mid-run"])
@pytest.mark.parametrize("config", HELD, ids=ids(HELD))
def test_a_skipped_step_then_clean_steps_equals_the_clean_steps_of_plain_torch(
    config, skip_at: int
) -> None:
    batches = _batches(CLEAN_STEPS)
    reference, ref_opt = _plain_run(config, batches)
    model, opt = _stabilized_run(config, batches, skip_at)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_same(p.detach(), q.detach(), name)
    assert_same(optimizer_state(opt), optimizer_state(ref_opt), "state")


@pytest.mark.parametrize("config", REFUSED_CONFIGS, ids=ids(REFUSED_CONFIGS))
def test_optimizers_that_cannot_be_skipped_exactly_are_refused_naming_an_alternative(
    config,
) -> None:
    model = config.model()
    opt = config.build(model.parameters())
    with pytest.raises(UnsupportedOptimizerError) as caught:
        TrainingStabilizer(model, opt)
    message = str(caught.value)
    why = REFUSED.get(config.cls.__name__) or REFUSED[config.variant]
    assert message.startswith(f"{config.cls.__name__} cannot be stabilized") and why in message
    assert "; use " in message  # the supported alternative


def test_the_configurations_cover_every_class_of_torch_optim() -> None:
    classes = {c.cls for c in CONFIGS}
    assert classes == {
        cls
        for cls in vars(torch.optim).values()
        if isinstance(cls, type)
        and issubclass(cls, torch.optim.Optimizer)
        and cls is not torch.optim.Optimizer
    }
    assert {tuple(c.implementation) for c in CONFIGS} >= {("foreach",), ("fused",)}
    assert len(HELD) + len(REFUSED_CONFIGS) == len(CONFIGS) and len(REFUSED_CONFIGS) == 5


@pytest.mark.parametrize(
    "config",
    [c for c in HELD if not c.implementation.get("fused")],
    ids=ids([c for c in HELD if not c.implementation.get("fused")]),
)
def test_masked_skip_of_first_step_equals_never_stepping(config) -> None:
    """The state a skipped first step leaves is the state the next real first step creates."""
    batches = _batches(2)
    model = config.model()
    never = config.model()
    opt, never_opt = config.build(model.parameters()), config.build(never.parameters())
    _loss(model, batches[0], math.nan).backward()
    masked_step(opt, torch.tensor(1.0))
    for m, o in ((model, opt), (never, never_opt)):
        o.zero_grad(set_to_none=True)
        _loss(m, batches[1]).backward()
        o.step()
    for p, q in zip(model.parameters(), never.parameters()):
        assert_same(p.detach(), q.detach())
    assert_same(optimizer_state(opt), optimizer_state(never_opt))


@pytest.mark.parametrize("config", HELD, ids=ids(HELD))
def test_an_applied_masked_or_fused_step_is_exactly_the_plain_step(config) -> None:
    batches = _batches(3)
    model, reference = config.model(), config.model()
    opt, ref_opt = config.build(model.parameters()), config.build(reference.parameters())
    for batch in batches:
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad(set_to_none=True)
            _loss(m, batch).backward()
        (fused_step if config.implementation.get("fused") else masked_step)(opt, torch.tensor(0.0))
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_same(p.detach(), q.detach())
    assert_same(optimizer_state(opt), optimizer_state(ref_opt))


def test_torch_fused_sgd_keeps_buffers_a_skipped_first_step_makes_fused_step_zeroes_them() -> None:
    """The upstream behaviour fused_step repairs: torch's own found_inf path, without the repair."""
    batches = _batches(2)
    config = next(c for c in HELD if c.name == "SGD(momentum=0.9) [fused=True]")
    model = config.model()
    opt = config.build(model.parameters())
    _loss(model, batches[0], math.nan).backward()
    opt.found_inf = torch.tensor(1.0)
    nan_allocator([p.shape for p in model.parameters()])
    opt.step()
    del opt.found_inf
    buffers = [s["momentum_buffer"] for s in opt.state.values()]
    assert len(buffers) == len(list(model.parameters()))  # created by a step that did nothing
    repaired = config.model()
    repaired_opt = config.build(repaired.parameters())
    _loss(repaired, batches[0], math.nan).backward()
    fused_step(repaired_opt, torch.tensor(1.0))
    assert all(
        torch.equal(s["momentum_buffer"], torch.zeros_like(s["momentum_buffer"]))
        for s in repaired_opt.state.values()
    )


def test_dynamic_loss_scaler_repairs_a_skipped_first_fused_sgd_step() -> None:
    """GradScaler shares torch's fused-SGD behaviour; DynamicLossScaler steps through fused_step."""
    batches = _batches(CLEAN_STEPS)
    config = next(c for c in HELD if c.name == "SGD(momentum=0.9) [fused=True]")
    reference, ref_opt = _plain_run(config, batches)
    model = config.model()
    nan_allocator([p.shape for p in model.parameters()])
    opt = config.build(model.parameters())
    scaler = DynamicLossScaler(init_scale=2.0**4, growth_interval=1000)
    for i, batch in enumerate([batches[0], *batches]):
        opt.zero_grad(set_to_none=True)
        scaler.scale(_loss(model, batch, math.inf if i == 0 else 1.0)).backward()
        scaler.step(opt)
        scaler.update()
    assert int(scaler.skipped_steps) == 1
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_check_skippable_refuses_state_on_another_device_than_the_parameters() -> None:
    """Non-capturable Adam keeps its step counter on the CPU: with parameters elsewhere (here
    the meta device stands in for a GPU), undoing a skip would read the flag on the host."""
    w = torch.nn.Parameter(torch.zeros(3, device="meta"))
    with pytest.raises(
        UnsupportedOptimizerError, match=r"Adam cannot be stabilized: its state 'step' lives on cpu"
    ):
        check_skippable(torch.optim.Adam([w]))


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: the sync check runs a step on the GPU"
)
@pytest.mark.parametrize(
    "make, refused",
    [
        (lambda p: torch.optim.AdamW(p, fused=True), False),
        (lambda p: torch.optim.AdamW(p, capturable=True), False),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), False),
        (lambda p: torch.optim.AdamW(p), True),
        (lambda p: torch.optim.Adafactor(p), True),
        (lambda p: torch.optim.Rprop(p), True),
    ],
    ids=["fused AdamW", "capturable AdamW", "SGD momentum", "AdamW", "Adafactor", "Rprop"],
)
def test_on_cuda_only_configurations_that_never_sync_are_accepted(make, refused: bool) -> None:
    w = torch.nn.Parameter(torch.zeros(4, 4, device="cuda"))
    if refused:
        with pytest.raises(UnsupportedOptimizerError):
            check_skippable(make([w]))
    else:
        check_skippable(make([w]))
