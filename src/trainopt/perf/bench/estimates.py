"""The memory estimate of any model against the peak measured on a CPU, for 13 model families.

``python -m trainopt.perf.bench estimate --out docs/_data/memory_estimate_cpu.json`` builds
each family of :data:`FAMILIES` (an MLP, a ResNet-style CNN, ``nn.TransformerEncoder``, the
project's GPT, where ``transformers`` is installed a Hugging Face GPT-2 built from its config;
recurrent models: a GRU language model, a stacked BiLSTM, a BiLSTM tagger and a BiGRU
classifier on packed sequences; a U-Net, a tied-weight transformer language model, an
``nn.EmbeddingBag`` classifier and a hash-routed mixture of experts) and, for each precision,
optimizer and with or without activation checkpointing:

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
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from trainopt.models import GPT, Block, gpt_config
from trainopt.perf.bench.results import Results, new_results
from trainopt.perf.peak import LiveStorageTracker, training_state
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


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every position: ``logits`` (…, classes) against ``targets`` (…).

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import token_cross_entropy
        >>> round(float(token_cross_entropy(torch.zeros(2, 3, 4), torch.ones(2, 3).long())), 4)
        1.3863
    """
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def masked_cross_entropy(logits: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the positions whose tag is not 0 (padding), selected by a boolean mask.

    The number of positions kept depends on the tags' values: the estimate reads them.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import masked_cross_entropy
        >>> tags = torch.tensor([[2, 1, 0]])
        >>> round(float(masked_cross_entropy(torch.zeros(1, 3, 4), tags)), 4)
        1.3863
    """
    keep = tags != 0
    return F.cross_entropy(logits[keep], tags[keep])


def _padded_batch(vocab: int, batch_size: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids padded with 0 after random lengths in [2, seq_len] (the longest has seq_len)."""
    lengths = torch.randint(2, seq_len + 1, (batch_size,))
    lengths[0] = seq_len
    ids = torch.randint(1, vocab, (batch_size, seq_len))
    return ids * (torch.arange(seq_len) < lengths[:, None]), lengths


class RecurrentLanguageModel(nn.Module):
    """Token embeddings, a multi-layer GRU or LSTM and a head over the vocabulary.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import RecurrentLanguageModel
        >>> RecurrentLanguageModel(100, 16)(torch.randint(0, 100, (2, 5))).shape
        torch.Size([2, 5, 100])
    """

    def __init__(
        self, vocab: int, width: int, layers: int = 2, cell: type[nn.RNNBase] = nn.GRU
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.rnn = cell(width, width, layers, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embedding(ids))[0])


def gru_lm_family(
    vocab: int = 256, width: int = 64, batch_size: int = 8, seq_len: int = 6
) -> Family:
    """A two-layer GRU language model; checkpointing: the GRU.

    Example:
        >>> from trainopt.perf.bench.estimates import gru_lm_family
        >>> family = gru_lm_family()
        >>> family.model(family.batch).shape
        torch.Size([8, 6, 256])
    """
    torch.manual_seed(0)
    model = RecurrentLanguageModel(vocab, width)
    ids = torch.randint(0, vocab, (batch_size, seq_len + 1))
    return Family("GRU language model", model, ids[:, :-1], ids[:, 1:], token_cross_entropy, nn.GRU)


class SequenceClassifier(nn.Module):
    """A stacked bidirectional LSTM over time-major sequences (dropout between layers),
    classified at the last step.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import SequenceClassifier
        >>> SequenceClassifier(8, 16, 3, classes=5)(torch.randn(7, 2, 8)).shape
        torch.Size([2, 5])
    """

    def __init__(self, features: int, width: int, layers: int, classes: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(features, width, layers, dropout=0.1, bidirectional=True)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][-1])


def lstm_family(
    features: int = 16, width: int = 64, batch_size: int = 8, seq_len: int = 16
) -> Family:
    """A three-layer BiLSTM sequence classifier (oneDNN's RNN kernel on a CPU, whose workspace
    is most of the step); checkpointing: the LSTM.

    Example:
        >>> from trainopt.perf.bench.estimates import lstm_family
        >>> family = lstm_family()
        >>> family.model(family.batch).shape
        torch.Size([8, 5])
    """
    torch.manual_seed(0)
    model = SequenceClassifier(features, width, 3, classes=5)
    x = torch.randn(seq_len, batch_size, features)
    return Family(
        "3-layer BiLSTM", model, x, torch.randint(0, 5, (batch_size,)), F.cross_entropy, nn.LSTM
    )


