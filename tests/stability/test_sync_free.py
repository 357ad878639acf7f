"""The stabilized step makes no host-device sync between ``check_every`` boundaries (CPU proof).

``.item()``, ``float(t)``, ``bool(t)`` and ``if t:`` all dispatch ``aten._local_scalar_dense``;
:class:`trainopt.stability.syncs.HostSyncCounter` counts those calls. On a GPU the same property is
checked with ``torch.cuda.set_sync_debug_mode("error")`` by ``trainopt.perf.bench.stability``.
"""

from __future__ import annotations

import math

import pytest
import torch
from optimizer_configs import HELD, ids

from trainopt.models import GPT, digits_mlp, gpt_config, synthetic_batch
from trainopt.perf.bench.stability import bare_step, per_parameter_sync_step
from trainopt.schedules.adapters import cosine_annealing_schedule
from trainopt.stability.clipping.norms import AdaptiveGradientClipper, ZScoreClipper
from trainopt.stability.skipping.schedule import UnsupportedScheduleError
from trainopt.stability.stabilizer import TrainingStabilizer
from trainopt.stability.syncs import HostSyncCounter

NOT_LINEAR = ("ASGD", "Rprop")  # their update is not linear in the rate
CHECK_EVERY = 100  # 10 warm-up steps, then 50 steady-state steps inside one window


def _gpt(seed: int = 0):
    """The reference transformer, at its smallest (one block): what the benchmark steps."""
    torch.manual_seed(seed)
    model = GPT(gpt_config("tiny", n_layer=1, block_size=16))
    x, y = synthetic_batch(model.config, 2, 16, generator=torch.Generator().manual_seed(seed))
    return model, (lambda: model(x, targets=y))


def _mlp(seed: int = 0):
    """A digits-sized MLP: the same step with fewer operators, for the configuration matrix."""
    torch.manual_seed(seed)
    model = digits_mlp(hidden=32)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    return model, (lambda: torch.nn.functional.cross_entropy(model(x), y))


CONFIGS = {
    "GPT, bf16 autocast, cosine LambdaLR": dict(dtype=torch.bfloat16, scheduler=True, model=_gpt),
    "fp32, clip 1.0": dict(dtype=None),
    "fp16 autocast + DynamicLossScaler": dict(dtype=torch.float16),
    "ZScoreClipper": dict(clipper=ZScoreClipper),
    "AdaptiveGradientClipper": dict(clipper=AdaptiveGradientClipper),
    "SGD momentum through masked_step": dict(optimizer="sgd"),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_fifty_steady_state_steps_of_each_configuration_make_no_host_sync(config: dict) -> None:
    model, compute_loss = config.get("model", _mlp)()
    if config.get("optimizer") == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    sched = (
        cosine_annealing_schedule(opt, total_steps=200, warmup_steps=10)
        if config.get("scheduler")
        else None
    )
    clipper = config["clipper"]() if "clipper" in config else None
    stabilizer = TrainingStabilizer(
        model, opt, sched, dtype=config.get("dtype"), clipper=clipper, check_every=CHECK_EVERY
    )
    for _ in range(10):
        stabilizer.step(compute_loss)
    with HostSyncCounter() as counter:
        for _ in range(50):
            stabilizer.step(compute_loss)
    assert stabilizer.last_report is None  # no boundary was crossed
    assert counter.count == 0, counter.stacks


def test_a_skipped_nan_step_is_decided_on_the_device_too() -> None:
    model, compute_loss = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    stabilizer = TrainingStabilizer(model, opt, check_every=100)
    for _ in range(10):
        stabilizer.step(compute_loss)
    with HostSyncCounter() as counter:
        stabilizer.step(lambda: compute_loss() * math.nan)
        stabilizer.step(compute_loss)
    assert counter.count == 0 and int(stabilizer.skipped) == 1


def test_the_boundary_is_where_the_host_reads() -> None:
    model, compute_loss = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    stabilizer = TrainingStabilizer(model, opt, check_every=5)
    for _ in range(4):
        stabilizer.step(compute_loss)
    with HostSyncCounter() as counter:
        stabilizer.step(compute_loss)  # the 5th step ends with check()
    assert counter.count >= 1 and stabilizer.last_report is not None


def test_counter_catches_a_naive_stacks_per_parameter_item_calls() -> None:
    """The proof can fail: a naive stack's monitoring reads the device once per parameter."""
    model, compute_loss = _gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    history: list[float] = []
    with HostSyncCounter() as counter:
        per_parameter_sync_step(model, opt, compute_loss, None, history)
    n_params = sum(1 for p in model.parameters() if p.requires_grad)
    assert counter.count >= n_params + 1


def test_bare_step_makes_no_host_sync_either() -> None:
    model, compute_loss = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    bare_step(model, opt, compute_loss, None)
    with HostSyncCounter() as counter:
        for _ in range(5):
            bare_step(model, opt, compute_loss, None)
    assert counter.count == 0


SCHEDULES = {
    "no scheduler": None,
    "cosine LambdaLR": lambda opt: cosine_annealing_schedule(opt, total_steps=40, warmup_steps=4),
    "OneCycleLR (cycles momentum)": lambda opt: torch.optim.lr_scheduler.OneCycleLR(
        opt,
        max_lr=0.02,
        total_steps=40,
        cycle_momentum="momentum" in opt.defaults or "betas" in opt.defaults,
    ),
}


def _count_syncs(config, stabilized: bool, schedule=None) -> int:
    model = config.model()
    opt = config.build(model.parameters())
    sched = schedule(opt) if schedule is not None else None
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    loss = lambda factor=1.0: torch.nn.functional.cross_entropy(model(x), y) * factor  # noqa: E731
    stabilizer = TrainingStabilizer(model, opt, sched, check_every=1000) if stabilized else None

    def step(factor: float = 1.0) -> None:
        if stabilizer is not None:
            stabilizer.step(lambda: loss(factor))
        else:
            opt.zero_grad(set_to_none=True)
            loss().backward()
            opt.step()
            if sched is not None:
                sched.step()

    step()
    with HostSyncCounter() as counter:
        for i in range(8):
            step(math.nan if i == 3 else 1.0)
    return counter.count


@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES.keys())
@pytest.mark.parametrize("config", HELD, ids=ids(HELD))
def test_the_stabilizer_adds_no_host_sync_to_any_optimizer_it_accepts(config, schedule) -> None:
    """Stabilized steps (a skipped NaN step among them) sync exactly as often as plain
    ``optimizer.step()`` and ``scheduler.step()`` calls, with a schedule that changes the rate
    (and the momentum) every step: never, for SGD, the fused optimizers and Muon. The others read
    their CPU step counters with ``.item()`` (Adafactor its norms; Rprop indexes with a mask):
    a host read on a CPU, refused on a GPU by ``check_skippable`` unless ``capturable=True``."""
    try:
        stabilized = _count_syncs(config, stabilized=True, schedule=schedule)
    except UnsupportedScheduleError as error:  # what torch's foreach path cannot take: listed
        assert config.cls.__name__ in NOT_LINEAR and config.implementation.get("foreach"), error
        return
    plain = _count_syncs(config, stabilized=False, schedule=schedule)
    assert stabilized == plain
    if config.cls in (torch.optim.SGD, torch.optim.Muon) or config.implementation.get("fused"):
        assert plain == 0


