"""The memory estimate of any model against the peak measured on a CPU, for five model families.

``python -m trainopt.perf.bench estimate --out docs/_data/memory_estimate_cpu.json`` builds
each family of :data:`FAMILIES` (an MLP, a ResNet-style CNN, ``nn.TransformerEncoder``, the
project's GPT and, where ``transformers`` is installed, a Hugging Face GPT-2 built from its
config) and, for each precision, optimizer and with or without activation checkpointing:

- estimates the peak of a training step with
  :func:`~trainopt.perf.traced_estimate.estimate_step_memory` (fake tensors: nothing allocated);
- measures the peak of a real steady-state step on the CPU
  (:func:`~trainopt.perf.peak.measure_peak_memory`, weights, buffers and batch included);
- computes what Accelerate's ``accelerate estimate-memory`` gives for the same model
  (:func:`accelerate_estimate`).

The command prints a summary of the file (:mod:`trainopt.perf.bench.summary`); the memory page
renders it as a table.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from trainopt.models import GPT, Block, gpt_config
from trainopt.perf.bench.results import Results, new_results
from trainopt.perf.peak import measure_peak_memory
from trainopt.perf.traced_estimate import (
    AUTOCAST_DTYPES,
    call_model,
    checkpointed,
    estimate_step_memory,
    make_optimizer,
    model_loss,
)


class Family(NamedTuple):
    """A model with an example batch, its loss and the submodules worth checkpointing.

    ``batch`` goes to the model (:func:`~trainopt.perf.traced_estimate.call_model`);
    ``loss_fn(output, targets)`` makes the loss (None: the model returns it); ``checkpointing``
    is what :func:`~trainopt.perf.traced_estimate.estimate_step_memory` takes.

    Example:
        >>> from trainopt.perf.bench.estimates import mlp_family
        >>> family = mlp_family()
        >>> family.name, family.model(family.batch).shape
        ('MLP', torch.Size([1024, 10]))
    """

    name: str
    model: nn.Module
    batch: Any
    targets: Any
    loss_fn: Callable[..., torch.Tensor] | None
    checkpointing: Any


def mlp_family(width: int = 512, depth: int = 4, batch_size: int = 1024) -> Family:
    """An MLP of ``depth`` blocks (Linear, GELU) and a 10-way head; checkpointing: the blocks.

    Example:
        >>> from trainopt.perf.bench.estimates import mlp_family
        >>> len(mlp_family(depth=2).model)
        3
    """
    torch.manual_seed(0)
    blocks = [
        nn.Sequential(nn.Linear(64 if i == 0 else width, width), nn.GELU()) for i in range(depth)
    ]
    model = nn.Sequential(*blocks, nn.Linear(width, 10))
    return Family(
        "MLP",
        model,
        torch.randn(batch_size, 64),
        torch.randint(0, 10, (batch_size,)),
        F.cross_entropy,
        blocks,
    )


class ResidualBlock(nn.Module):
    """Two 3×3 convolutions with batch norm and an identity shortcut, as in ResNet's basic block.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import ResidualBlock
        >>> ResidualBlock(8)(torch.randn(2, 8, 4, 4)).shape
        torch.Size([2, 8, 4, 4])
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


def cnn_family(
    channels: int = 32, blocks: int = 2, batch_size: int = 16, image: int = 32
) -> Family:
    """A ResNet-style CNN: a stem, ``blocks`` residual blocks, pooling and a 10-way head.

    Example:
        >>> from trainopt.perf.bench.estimates import cnn_family
        >>> family = cnn_family()
        >>> family.model(family.batch).shape
        torch.Size([16, 10])
    """
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        *[ResidualBlock(channels) for _ in range(blocks)],
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(channels, 10),
    )
    return Family(
        "ResNet-style CNN",
        model,
        torch.randn(batch_size, 3, image, image),
        torch.randint(0, 10, (batch_size,)),
        F.cross_entropy,
        ResidualBlock,
    )