class PackedTagger(nn.Module):
    """Token embeddings, a bidirectional multi-layer RNN over packed sequences, a tag per token.

    ``forward(ids, lengths)`` packs the padded ``ids`` by their ``lengths`` (in any order), so
    the RNN never reads the padding; the output is padded back to the length of ``ids``.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import PackedTagger
        >>> tagger = PackedTagger(100, 16, tags=10)
        >>> tagger(torch.randint(1, 100, (3, 6)), torch.tensor([6, 2, 4])).shape
        torch.Size([3, 6, 10])
    """

    def __init__(
        self, vocab: int, width: int, tags: int, layers: int = 2, cell: type[nn.RNNBase] = nn.LSTM
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width, padding_idx=0)
        self.rnn = cell(width, width, layers, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * width, tags)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(
            self.embedding(ids), lengths, batch_first=True, enforce_sorted=False
        )
        out, _ = pad_packed_sequence(
            self.rnn(packed)[0], batch_first=True, total_length=ids.shape[1]
        )
        return self.head(out)


def bilstm_tagger_family(
    vocab: int = 128, width: int = 32, batch_size: int = 4, seq_len: int = 6
) -> Family:
    """A two-layer BiLSTM tagger on packed sequences, its loss over the tokens that aren't
    padding (a boolean mask); checkpointing: the LSTM.

    Example:
        >>> from trainopt.perf.bench.estimates import bilstm_tagger_family
        >>> family = bilstm_tagger_family()
        >>> family.model(*family.batch).shape
        torch.Size([4, 6, 10])
    """
    torch.manual_seed(0)
    model = PackedTagger(vocab, width, tags=10)
    ids, lengths = _padded_batch(vocab, batch_size, seq_len)
    tags = torch.randint(1, 10, ids.shape) * (ids != 0)
    return Family(
        "BiLSTM tagger (packed)", model, (ids, lengths), tags, masked_cross_entropy, nn.LSTM
    )


class PackedClassifier(nn.Module):
    """Token embeddings, a bidirectional multi-layer GRU over packed sequences, and a class from
    the last layer's final states (both directions).

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import PackedClassifier
        >>> model = PackedClassifier(100, 16, classes=4)
        >>> model(torch.randint(1, 100, (3, 6)), torch.tensor([6, 2, 4])).shape
        torch.Size([3, 4])
    """

    def __init__(self, vocab: int, width: int, classes: int, layers: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width, padding_idx=0)
        self.rnn = nn.GRU(width, width, layers, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(
            self.embedding(ids), lengths, batch_first=True, enforce_sorted=False
        )
        final = self.rnn(packed)[1]  # (layers · 2, batch, width)
        return self.head(torch.cat([final[-2], final[-1]], dim=1))


def bigru_family(
    vocab: int = 128, width: int = 32, batch_size: int = 4, seq_len: int = 6
) -> Family:
    """A two-layer BiGRU classifier on packed sequences; checkpointing: the GRU.

    Example:
        >>> from trainopt.perf.bench.estimates import bigru_family
        >>> family = bigru_family()
        >>> family.model(*family.batch).shape
        torch.Size([4, 4])
    """
    torch.manual_seed(0)
    model = PackedClassifier(vocab, width, classes=4)
    batch = _padded_batch(vocab, batch_size, seq_len)
    return Family(
        "BiGRU classifier (packed)",
        model,
        batch,
        torch.randint(0, 4, (batch_size,)),
        F.cross_entropy,
        nn.GRU,
    )


class DoubleConv(nn.Sequential):
    """Two 3×3 convolutions, each with batch norm and ReLU: a level of a U-Net.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import DoubleConv
        >>> DoubleConv(3, 8)(torch.randn(2, 3, 16, 16)).shape
        torch.Size([2, 8, 16, 16])
    """

    def __init__(self, channels_in: int, channels_out: int) -> None:
        super().__init__(
            nn.Conv2d(channels_in, channels_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels_out),
            nn.ReLU(),
            nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels_out),
            nn.ReLU(),
        )


