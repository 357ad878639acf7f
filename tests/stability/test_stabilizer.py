"""Tests of trainopt.stability.stabilizer: guarded steps, skipped steps and the schedule, precision
modes."""

from __future__ import annotations

import copy
import io
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from optimizer_configs import HELD, assert_same, ids

from trainopt.schedules.adapters import cosine_annealing_schedule
from trainopt.stability.config import Detection
from trainopt.stability.scaling.scaler import DynamicLossScaler
from trainopt.stability.stabilizer import StabilityChecker, TrainingStabilizer

ROOT = Path(__file__).resolve().parents[2]


def _task(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x = torch.randn(64, 8)
    y = torch.randint(0, 4, (64,))
    return model, x, y


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, scale: float = 1.0):
    return lambda: F.cross_entropy(model(x), y) * scale


def _poison_grads(param: torch.Tensor, factor: float):
    """A hook that multiplies this parameter's gradient by ``factor`` (NaN, inf or 1000)."""
    return param.register_hook(lambda g: g * factor)


def _optimizer_state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [
        v.detach().clone() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)
    ]


def test_clean_steps_match_a_plain_clipped_adamw_loop() -> None:
    model, x, y = _task()
    reference = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
    stabilizer = TrainingStabilizer(model, opt, max_grad_norm=0.5, check_every=7)
    for _ in range(20):
        stabilizer.step(_loss(model, x, y))
        ref_opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("config", HELD, ids=ids(HELD))
@pytest.mark.parametrize("factor", [math.nan, math.inf], ids=["nan", "inf"])
def test_nonfinite_gradients_never_reach_weights_or_optimizer_state(config, factor: float) -> None:
    model = config.model()
    opt = config.build(model.parameters())
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    stabilizer = TrainingStabilizer(model, opt, check_every=100)
    for _ in range(3):
        stabilizer.step(_loss(model, x, y))
    weights = [p.detach().clone() for p in model.parameters()]
    state = _optimizer_state(opt)
    handle = _poison_grads(model[0].weight, factor)
    stabilizer.step(_loss(model, x, y))
    handle.remove()
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))
    assert all(torch.equal(a, b) for a, b in zip(_optimizer_state(opt), state))
    stabilizer.step(_loss(model, x, y))  # training goes on
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert int(stabilizer.skipped) == 1


def test_overflow_is_judged_from_gradients_not_the_loss() -> None:
    """Seed defect: it tested the scaled loss; here the loss is finite and a gradient is not."""
    model, x, y = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    stabilizer = TrainingStabilizer(model, opt, check_every=100)
    before = [p.detach().clone() for p in model.parameters()]
    handle = _poison_grads(model[2].bias, math.inf)
    loss = stabilizer.step(_loss(model, x, y))
    handle.remove()
    assert torch.isfinite(loss)
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), before))


@pytest.mark.parametrize("skip_unstable, expect_skipped", [(True, 1), (False, 0)])
def test_loss_spike_step_is_skipped_only_when_asked(
    skip_unstable: bool, expect_skipped: int
) -> None:
    model, x, y = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    stabilizer = TrainingStabilizer(
        model, opt, check_every=100, detection=Detection(skip_unstable=skip_unstable)
    )
    for _ in range(25):
        stabilizer.step(_loss(model, x, y))
    stabilizer.step(_loss(model, x, y, scale=100.0))
    assert int(stabilizer.skipped) == expect_skipped


def _nan_at(steps: set[int], stabilizer: TrainingStabilizer, model, x, y, total: int) -> None:
    for i in range(total):
        handle = _poison_grads(model[0].weight, math.nan) if i in steps else None
        stabilizer.step(_loss(model, x, y))
        if handle:
            handle.remove()