def encoder_family(
    width: int = 128, layers: int = 2, batch_size: int = 8, seq_len: int = 128
) -> Family:
    """``nn.TransformerEncoder`` (dropout 0.1, batch first) regressing random targets.

    Example:
        >>> from trainopt.perf.bench.estimates import encoder_family
        >>> family = encoder_family()
        >>> family.model(family.batch).shape
        torch.Size([8, 128, 128])
    """
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        width, nhead=4, dim_feedforward=4 * width, dropout=0.1, batch_first=True
    )
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    x = torch.randn(batch_size, seq_len, width)
    return Family(
        "nn.TransformerEncoder",
        model,
        x,
        torch.randn_like(x),
        F.mse_loss,
        nn.TransformerEncoderLayer,
    )


def gpt_family(batch_size: int = 8, seq_len: int = 64) -> Family:
    """The project's GPT (``gpt_config("tiny")``), which returns its loss; checkpointing: its
    blocks.

    Example:
        >>> from trainopt.perf.bench.estimates import gpt_family
        >>> family = gpt_family()
        >>> family.model(**family.batch).shape
        torch.Size([])
    """
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny"))
    ids = torch.randint(0, model.config.vocab_size, (batch_size, seq_len))
    return Family("trainopt GPT", model, {"idx": ids, "targets": ids}, None, None, Block)


def hf_gpt2_family(batch_size: int = 8, seq_len: int = 64) -> Family:
    """A Hugging Face ``GPT2LMHeadModel`` built from a config (2 layers, width 128): nothing
    downloaded.

    Needs ``transformers`` (``pip install "trainopt[hf]"``); checkpointing: its ``GPT2Block``.

    Example:
        >>> from importlib.util import find_spec
        >>> from trainopt.perf.bench.estimates import hf_gpt2_family

        .. skip: start if(find_spec("transformers") is None, reason="needs transformers")

        >>> family = hf_gpt2_family()
        >>> family.model(**family.batch).loss.shape
        torch.Size([])

        .. skip: end
    """
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=64)
    )
    model.train()
    ids = torch.randint(0, 512, (batch_size, seq_len))
    return Family(
        "Hugging Face GPT-2", model, {"input_ids": ids, "labels": ids}, None, None, GPT2Block
    )


FAMILIES: dict[str, Callable[[], Family]] = {
    "mlp": mlp_family,
    "cnn": cnn_family,
    "encoder": encoder_family,
    "gpt": gpt_family,
    "hf-gpt2": hf_gpt2_family,
}
"""The model families of the memory page's table, by the name ``--families`` takes."""

NEEDS = {"hf-gpt2": "transformers"}
"""The package a family needs beyond torch."""


def available_families() -> list[str]:
    """The families whose packages are installed here.

    Example:
        >>> from trainopt.perf.bench.estimates import available_families
        >>> available_families()[:4]
        ['mlp', 'cnn', 'encoder', 'gpt']
    """
    return [
        name
        for name in FAMILIES
        if name not in NEEDS or importlib.util.find_spec(NEEDS[name]) is not None
    ]


def accelerate_estimate(model: nn.Module, precision: str = "fp32") -> int:
    """What ``accelerate estimate-memory`` gives for training ``model`` with Adam, in bytes.

    Accelerate (``accelerate/commands/estimate.py``, ``estimate_training_usage``) takes the size
    ``S`` of the weights and buffers and the largest of four stages: in float32 the model ``S``,
    gradients ``S``, optimizer ``2·S`` and step ``4·S``, so ``4·S``; in float16 or bfloat16 the
    model ``S``, gradients ``1.5·S``, optimizer ``2·S`` and step ``2·S``, so ``2·S``. The batch,
    the activations and the optimizer do not enter.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import accelerate_estimate
        >>> layer = torch.nn.Linear(1000, 1000)  # 1,001,000 fp32 parameters
        >>> accelerate_estimate(layer, "fp32"), accelerate_estimate(layer, "bf16")
        (16016000, 8008000)
    """
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return 4 * size if AUTOCAST_DTYPES[precision] is None else 2 * size


