"""Tests of trainopt.perf.traced_estimate: the peak of a training step of any model, traced on fake
tensors, against the peak measured on a CPU (and by CUDA's allocator where a GPU is present), and
of the memory page's results file (trainopt.perf.bench.estimates)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from extras import require
from tiny_runs import one_thread
from torch import nn

from trainopt.models import GPT, gpt_config
from trainopt.perf.bench.estimates import (
    FAMILIES,
    accelerate_estimate,
    compare,
    gpt_family,
    hf_gpt2_family,
    masked_cross_entropy,
    measure_step_peak,
    mlp_family,
    tied_lm_family,
)
from trainopt.perf.estimate import CUDA_WORKSPACE_BYTES, estimate_training_memory
from trainopt.perf.traced_estimate import (
    AUTOCAST_DTYPES,
    DataDependentShapeError,
    call_model,
    estimate_step_memory,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "_data" / "memory_estimate_cpu.json"

# Each family under four settings that between them cover fp32 and bf16 autocast, AdamW and SGD,
# with and without activation checkpointing of its blocks.
SETTINGS = [
    ("fp32", "adamw", False),
    ("bf16", "adamw", True),
    ("fp32", "sgd", True),
    ("bf16", "sgd", False),
]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    if request.param == "hf-gpt2":
        require("transformers", "hf")
    with one_thread():
        yield FAMILIES[request.param]()


@pytest.mark.parametrize("precision, optimizer, checkpointing", SETTINGS)
def test_estimate_is_the_peak_measured_on_a_cpu_within_5_percent(
    family, precision, optimizer, checkpointing
):
    skip_where_torch_cannot_run(family, precision)
    row = compare(family, optimizer, precision, checkpointing)
    assert abs(row["error"]) < 0.05, row


def skip_where_torch_cannot_run(family, precision: str) -> None:
    """Skip a setting whose plain forward pass torch itself refuses on this CPU.

    oneDNN's bf16 LSTM kernel needs AVX-512 (or AMX): on a CPU without them torch raises "could
    not create a primitive descriptor for the LSTM forward propagation primitive" for the
    stacked, bidirectional LSTM in bf16, with or without trainopt. There is no step to measure.
    """
    dtype = AUTOCAST_DTYPES[precision]
    if dtype is None:
        return
    try:
        with torch.autocast("cpu", dtype=dtype):  # with grad: the training kernel
            call_model(family.model, family.batch)
    except RuntimeError as error:
        if "could not create a primitive descriptor" not in str(error):
            raise
        pytest.skip(
            f"torch cannot run {family.name} in {precision} on this CPU (oneDNN: "
            f"{str(error).split('.')[0]})"
        )


def test_checkpointing_the_blocks_lowers_the_estimate_as_it_lowers_the_peak():
    family = gpt_family()
    plain = compare(family, "sgd", "fp32", checkpointing=False)
    blocks = compare(family, "sgd", "fp32", checkpointing=True)
    assert blocks["estimate_bytes"] < 0.8 * plain["estimate_bytes"]
    assert blocks["measured_bytes"] < 0.8 * plain["measured_bytes"]


def test_the_models_own_checkpointing_is_honoured():
    require("transformers", "hf")
    family = hf_gpt2_family()
    stored = estimate_step_memory(family.model, family.batch, optimizer="sgd").peak
    enable = getattr(family.model, "activation_checkpointing_enable", None)  # transformers >= 5.x
    if enable is None:
        family.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    else:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    recomputed = estimate_step_memory(family.model, family.batch, optimizer="sgd").peak
    measured = measure_step_peak(family, "sgd")
    assert recomputed < 0.8 * stored and abs(recomputed / measured - 1) < 0.05


def test_the_model_is_left_as_it_was():
    family = mlp_family(width=32, depth=2, batch_size=4)
    before = [(p, p.clone()) for p in family.model.parameters()]
    forwards = [m.forward for m in family.model]
    estimate_step_memory(
        family.model,
        family.batch,
        targets=family.targets,
        loss_fn=F.cross_entropy,
        checkpointing=family.checkpointing,
    )
    assert all(
        p is q and torch.equal(p, saved) and p.grad is None
        for (p, saved), q in zip(before, family.model.parameters())
    )
    assert [m.forward for m in family.model] == forwards  # checkpointing removed again


def test_a_model_on_meta_is_estimated_without_allocating_and_agrees_with_the_gpt_formula():
    with torch.device("meta"):
        model = GPT(gpt_config("124m"))
    ids = torch.empty(2, 1024, dtype=torch.long, device="meta")
    traced = estimate_step_memory(
        model,
        {"idx": ids, "targets": ids},
        precision="bf16",
        optimizer=lambda params: torch.optim.AdamW(params, foreach=True),
    )
    formula = estimate_training_memory(model, "bf16", batch_size=2, seq_len=1024, device="cpu")
    assert abs(traced.peak / formula.peak - 1) < 0.001
    assert traced.weights == formula.weights and traced.gradients == formula.gradients


def test_the_gpt_formula_points_other_models_to_the_traced_estimate():
    with pytest.raises(TypeError, match="estimate_step_memory"):
        estimate_training_memory(torch.nn.Sequential(torch.nn.Linear(2, 2)), "fp32")


def test_bad_arguments_name_the_field():
    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    with pytest.raises(ValueError, match="precision must be one of"):
        estimate_step_memory(model, x, loss_fn=torch.sum, precision="int8")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        estimate_step_memory(model, x, loss_fn=torch.sum, optimizer="lion")
    with pytest.raises(ValueError, match="loss_fn: the model returned"):
        estimate_step_memory(model, x)
    with pytest.raises(ValueError, match="checkpointing: no submodule named 'blocks'"):
        estimate_step_memory(model, x, loss_fn=torch.sum, checkpointing=["blocks"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device: 'cuda' is not available here"):
            estimate_step_memory(model, x, loss_fn=torch.sum, device="cuda")


def test_accelerate_multiplies_the_weights_by_four_in_fp32_and_two_in_bf16():
    model = torch.nn.Linear(10, 10)
    assert (
        accelerate_estimate(model, "fp32") == 4 * 110 * 4
        and accelerate_estimate(model, "bf16") == 2 * 110 * 4
    )


def test_the_committed_table_holds_every_family_within_5_percent():
    results = json.loads(RESULTS.read_text())
    rows = results["rows"]
    assert {r["family"] for r in rows} == {
        FAMILIES[name]().name for name in FAMILIES if name != "hf-gpt2"
    } | {"Hugging Face GPT-2"}
    assert {(r["precision"], r["optimizer"], r["checkpointing"]) for r in rows} == {
        (p, o, c) for p in ("fp32", "bf16") for o in ("adamw", "sgd") for c in (False, True)
    }
    assert all(abs(r["error"]) < 0.05 for r in rows), [r for r in rows if abs(r["error"]) >= 0.05]
    assert all(
        r["error"] == pytest.approx(r["estimate_bytes"] / r["measured_bytes"] - 1) for r in rows
    )
    assert results["meta"]["command"].startswith("python -m trainopt.perf.bench estimate")
    assert results["meta"]["git_dirty"] is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["gpt", "hf-gpt2"])
def test_estimate_is_the_peak_cuda_measures_within_5_percent(name):
    if name == "hf-gpt2":
        require("transformers", "hf")
    torch.manual_seed(0)
    if name == "gpt":
        model = GPT(gpt_config("124m")).cuda()
        ids = torch.randint(0, model.config.vocab_size, (8, 512), device="cuda")
        batch = {"idx": ids, "targets": ids}
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        model = (
            GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=512))
            .cuda()
            .train()
        )
        ids = torch.randint(0, 50257, (8, 512), device="cuda")
        batch = {"input_ids": ids, "labels": ids}
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    for step in range(3):
        if step == 2:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)
        (out if name == "gpt" else out.loss).backward()
        del out
        opt.step()
        opt.zero_grad(set_to_none=True)
    measured = torch.cuda.max_memory_allocated()
    estimate = estimate_step_memory(
        model,
        batch,
        precision="bf16",
        optimizer=lambda params: torch.optim.AdamW(params, fused=True),
    )
    assert estimate.workspace == CUDA_WORKSPACE_BYTES
    assert abs(estimate.peak / measured - 1) < 0.05, (estimate.phases, estimate.peak, measured)


def test_the_estimate_command_writes_a_results_file_and_prints_its_table(tmp_path, capsys):
    from trainopt.perf.bench.cli import main

    out = tmp_path / "memory_estimate_cpu.json"
    assert main(["estimate", "--families", "mlp", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 8 and all(abs(r["error"]) < 0.05 for r in rows)
    printed = capsys.readouterr().out.splitlines()  # the plain summary: a header, then a row each
    assert printed[0].startswith("estimate results on CPU") and printed[1].split()[:2] == [
        "family",
        "precision",
    ]
    assert len(printed) == 2 + len(rows) and all(line.split()[0] == "MLP" for line in printed[2:])


def test_the_loop_that_keeps_its_outputs_is_estimated_like_for_like():
    family = tied_lm_family()  # its logits (batch x tokens x vocabulary) outweigh its weights
    plain = estimate_step_memory(
        family.model, family.batch, targets=family.targets, loss_fn=family.loss_fn, optimizer="sgd"
    )
    kept = compare(family, "sgd", "fp32", checkpointing=False, keep_outputs=True)
    assert abs(kept["error"]) < 0.05, kept
    assert plain.peak < 0.95 * kept["measured_bytes"]  # the default step misses the held logits


def test_a_boolean_mask_of_the_labels_is_estimated_from_their_values():
    torch.manual_seed(0)
    head, x = nn.Linear(8, 512), torch.randn(256, 8)  # the selected logits outweigh the weights
    peaks = {}
    for kept in (32, 256):
        labels = torch.randint(1, 512, (256,)) * (torch.arange(256) < kept)  # 0: ignored
        family = FAMILIES["mlp"]()._replace(
            model=head, batch=x, targets=labels, loss_fn=masked_cross_entropy
        )
        row = compare(family, "sgd", "fp32", checkpointing=False)
        assert abs(row["error"]) < 0.05, row
        peaks[kept] = row["estimate_bytes"]
    assert peaks[32] < 0.8 * peaks[256]  # the estimate follows the number of labels kept


def test_the_integer_tensors_of_the_batch_are_read_not_changed():
    class Clamping(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.Embedding(8, 4)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.embedding(ids.clamp_(max=7))

    ids = torch.tensor([[3, 9, 12]])
    estimate_step_memory(Clamping(), ids, loss_fn=torch.sum)
    assert ids.tolist() == [[3, 9, 12]]


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(32, 8)
        self.rnn = nn.LSTM(8, 8, batch_first=True)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            self.embedding(ids), lengths, batch_first=True, enforce_sorted=False
        )
        return self.rnn(packed)[1][0][-1]


class Checked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        return out / 10 if out.abs().max().item() > 1e4 else out  # a Python if on a tensor


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 1)
        self.layer = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x[self.gate(x)[:, 0] > 0])  # the rows the gate opens: a mask of floats


def ids(*shape: int) -> torch.Tensor:
    return torch.randint(1, 32, shape)


REFUSALS = {
    "pack_padded_sequence, lengths on meta": (
        lambda: nn.ModuleDict({"encoder": Encoder()}),
        lambda model: estimate_step_memory(
            model.encoder, (ids(3, 5), torch.tensor([5, 2, 4], device="meta")), loss_fn=torch.sum
        ),
        "aten._pack_padded_sequence.default",
        "Encoder",
        "Encoder",
        "pass the lengths as a real integer tensor",
    ),
    "boolean mask of labels on meta": (
        lambda: nn.Linear(8, 5),
        lambda model: estimate_step_memory(
            model,
            torch.randn(12, 8),
            targets=torch.empty(12, dtype=torch.long, device="meta"),
            loss_fn=lambda out, y: F.cross_entropy(out[y != 0], y[y != 0]),
        ),
        "aten.index.Tensor",
        "loss_fn",
        None,
        "make the mask from real integer tensors",
    ),
    "boolean mask of activations": (
        lambda: nn.Sequential(nn.Linear(8, 8), Gated()),
        lambda model: estimate_step_memory(model, torch.randn(4, 8), loss_fn=torch.sum),
        "aten.index.Tensor",
        "1",
        "Gated",
        "keep the shape fixed (ignore_index=, torch.where, a fixed capacity)",
    ),
    ".item() in forward": (
        lambda: nn.Sequential(nn.ReLU(), Checked()),
        lambda model: estimate_step_memory(model, torch.randn(4, 8), loss_fn=torch.sum),
        "aten._local_scalar_dense.default",
        "1",
        "Checked",
        "move the check out of forward",
    ),
    "sparse embedding": (
        lambda: nn.Sequential(nn.Embedding(32, 8, sparse=True), nn.Linear(8, 2)),
        lambda model: estimate_step_memory(model, ids(4, 6), loss_fn=torch.sum, optimizer="sgd"),
        "aten.embedding_backward (Embedding, sparse=True)",
        "0",
        "Embedding",
        "estimate with sparse=False",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_data_dependent_shape_is_refused_with_one_error_naming_operator_and_module(case):
    build, estimate, operation, where, module, advice = REFUSALS[case]
    with pytest.raises(DataDependentShapeError) as raised:
        estimate(build())
    error = raised.value
    assert (error.operation, error.where) == (operation, where)
    place = where if where == "loss_fn" else f"module {where!r} ({module})"
    assert str(error).startswith(f"estimate_step_memory: {operation} in {place}: ")
    assert advice in str(error)
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