def test_skipped_steps_do_not_advance_a_lambda_schedule() -> None:
    model, x, y = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    sched = cosine_annealing_schedule(opt, total_steps=100, warmup_steps=5)
    stabilizer = TrainingStabilizer(model, opt, sched, check_every=10)
    _nan_at({3, 4, 8, 13}, stabilizer, model, x, y, total=20)
    assert stabilizer.applied_steps == 16
    assert sched.last_epoch == 16
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * sched.lr_lambdas[0](16))


def test_no_scheduler_before_optimizer_warning_when_steps_are_skipped() -> None:
    model, x, y = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    sched = cosine_annealing_schedule(opt, total_steps=50, warmup_steps=5)
    stabilizer = TrainingStabilizer(model, opt, sched, check_every=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _nan_at({0, 1}, stabilizer, model, x, y, total=6)


def test_fp16_adds_a_loss_scaler_that_backs_off_on_overflow() -> None:
    model, x, y = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    stabilizer = TrainingStabilizer(model, opt, dtype=torch.float16, check_every=100)
    assert isinstance(stabilizer.scaler, DynamicLossScaler)
    stabilizer.step(_loss(model, x, y))
    scale = stabilizer.scaler.get_scale()
    handle = _poison_grads(model[0].weight, math.inf)
    stabilizer.step(_loss(model, x, y))
    handle.remove()
    assert stabilizer.scaler.get_scale() == scale / 2
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_torch_gradscaler_works_as_the_fp16_scaler() -> None:
    model, x, y = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    stabilizer = TrainingStabilizer(model, opt, dtype="fp16", scaler=scaler, check_every=100)
    before = model[0].weight.detach().clone()
    stabilizer.step(_loss(model, x, y))
    assert not torch.equal(before, model[0].weight) and scaler.get_scale() == 2.0**10


def test_bf16_needs_no_loss_scaler() -> None:
    model, x, y = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    stabilizer = TrainingStabilizer(model, opt, dtype=torch.bfloat16)
    assert stabilizer.scaler is None
    assert stabilizer.step(_loss(model, x, y)).dtype == torch.float32
    with pytest.raises(ValueError, match="scaler"):
        TrainingStabilizer(model, opt, dtype=torch.bfloat16, scaler=DynamicLossScaler())


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"dtype": "fp8"}, "dtype"),
        ({"check_every": 0}, "check_every"),
        ({"max_grad_norm": -1.0}, "max_grad_norm"),
    ],
)
def test_stabilizer_rejects_bad_arguments_by_name(kwargs: dict, field: str) -> None:
    model, _, _ = _task()
    with pytest.raises(ValueError, match=field):
        TrainingStabilizer(model, torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


WRONG = {
    "a loss spike": (lambda loss, model: loss * 50.0, "loss spikes"),
    "a NaN loss": (lambda loss, model: loss + math.nan, "non-finite losses"),
    "a non-finite gradient": (
        lambda loss, model: loss + 0.0 * model[0].weight.sum() * math.inf,
        "non-finite gradient norms",
    ),
    "a gradient explosion": (
        lambda loss, model: loss + 1e4 * model[2].bias.pow(2).sum(),
        "gradient explosions",
    ),
}


@pytest.mark.parametrize("hurt, reason", WRONG.values(), ids=WRONG.keys())
def test_stability_checker_names_what_went_wrong(hurt, reason: str) -> None:
    model, x, y = _task()
    checker = StabilityChecker(model, check_every=30)
    for i in range(30):
        model.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss = hurt(loss, model) if i == 25 else loss
        loss.backward()
        checker.update(loss)
    report = checker.check()
    assert not report["is_stable"] and report["flagged_steps"] >= 1
    assert any(reason in r for r in report["reasons"]), report["reasons"]


def test_stabilizer_state_survives_a_weights_only_checkpoint() -> None:
    model, x, y = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    stabilizer = TrainingStabilizer(model, opt, check_every=100)
    for _ in range(25):  # past min_history: every statistic is a number
        stabilizer.step(_loss(model, x, y))
    buffer = io.BytesIO()
    torch.save(stabilizer.state_dict(), buffer)
    buffer.seek(0)
    other = TrainingStabilizer(model, opt, check_every=100)
    other.load_state_dict(torch.load(buffer, weights_only=True))
    assert other.steps == 25
    assert other.checker.loss_monitor.summary() == stabilizer.checker.loss_monitor.summary()


def test_no_deprecated_cuda_amp_spelling_in_src_or_docs() -> None:
    """``torch.amp.autocast(device_type, ...)`` and ``torch.amp.GradScaler(device)`` only.

    Any use counts (an import, a call, a ``with``); prose that names the deprecated module to
    warn against it does not.
    """
    pattern = re.compile(
        r"from\s+torch\.cuda\.amp\s+import|import\s+torch\.cuda\.amp"
        r"|torch\.cuda\.amp\.(autocast|GradScaler|custom_fwd|custom_bwd)\b\s*[(\[]?"
    )
    seed_lines = [
        "from torch.cuda.amp import autocast, GradScaler",
        "with torch.cuda.amp.autocast():",
        "scaler = torch.cuda.amp.GradScaler()",
    ]
    assert all(pattern.search(line) for line in seed_lines)  # the check can fail
    assert not pattern.search("Deprecation warnings about `torch.cuda.amp`.")
    offenders = []
    for folder in ("src", "docs"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix not in {".py", ".md", ".yaml", ".yml", ".json", ".txt"}:
                continue
            if any(part.startswith("_build") or part == "_generated" for part in path.parts):
                continue
            for n, line in enumerate(path.read_text(errors="ignore").splitlines(), start=1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}")
    assert not offenders, offenders


def test_rollback_at_a_boundary_keeps_schedule_and_applied_steps_aligned(tmp_path: Path) -> None:
    from trainopt.stability.checkpointing.checkpoint import CheckpointManager
    from trainopt.stability.recovery.rollback import TrainingRecovery

    model, x, y = _task()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    sched = cosine_annealing_schedule(opt, total_steps=100, warmup_steps=5)
    recovery = TrainingRecovery(
        model, opt, CheckpointManager(tmp_path, save_every=10), scheduler=sched, lr_factor=0.5
    )
    stabilizer = TrainingStabilizer(model, opt, sched, check_every=10, recovery=recovery)
    _nan_at({3}, stabilizer, model, x, y, total=20)  # boundaries at 10 and 20 save checkpoints
    saved = [p.detach().clone() for p in model.parameters()]
    for i in range(10):
        stabilizer.step(_loss(model, x, y))
        if i == 2:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 3.0)
    assert stabilizer.last_report["recovered"] is not None
    assert stabilizer.steps == 20 and stabilizer.applied_steps == 19 == sched.last_epoch
    assert all(torch.equal(p, s) for p, s in zip(model.parameters(), saved))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * 1e-2 * sched.lr_lambdas[0](19))