class UNet(nn.Module):
    """A two-level U-Net: max-pooled down, transposed convolutions up, skip connections by
    concatenation, a class per pixel.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import UNet
        >>> UNet(8, classes=3)(torch.randn(2, 3, 16, 16)).shape
        torch.Size([2, 3, 16, 16])
    """

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        c = channels
        self.down1, self.down2, self.bottom = (
            DoubleConv(3, c),
            DoubleConv(c, 2 * c),
            DoubleConv(2 * c, 4 * c),
        )
        self.up2, self.decode2 = (
            nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2),
            DoubleConv(4 * c, 2 * c),
        )
        self.up1, self.decode1 = nn.ConvTranspose2d(2 * c, c, 2, stride=2), DoubleConv(2 * c, c)
        self.out = nn.Conv2d(c, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(F.max_pool2d(d1, 2))
        bottom = self.bottom(F.max_pool2d(d2, 2))
        u2 = self.decode2(torch.cat([self.up2(bottom), d2], dim=1))
        return self.out(self.decode1(torch.cat([self.up1(u2), d1], dim=1)))


def unet_family(channels: int = 8, batch_size: int = 4, image: int = 32) -> Family:
    """A U-Net segmenting ``image``-pixel images into 4 classes; checkpointing: its levels.

    Example:
        >>> from trainopt.perf.bench.estimates import unet_family
        >>> family = unet_family()
        >>> family.model(family.batch).shape
        torch.Size([4, 4, 32, 32])
    """
    torch.manual_seed(0)
    model = UNet(channels, classes=4)
    return Family(
        "U-Net",
        model,
        torch.randn(batch_size, 3, image, image),
        torch.randint(0, 4, (batch_size, image, image)),
        F.cross_entropy,
        DoubleConv,
    )


class TiedLanguageModel(nn.Module):
    """A causal ``nn.TransformerEncoder`` language model whose head is its token embedding (tied
    weights: one parameter, two uses).

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import TiedLanguageModel
        >>> model = TiedLanguageModel(100, 16, seq_len=8)
        >>> model.head.weight is model.embedding.weight, model(torch.randint(0, 100, (2, 8))).shape
        (True, torch.Size([2, 8, 100]))
    """

    def __init__(self, vocab: int, width: int, seq_len: int, layers: int = 2) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.position = nn.Embedding(seq_len, width)
        layer = nn.TransformerEncoderLayer(
            width,
            nhead=4,
            dim_feedforward=4 * width,
            dropout=0.1,
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        steps = ids.shape[1]
        x = self.embedding(ids) + self.position(torch.arange(steps, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(steps, device=ids.device)
        return self.head(self.encoder(x, mask=mask, is_causal=True))


def tied_lm_family(
    vocab: int = 512, width: int = 64, batch_size: int = 8, seq_len: int = 16
) -> Family:
    """A tied-weight transformer language model; checkpointing: its layers.

    Example:
        >>> from trainopt.perf.bench.estimates import tied_lm_family
        >>> family = tied_lm_family()
        >>> family.model(family.batch).shape
        torch.Size([8, 16, 512])
    """
    torch.manual_seed(0)
    model = TiedLanguageModel(vocab, width, seq_len)
    ids = torch.randint(0, vocab, (batch_size, seq_len + 1))
    return Family(
        "Tied-weight transformer LM",
        model,
        ids[:, :-1],
        ids[:, 1:],
        token_cross_entropy,
        nn.TransformerEncoderLayer,
    )


class BagOfEmbeddings(nn.Module):
    """``nn.EmbeddingBag`` (the mean of each text's token embeddings) and an MLP classifier.

    ``forward(ids, offsets)`` takes the texts' ids end to end and where each text starts.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import BagOfEmbeddings
        >>> BagOfEmbeddings(100, 16, 3)(torch.tensor([1, 2, 3, 4, 5]), torch.tensor([0, 2])).shape
        torch.Size([2, 3])
    """

    def __init__(self, vocab: int, width: int, classes: int) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(vocab, width, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, classes))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.bag(ids, offsets))


def embedding_bag_family(vocab: int = 4096, width: int = 64, batch_size: int = 32) -> Family:
    """A bag-of-embeddings text classifier over texts of 4 to 32 tokens; checkpointing: the MLP.

    Example:
        >>> from trainopt.perf.bench.estimates import embedding_bag_family
        >>> family = embedding_bag_family()
        >>> family.model(*family.batch).shape
        torch.Size([32, 5])
    """
    torch.manual_seed(0)
    model = BagOfEmbeddings(vocab, width, classes=5)
    lengths = torch.randint(4, 33, (batch_size,))
    offsets = torch.cumsum(lengths, 0) - lengths
    ids = torch.randint(0, vocab, (int(lengths.sum()),))
    return Family(
        "EmbeddingBag classifier",
        model,
        (ids, offsets),
        torch.randint(0, 5, (batch_size,)),
        F.cross_entropy,
        [model.mlp],
    )


class HashRoutedMixture(nn.Module):
    """A mixture of expert MLPs, each token sent to one expert by its id (hash routing), with a
    residual connection and a head over the vocabulary.

    Which tokens an expert gets is a boolean mask of the ids: data-dependent shapes, which the
    estimate reads from the ids. Hash routing is S. Roller et al., "Hash Layers For Large Sparse
    Models", NeurIPS 2021, arXiv:2106.04426.

    Example:
        >>> import torch
        >>> from trainopt.perf.bench.estimates import HashRoutedMixture
        >>> HashRoutedMixture(100, 16, experts=3)(torch.randint(0, 100, (2, 5))).shape
        torch.Size([2, 5, 100])
    """

    def __init__(self, vocab: int, width: int, experts: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
            for _ in range(experts)
        )
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids)
        mixed = torch.zeros_like(x)
        route = ids % len(self.experts)
        for index, expert in enumerate(self.experts):
            chosen = route == index
            mixed[chosen] = expert(x[chosen]).to(mixed.dtype)  # autocast: a bf16 output
        return self.head(x + mixed)


def hash_moe_family(
    vocab: int = 256, width: int = 64, batch_size: int = 8, seq_len: int = 16
) -> Family:
    """A hash-routed mixture of 4 experts as a language model; checkpointing: the experts.

    Example:
        >>> from trainopt.perf.bench.estimates import hash_moe_family
        >>> family = hash_moe_family()
        >>> family.model(family.batch).shape
        torch.Size([8, 16, 256])
    """
    torch.manual_seed(0)
    model = HashRoutedMixture(vocab, width, experts=4)
    ids = torch.randint(0, vocab, (batch_size, seq_len + 1))
    return Family(
        "Hash-routed mixture of experts",
        model,
        ids[:, :-1],
        ids[:, 1:],
        token_cross_entropy,
        list(model.experts),
    )


FAMILIES: dict[str, Callable[[], Family]] = {
    "mlp": mlp_family,
    "cnn": cnn_family,
    "encoder": encoder_family,
    "gpt": gpt_family,
    "hf-gpt2": hf_gpt2_family,
    "gru-lm": gru_lm_family,
    "lstm": lstm_family,
    "bilstm-tagger": bilstm_tagger_family,
    "bigru": bigru_family,
    "unet": unet_family,
    "tied-lm": tied_lm_family,
    "embedding-bag": embedding_bag_family,
    "hash-moe": hash_moe_family,
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
    family: Family,
    optimizer: str = "adamw",
    precision: str = "fp32",
    checkpointing: bool = False,
    keep_outputs: bool = False,
) -> int:
    """Peak bytes of a real steady-state training step of ``family`` on the CPU.

    The step is the one :func:`~trainopt.perf.traced_estimate.estimate_step_memory` traces,
    with ``keep_outputs`` as there (the model's output and the loss live until the next step
    replaces them, as in ``out = model(x); loss = loss_fn(out, y); loss.backward()``); weights,
    buffers, optimizer state and the batch count as they do on a GPU.

    Example:
        >>> from trainopt.perf.bench.estimates import measure_step_peak, mlp_family
        >>> family = mlp_family(batch_size=256)
        >>> held = measure_step_peak(family, "sgd", keep_outputs=True)
        >>> held - measure_step_peak(family, "sgd")  # the 256 x 10 fp32 logits, alive in backward
        10240
    """
    model = family.model
    opt = make_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
    dtype = AUTOCAST_DTYPES[precision]
    held: dict[str, Any] = {}

    def step() -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            output = call_model(model, family.batch)
            if keep_outputs:
                held["output"] = output  # the last step's output is freed only now
            loss = model_loss(output, family.targets, family.loss_fn)
            if keep_outputs:
                held["loss"] = loss
            del output
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    leaves = torch.utils._pytree.tree_leaves((family.batch, family.targets))
    with checkpointed(model, family.checkpointing if checkpointing else None):
        step()  # the optimizer creates its state: measure the steady state
        tracker = LiveStorageTracker("cpu")
        tracker.count(training_state(model, opt))
        tracker.count([*model.buffers(), *(t for t in leaves if isinstance(t, torch.Tensor))])
        tracker.count(
            t for t in torch.utils._pytree.tree_leaves(held) if isinstance(t, torch.Tensor)
        )
        del leaves
        with tracker:
            step()
        return tracker.peak


def compare(
    family: Family,
    optimizer: str,
    precision: str,
    checkpointing: bool,
    keep_outputs: bool = False,
) -> dict[str, Any]:
    """One row of the table: the estimate, the measured peak, their error and Accelerate's figure.

    ``keep_outputs`` goes to both the estimate and the measured step.

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
        keep_outputs=keep_outputs,
    )
    measured = measure_step_peak(family, optimizer, precision, checkpointing, keep_outputs)
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
