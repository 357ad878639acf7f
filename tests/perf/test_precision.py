"""Tests of trainopt.perf.precision: names, hardware checks, autocast, TF32 settings, scaler."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from trainopt.perf import precision as precision_module
from trainopt.perf.precision import (
    PRECISIONS,
    MatmulSettings,
    Precision,
    PrecisionNotSupportedError,
    check_supported,
    make_scaler,
    supported_precisions,
)
from trainopt.stability.scaling.scaler import DynamicLossScaler

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_unknown_name_raises_value_error_listing_allowed_names():
    with pytest.raises(
        ValueError, match=r"precision must be one of \['fp32', 'tf32', 'bf16', 'fp16'\], got 'half'"
    ):
        Precision.from_name("half", "cpu")


@pytest.mark.parametrize("name", ["fp16", "tf32"])
def test_cuda_only_precisions_raise_on_cpu_naming_choice_and_allowed(name):
    with pytest.raises(PrecisionNotSupportedError) as info:
        Precision.from_name(name, "cpu")
    message = str(info.value)
    assert repr(name) in message and "CUDA" in message and "['fp32', 'bf16']" in message


def test_cpu_supports_fp32_and_bf16():
    assert supported_precisions("cpu") == ["fp32", "bf16"]
    check_supported("bf16", torch.device("cpu"))


def test_non_positive_init_scale_is_rejected():
    with pytest.raises(ValueError, match="init_scale must be positive"):
        Precision.from_name("fp32", "cpu", init_scale=0.0)


def test_bf16_autocast_on_cpu_runs_matmuls_in_bf16():
    layer = torch.nn.Linear(8, 8)
    with Precision.from_name("bf16", "cpu").autocast():
        out = layer(torch.randn(3, 8))
    assert out.dtype == torch.bfloat16
    assert layer.weight.dtype == torch.float32  # weights stay fp32 under autocast


def test_fp32_autocast_disables_an_enclosing_autocast():
    layer = torch.nn.Linear(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16), Precision.from_name("fp32", "cpu").autocast():
        out = layer(torch.randn(3, 8))
    assert out.dtype == torch.float32


@pytest.mark.parametrize("name", ["fp32", "bf16"])
def test_only_fp16_gets_a_scaler_on_cpu_precisions(name):
    assert Precision.from_name(name, "cpu").scaler is None


def test_fp32_wants_highest_and_tf32_wants_high_matmul_precision():
    assert Precision.from_name("fp32", "cpu").matmul == MatmulSettings("highest", False)
    tf32 = Precision("tf32", "cuda", None, MatmulSettings("high", True))
    before = MatmulSettings.current()
    with tf32.matmul_settings() as previous:
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cudnn.allow_tf32 is True
    assert previous == before and MatmulSettings.current() == before


def test_matmul_settings_are_restored_after_an_exception():
    before = MatmulSettings.current()
    tf32 = Precision("tf32", "cuda", None, MatmulSettings("high", True))
    with pytest.raises(RuntimeError, match="boom"), tf32.matmul_settings():
        raise RuntimeError("boom")
    assert MatmulSettings.current() == before


def test_fp32_backward_and_step_match_plain_torch():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    reference = copy.deepcopy(model)
    x = torch.randn(5, 4)
    precision = Precision.from_name("fp32", "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    precision.backward(model(x).square().mean())
    precision.unscale_(opt)
    precision.step(opt)
    reference(x).square().mean().backward()
    ref_opt.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q)


def test_bf16_step_on_cpu_lowers_the_loss():
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    precision = Precision.from_name("bf16", "cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(20):
        opt.zero_grad()
        with precision.autocast():
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        precision.backward(loss)
        precision.step(opt)
        losses.append(loss.detach())
    assert losses[-1] < losses[0]


def test_state_dict_without_scaler_is_empty_and_refuses_scaler_state():
    precision = Precision.from_name("bf16", "cpu")
    assert precision.state_dict() == {"scaler": None}
    with pytest.raises(ValueError, match="scaler"):
        precision.load_state_dict({"scaler": {"scale": 1.0}})


def test_module_never_uses_deprecated_cuda_amp_spellings():
    source = inspect.getsource(precision_module)
    assert "torch.cuda.amp" not in source


def test_unknown_scaler_is_rejected():
    with pytest.raises(
        ValueError, match=r"scaler must be one of \['trainopt', 'torch'\], got 'apex'"
    ):
        Precision.from_name("bf16", "cpu", scaler="apex")


@pytest.mark.parametrize("kind", ["trainopt", "torch"])
def test_both_scalers_scale_skip_and_back_off_alike(kind):
    scaler = make_scaler(kind, "cpu", init_scale=1024.0)
    model = torch.nn.Linear(4, 1)
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision("fp16", "cpu", None, MatmulSettings("highest", False), scaler)
    loss = model(torch.full((2, 4), float("inf"))).sum()
    precision.backward(loss)
    precision.step(opt)
    torch.testing.assert_close(model.weight, before)  # the overflowing step was skipped
    assert precision.scaler.get_scale() == 512.0  # and the scale halved


@needs_cuda
@pytest.mark.parametrize(
    "kind, cls", [("trainopt", DynamicLossScaler), ("torch", torch.amp.GradScaler)]
)
def test_fp16_on_cuda_has_the_chosen_scaler_and_skips_inf_steps(kind, cls):
    precision = Precision.from_name("fp16", "cuda", init_scale=1024.0, scaler=kind)
    assert isinstance(precision.scaler, cls)
    model = torch.nn.Linear(4, 1).cuda()
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with precision.autocast():
        loss = model(torch.full((2, 4), float("inf"), device="cuda")).float().sum()
    precision.backward(loss)
    precision.step(opt)
    torch.testing.assert_close(model.weight, before)  # the step was skipped
    assert precision.scaler.get_scale() < 1024.0  # and the scale backed off


@needs_cuda
def test_fp16_scaler_state_round_trips():
    first = Precision.from_name("fp16", "cuda", init_scale=512.0)
    second = Precision.from_name("fp16", "cuda")
    second.load_state_dict(first.state_dict())
    assert second.scaler.get_scale() == 512.0


@needs_cuda
@pytest.mark.parametrize("name", list(PRECISIONS))
def test_every_precision_runs_a_step_on_cuda_when_supported(name):
    if name not in supported_precisions("cuda"):
        pytest.skip(f"{name} is not supported by this device")
    model = torch.nn.Linear(8, 8).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision.from_name(name, "cuda")
    with precision.matmul_settings(), precision.autocast():
        loss = model(torch.randn(4, 8, device="cuda")).float().square().mean()
    precision.backward(loss)
    precision.step(opt)
    assert torch.isfinite(model.weight).all()


def test_native_bf16_supported_is_false_without_cuda_and_ignores_emulation(monkeypatch):
    from trainopt.perf.precision import native_bf16_supported

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert native_bf16_supported() is False
    calls = []

    def is_bf16_supported(including_emulation=True):
        calls.append(including_emulation)
        return including_emulation  # an emulating GPU: True only when emulation counts

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    assert native_bf16_supported() is False and calls == [False]


def test_make_scaler_passes_the_growth_interval_to_both_kinds():
    from trainopt.perf.precision import make_scaler

    for kind in ("torch", "trainopt"):
        assert make_scaler(kind, "cpu", 8.0, growth_interval=3).get_growth_interval() == 3