# On a GPU, torch keeps these optimizers' step counters on the CPU and offers no capturable form
# to keep them on the device (Adagrad's fused kernel is CPU-only); Adafactor's own step reads its
# norms with .item(). The stabilizer refuses them there, saying so.
REFUSED_ON_CUDA = ("Adagrad", "Adafactor")
BARE = list(
    {c.variant: c for c in HELD}.values()
)  # each class and setting once, as the user builds it


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("config", BARE, ids=[c.variant for c in BARE])
def test_a_bare_constructor_on_cuda_is_stabilized_without_a_device_sync(config) -> None:
    """What ``torch.optim.AdamW(params)`` resolves to on CUDA (``foreach``, CPU step counters):
    stabilized with a cosine schedule and a NaN batch, no step syncs, and the weights equal
    plain torch's run without the NaN batch."""
    from trainopt.stability.skipping.optimizers import UnsupportedOptimizerError

    def build():
        model = config.model().cuda()
        lr = {"lr": 0.01} if "lr" in config.cls.__init__.__code__.co_varnames else {}
        opt = config.cls(model.parameters(), **lr, **config.settings)
        return model, opt, cosine_annealing_schedule(opt, total_steps=40, warmup_steps=4)

    x, y = torch.randn(16, 6, device="cuda"), torch.randint(0, 3, (16,), device="cuda")
    model, opt, sched = build()
    try:
        stabilizer = TrainingStabilizer(model, opt, sched, check_every=1000)
    except UnsupportedOptimizerError as error:
        assert config.cls.__name__ in REFUSED_ON_CUDA, error
        return
    loss = lambda m, factor=1.0: torch.nn.functional.cross_entropy(m(x), y) * factor  # noqa: E731
    stabilizer.step(lambda: loss(model))
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(8):
            stabilizer.step(lambda: loss(model, math.nan if i == 3 else 1.0))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    ref, ref_opt, ref_sched = build()
    for i in range(9):
        if i == 4:
            continue
        ref_opt.zero_grad(set_to_none=True)
        loss(ref).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_opt.step()
        ref_sched.step()
    stabilizer.end_window()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
