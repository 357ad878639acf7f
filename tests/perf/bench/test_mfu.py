"""The one MFU definition and its peak table (trainopt.perf.bench.mfu)."""

from __future__ import annotations

import pytest

from trainopt.config.cli import UsageError
from trainopt.models import GPT, gpt_config
from trainopt.perf.bench.cli import check_peaks
from trainopt.perf.bench.mfu import (
    PEAK_TFLOPS,
    device_key,
    mfu,
    parse_peak_tflops,
    peak_flops_for,
)


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", None),
        ("NVIDIA GeForce RTX 4090", None),
        ("Tesla T4", None),
        ("NVIDIA H20", None),
    ],
)
def test_gpu_names_map_to_their_row_and_no_other(name, key):
    assert device_key(name) == key


# Dense data-sheet figures, typed here by hand: the table must agree with them.
DATA_SHEET = {
    ("H100 SXM", "fp32"): 66.9,
    ("H100 SXM", "bf16"): 989.4,
    ("H100 PCIe", "bf16"): 756.5,
    ("H100 NVL", "bf16"): 835.5,
    ("H100 NVL", "fp32"): 60.0,
    ("A100", "tf32"): 156.0,
    ("A100", "fp32"): 19.5,
    ("L4", "bf16"): 121.0,
}


@pytest.mark.parametrize("row, precision", list(DATA_SHEET))
def test_peaks_are_the_dense_data_sheet_figures(row, precision):
    assert PEAK_TFLOPS[row][precision] == DATA_SHEET[row, precision]


def test_every_named_gpu_has_every_precision_and_tensor_cores_beat_fp32():
    for row, peaks in PEAK_TFLOPS.items():
        assert set(peaks) == {"fp32", "tf32", "bf16", "fp16"}, row
        assert peaks["fp32"] < peaks["tf32"] < peaks["bf16"] == peaks["fp16"], row


def test_an_fp32_step_is_divided_by_the_fp32_peak_not_the_bf16_one():
    fp32, source = peak_flops_for("cuda", "fp32", device_name="NVIDIA H100 80GB HBM3")
    bf16, _ = peak_flops_for("cuda", "bf16", device_name="NVIDIA H100 80GB HBM3")
    assert (fp32, bf16) == (66.9e12, 989.4e12) and "fp32" in source


def test_an_unknown_gpu_is_never_taken_for_an_h100():
    with pytest.raises(ValueError, match="GPU 'NVIDIA H20' is not in the peak table"):
        peak_flops_for("cuda", "bf16", device_name="NVIDIA H20")
    assert peak_flops_for("cuda", "bf16", {"bf16": 148.0}, device_name="NVIDIA H20")[0] == 148e12
    with pytest.raises(
        ValueError, match="give its dense fp32 TFLOP/s"
    ):  # a peak for bf16 only is not one for fp32
        peak_flops_for("cuda", "fp32", {"bf16": 148.0}, device_name="NVIDIA H20")


def test_the_command_line_names_peak_tflops_for_an_unknown_gpu():
    with pytest.raises(UsageError) as error:
        check_peaks("cuda", ["bf16"], None, device_name="NVIDIA H20")
    assert error.value.field == "--peak-tflops" and "not in the peak table" in error.value.allowed
    check_peaks("cuda", ["bf16", "fp32"], {"*": 100.0}, device_name="NVIDIA H20")
    check_peaks("cpu", ["bf16"], None)  # a CPU needs no peak: it gets no MFU


def test_a_cpu_has_no_peak_unless_given():
    assert peak_flops_for("cpu", "bf16")[0] is None
    assert peak_flops_for("cpu", "bf16", 2.0)[0] == 2e12


@pytest.mark.parametrize(
    "text, expected", [("400", {"*": 400.0}), ("bf16=835.5,fp32=60", {"bf16": 835.5, "fp32": 60.0})]
)
def test_peak_tflops_text(text, expected):
    assert parse_peak_tflops(text) == expected


@pytest.mark.parametrize("text", ["0", "-3", "fp8=100", "bf16=", "", "fast"])
def test_bad_peak_tflops_text_is_refused(text):
    with pytest.raises(ValueError, match="must be a positive TFLOP/s"):
        parse_peak_tflops(text)


def test_mfu_of_the_gpt_by_hand():
    model = GPT(gpt_config("tiny"))
    c = model.config
    # N: every parameter but the position embedding, the tied token embedding once
    n = sum(p.numel() for name, p in model.named_parameters() if name != "wpe.weight")
    per_token = 6 * n + 12 * c.n_layer * c.n_embd * 64  # attention over the full 64 × 64 square
    assert model.flops_per_token(64) == per_token
    assert mfu(per_token, 1e6, 989.4e12) == per_token * 1e6 / 989.4e12
    with pytest.raises(ValueError, match="peak must be positive"):
        mfu(per_token, 1.0, 0.0)


def test_throughput_uses_the_one_peak_table():
    from trainopt.perf import throughput

    # By name, not identity: Sybil imports mfu.py again for its docstrings in a whole-suite run.
    one_table = (throughput.peak_flops_for.__module__, throughput.peak_flops_for.__qualname__)
    assert not hasattr(throughput, "DEVICE_PEAK_FLOPS")
    assert one_table == ("trainopt.perf.bench.mfu", "peak_flops_for")


def test_a_pcie_card_taken_for_sxm_underestimates_mfu():
    from trainopt.perf.bench.mfu import mfu, peak_flops_for

    sxm, _ = peak_flops_for("cuda", "bf16", device_name="NVIDIA H100 80GB HBM3")
    pcie, _ = peak_flops_for("cuda", "bf16", device_name="NVIDIA H100 PCIe")
    true_mfu, read_as_sxm = mfu(1e9, 3e5, pcie), mfu(1e9, 3e5, sxm)
    assert read_as_sxm < true_mfu and read_as_sxm / true_mfu == pytest.approx(756.5 / 989.4)


def test_flop_counter_counts_six_n_matmul_plus_non_causal_attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from trainopt.models import GPT, gpt_config, synthetic_batch

    model, seq_len = GPT(gpt_config("tiny")), 32
    x, y = synthetic_batch(model.config, 2, seq_len)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x, targets=y).backward()
    per_token = counter.get_total_flops() / (2 * seq_len)
    matmul_n = sum(
        p.numel() for n, p in model.named_parameters() if p.ndim == 2 and n != "wpe.weight"
    )
    c = model.config
    assert per_token == 6 * matmul_n + 12 * c.n_layer * c.n_embd * seq_len  # full T x T attention
    layer_norm = sum(p.numel() for p in model.parameters() if p.ndim == 1)
    assert model.flops_per_token(seq_len) - per_token == 6 * layer_norm