def measure_step_peak(
    family: Family, optimizer: str = "adamw", precision: str = "fp32", checkpointing: bool = False
) -> int:
    """Peak bytes of a real steady-state training step of ``family`` on the CPU.

    The step is the one :func:`~trainopt.perf.traced_estimate.estimate_step_memory` traces;
    weights, buffers, optimizer state and the batch count as they do on a GPU.

    Example:
        >>> from trainopt.perf.bench.estimates import measure_step_peak, mlp_family
        >>> measure_step_peak(mlp_family(), "sgd") > 0
        True
    """
    model = family.model
    opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
    dtype = AUTOCAST_DTYPES[precision]

    def step() -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            loss = model_loss(call_model(model, family.batch), family.targets, family.loss_fn)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    leaves = torch.utils._pytree.tree_leaves((family.batch, family.targets))
    with checkpointed(model, family.checkpointing if checkpointing else None):
        step()  # the optimizer creates its state: measure the steady state
        return measure_peak_memory(
            step,
            model,
            opt,
            [*model.buffers(), *(t for t in leaves if isinstance(t, torch.Tensor))],
        )


def compare(family: Family, optimizer: str, precision: str, checkpointing: bool) -> dict[str, Any]:
    """One row of the table: the estimate, the measured peak, their error and Accelerate's figure.

    Example:
        >>> from trainopt.perf.bench.estimates import compare, mlp_family
        >>> row = compare(mlp_family(), "sgd", "fp32", checkpointing=True)
        >>> abs(row["error"]) < 0.05, row["peak_phase"]
        (True, 'backward')
    """
    estimate = estimate_step_memory(
        family.model,
        family.batch,
        targets=family.targets,
        loss_fn=family.loss_fn,
        optimizer=optimizer,
        precision=precision,
        checkpointing=family.checkpointing if checkpointing else None,
    )
    measured = measure_step_peak(family, optimizer, precision, checkpointing)
    accelerate = accelerate_estimate(family.model, precision)
    return {
        "family": family.name,
        "parameters": sum(p.numel() for p in family.model.parameters()),
        "precision": precision,
        "optimizer": optimizer,
        "checkpointing": checkpointing,
        "estimate_bytes": estimate.peak,
        "measured_bytes": measured,
        "error": estimate.peak / measured - 1,
        "peak_phase": estimate.peak_phase,
        "accelerate_bytes": accelerate,
        "accelerate_error": accelerate / measured - 1,
    }


def run(
    families: Sequence[str] | None = None,
    precisions: Sequence[str] = ("fp32", "bf16"),
    optimizers: Sequence[str] = ("adamw", "sgd"),
    checkpointing: Sequence[bool] = (False, True),
    command: str | None = None,
    note: str | None = None,
) -> Results:
    """Every combination for each family: a results file of kind ``"estimate"``.

    Example:
        >>> from trainopt.perf.bench.estimates import run
        >>> results = run(["mlp"], precisions=["bf16"], optimizers=["adamw"], checkpointing=[False])
        >>> results["kind"], len(results["rows"]), abs(results["rows"][0]["error"]) < 0.05
        ('estimate', 1, True)
    """
    names = list(families) if families is not None else available_families()
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"families must be among {list(FAMILIES)}, got {unknown}")
    results = new_results(
        "estimate",
        "cpu",
        command,
        note,
        families=names,
        precisions=list(precisions),
        optimizers=list(optimizers),
        checkpointing=list(checkpointing),
    )
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # the peak does not depend on threads; one keeps a shared machine usable
    started = time.perf_counter()
    try:
        for name in names:
            family = FAMILIES[name]()
            rows += [
                compare(family, opt, precision, ckpt)
                for precision in precisions
                for opt in optimizers
                for ckpt in checkpointing
            ]
    finally:
        torch.set_num_threads(threads)
    results["rows"] = rows
    results["seconds"] = time.perf_counter() - started
    return results