def _resumable_run(folder: Path, seed: int = 1):
    """Everything a run owns, built from scratch: a crash loses all of it but the folder."""
    from trainopt.stability.checkpointing.checkpoint import CheckpointManager
    from trainopt.stability.checkpointing.loader import ResumableSampler
    from trainopt.stability.clipping.norms import ZScoreClipper
    from trainopt.stability.recovery.rollback import TrainingRecovery

    model, x, y = _task(seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    sched = cosine_annealing_schedule(opt, total_steps=40, warmup_steps=4)
    recovery = TrainingRecovery(
        model, opt, CheckpointManager(folder, save_every=5), scheduler=sched
    )
    sampler = ResumableSampler(len(x), 16, seed=seed)
    stabilizer = TrainingStabilizer(
        model,
        opt,
        sched,
        clipper=ZScoreClipper(warmup_steps=3),
        check_every=5,
        recovery=recovery,
        data=sampler,
    )
    return stabilizer, x, y


def _train_to(stabilizer: TrainingStabilizer, x, y, steps: int) -> None:
    """Batches from the stabilizer's sampler; a dropout-like random mask; a NaN loss at batch 3."""
    sampler, model = stabilizer.data, stabilizer.model
    while stabilizer.steps < steps:
        idx = sampler.next_batch()
        drawn = sampler.epoch * len(sampler) + sampler.position
        mask = (torch.rand(len(idx), 1) > 0.1).float()
        factor = math.nan if drawn == 3 else 1.0
        stabilizer.step(lambda: F.cross_entropy(model(x[idx] * mask), y[idx]) * factor)


def test_a_restart_from_the_stabilizers_own_checkpoint_is_bitwise_the_same_run(
    tmp_path: Path,
) -> None:
    """Crash at step 13 (last checkpoint: 10), rebuild everything, resume(), train to 30: the same
    weights, optimizer, schedule, clipper, counters, windows, recovery state, data position and
    random numbers as the run that never stopped. Nothing is added to the checkpoint by hand."""
    torch.manual_seed(0)
    straight, x, y = _resumable_run(tmp_path / "a")
    _train_to(straight, x, y, 30)
    generator_after = torch.get_rng_state()

    torch.manual_seed(0)
    crashed, _, _ = _resumable_run(tmp_path / "b")
    _train_to(crashed, x, y, 13)
    del crashed
    torch.manual_seed(1234)  # a fresh process starts from other generator states
    resumed, _, _ = _resumable_run(tmp_path / "b", seed=1)
    assert resumed.resume() == 10
    _train_to(resumed, x, y, 30)

    assert all(
        torch.equal(p, q) for p, q in zip(straight.model.parameters(), resumed.model.parameters())
    )
    assert all(
        torch.equal(a, b)
        for a, b in zip(_optimizer_state(straight.optimizer), _optimizer_state(resumed.optimizer))
    )
    assert straight.scheduler.state_dict() == resumed.scheduler.state_dict()
    assert straight.skip_events == resumed.skip_events == 1 and resumed.applied_steps == 29
    counters = ("steps", "skipped_steps", "skip_events", "last_save")
    assert [getattr(straight, c) for c in counters] == [getattr(resumed, c) for c in counters]
    assert_same(straight.checker.state_dict(), resumed.checker.state_dict())
    assert straight.clipper.state_dict().keys() == resumed.clipper.state_dict().keys()
    assert all(
        torch.equal(torch.as_tensor(v), torch.as_tensor(resumed.clipper.state_dict()[k]))
        for k, v in straight.clipper.state_dict().items()
    )
    assert straight.recovery.state_dict() == resumed.recovery.state_dict()
    assert straight.data.state_dict() == resumed.data.state_dict()
    assert torch.equal(torch.get_rng_state(), generator_after)  # the masks drawn were the same


def test_a_rollback_restores_the_trajectory_and_keeps_counting_skips(tmp_path: Path) -> None:
    stabilizer, x, y = _resumable_run(tmp_path)
    _train_to(stabilizer, x, y, 10)
    saved = [p.detach().clone() for p in stabilizer.model.parameters()]
    with torch.no_grad():
        for p in stabilizer.model.parameters():
            p.add_(torch.randn_like(p) * 3.0)
    _train_to(stabilizer, x, y, 14)
    stabilizer.step(
        lambda: F.cross_entropy(stabilizer.model(x), y)
    )  # the boundary at 15 rolls back to 10
    assert [h["restored_step"] for h in stabilizer.recovery.history] == [10]
    assert stabilizer.steps == 10 and stabilizer.recovery.lr_scale == 0.5
    assert all(torch.equal(p, s) for p, s in zip(stabilizer.model.parameters(), saved))
    # the NaN before the checkpoint stays counted; the rollback rewound the trajectory's count
    assert stabilizer.skip_events == 1 and stabilizer.skipped_steps == 1
    assert stabilizer.recovery.history[0]["reason"].startswith("diverging")
