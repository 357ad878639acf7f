"""The small real tasks every page's examples train on, defined once.

- :func:`digits_data` / :func:`digits_loaders` / :func:`digits_mlp`: scikit-learn's bundled 8×8
  handwritten digits (1,797 images, 10 classes, shipped with scikit-learn: no download) and an
  MLP that learns them in seconds on a CPU.
- :class:`GPT`: a GPT-2 style decoder (pre-norm, ``scaled_dot_product_attention``, tied
  embeddings), sized by :class:`GPTConfig`: :func:`gpt_config` gives ``"tiny"`` for CPU examples
  and ``"124m"`` / ``"350m"`` for GPU benchmarks. It reports its own FLOPs per token, as nanoGPT
  does, so throughput can be turned into MFU.
- :func:`synthetic_batch`: random token batches (benchmarks measure speed, not learning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainopt.validation import check_int

__all__ = [
    "GPT",
    "GPT_PRESETS",
    "MLP",
    "Block",
    "CausalSelfAttention",
    "GPTConfig",
    "digits_data",
    "digits_loaders",
    "digits_pixels",
    "digits_mlp",
    "evaluate",
    "gpt_config",
    "synthetic_batch",
]

# --- Digits: a real classification task, shipped in trainopt.data ---------------------------


def digits_data(
    dtype: torch.dtype = torch.float32, val_fraction: float = 0.2, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Load scikit-learn's bundled digits as standardised tensors, split into train and validation.

    Args:
        dtype: Floating dtype of the features.
        val_fraction: Fraction of the 1,797 samples held out for validation.
        seed: Seed of the shuffle before the split.

    Returns:
        ``(x_train, y_train, x_val, y_val)``; features are standardised with the training
        split's mean and standard deviation.

    Example:
        >>> from trainopt.models import digits_data
        >>> x_train, y_train, x_val, y_val = digits_data()
        >>> x_train.shape, x_val.shape, int(y_train.max()) + 1
        (torch.Size([1438, 64]), torch.Size([359, 64]), 10)
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction=}")
    raw, target = digits_pixels()
    x, y = raw.to(torch.float64), target.long()
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_val = int(round(len(x) * val_fraction))
    x_train, y_train, x_val, y_val = x[n_val:], y[n_val:], x[:n_val], y[:n_val]
    mean, std = x_train.mean(0), x_train.std(0)
    # A pixel that is constant in the training split is only centred: dividing by a clamped
    # std of 1e-6 turned a validation sample's 1 into 1e6 and dominated the validation loss.
    std = torch.where(std > 1e-6, std, torch.ones_like(std))
    return ((x_train - mean) / std).to(dtype), y_train, ((x_val - mean) / std).to(dtype), y_val


def digits_pixels() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 hand-written digits as shipped (``trainopt.data``'s ``digits.npz``), unshuffled.

    The same samples and order as scikit-learn's ``load_digits()``, with nothing to install.

    Returns:
        ``(pixels, labels)``: ``uint8`` tensors of shape ``(1797, 64)`` (values 0 to 16) and
        ``(1797,)``.

    Example:
        >>> from trainopt.models import digits_pixels
        >>> pixels, labels = digits_pixels()
        >>> pixels.shape, int(pixels.max()), labels[:5].tolist()
        (torch.Size([1797, 64]), 16, [0, 1, 2, 3, 4])
    """
    import numpy as np

    from trainopt.data import path

    with np.load(path("digits.npz"), allow_pickle=False) as data:
        return torch.from_numpy(data["images"].copy()), torch.from_numpy(data["target"].copy())


def digits_loaders(
    batch_size: int = 64, seed: int = 0, val_fraction: float = 0.2
) -> tuple[DataLoader, DataLoader]:
    """Training and validation loaders over :func:`digits_data`.

    The training loader shuffles with its own seeded generator, so two loaders built with the
    same ``seed`` yield the same batches.

    Example:
        >>> from trainopt.models import digits_loaders
        >>> train, val = digits_loaders(batch_size=32)
        >>> xb, yb = next(iter(train))
        >>> xb.shape, yb.shape
        (torch.Size([32, 64]), torch.Size([32]))
    """
    x_train, y_train, x_val, y_val = digits_data(val_fraction=val_fraction, seed=seed)
    train = DataLoader(
        TensorDataset(x_train, y_train),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    val = DataLoader(TensorDataset(x_val, y_val), batch_size=512)
    return train, val


def digits_mlp(
    hidden: int = 128, depth: int = 2, seed: int | None = 0, dropout: float = 0.0
) -> nn.Sequential:
    """An MLP for the 64-pixel digits: ``depth`` hidden layers of width ``hidden`` with GELU.

    With ``dropout > 0`` an ``nn.Dropout(dropout)`` follows each hidden activation, so every
    training step draws random numbers; the default 0 adds none (the same model, bit for bit).

    Example:
        >>> import torch
        >>> from trainopt.models import digits_mlp
        >>> model = digits_mlp()
        >>> model(torch.zeros(5, 64)).shape
        torch.Size([5, 10])
        >>> digits_mlp(dropout=0.1)[2]
        Dropout(p=0.1, inplace=False)
    """
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout=}")
    if seed is not None:
        torch.manual_seed(seed)
    layers: list[nn.Module] = []
    width = 64
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.GELU()] + ([nn.Dropout(dropout)] if dropout else [])
        width = hidden
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, device: str | torch.device = "cpu"
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of a classifier over a loader.

    Example:
        >>> from trainopt.models import digits_loaders
        >>> from trainopt.models import digits_mlp
        >>> from trainopt.models import evaluate
        >>> _, val = digits_loaders()
        >>> loss, acc = evaluate(digits_mlp(), val)
        >>> 0.0 <= acc <= 1.0 and loss > 0
        True
    """
    was_training = model.training
    model.eval()
    total_loss = torch.zeros((), device=device)
    correct = torch.zeros((), device=device)
    count = 0
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        logits = model(xb)
        total_loss += F.cross_entropy(logits, yb, reduction="sum")
        correct += (logits.argmax(-1) == yb).sum()
        count += len(yb)
    model.train(was_training)
    return (total_loss / count).item(), (correct / count).item()


# --- GPT: the reference transformer of the performance pages ---------------------------------


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a :class:`GPT`.

    Attributes:
        vocab_size: Vocabulary size (50,304: GPT-2's 50,257 padded to a multiple of 64).
        block_size: Longest sequence the position embedding covers.
        n_layer: Number of transformer blocks.
        n_head: Attention heads per block.
        n_embd: Width of the residual stream.
        dropout: Dropout probability (0 for benchmarks).
        bias: Whether linear layers and LayerNorms have biases.

    Example:
        >>> from trainopt.models import GPTConfig
        >>> GPTConfig().n_embd // GPTConfig().n_head  # GPT-2 124M: 12 heads of 64
        64
        >>> try:
        ...     GPTConfig(n_embd=100, n_head=3)
        ... except ValueError as error:
        ...     print(error)
        GPTConfig.n_embd must be divisible by n_head, got n_embd=100, n_head=3
    """

    vocab_size: int = 50304
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = False

    def __post_init__(self) -> None:
        for field in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            check_int(field, getattr(self, field), 1, owner="GPTConfig")
        if self.n_embd % self.n_head:
            raise ValueError(
                f"GPTConfig.n_embd must be divisible by n_head, got n_embd={self.n_embd}, "
                f"n_head={self.n_head}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")


GPT_PRESETS: dict[str, dict[str, int]] = {
    "tiny": dict(vocab_size=512, block_size=64, n_layer=2, n_head=4, n_embd=64),
    "small": dict(vocab_size=4096, block_size=256, n_layer=4, n_head=4, n_embd=256),
    "124m": dict(n_layer=12, n_head=12, n_embd=768),
    "350m": dict(n_layer=24, n_head=16, n_embd=1024),
}


def gpt_config(name: str = "tiny", **overrides: object) -> GPTConfig:
    """A :class:`GPTConfig` by preset name (``"tiny"``, ``"small"``, ``"124m"``, ``"350m"``).

    Example:
        >>> from trainopt.models import gpt_config
        >>> gpt_config("124m").n_layer, gpt_config("tiny", block_size=32).block_size
        (12, 32)
    """
    if name not in GPT_PRESETS:
        raise ValueError(f"gpt_config name must be one of {sorted(GPT_PRESETS)}, got {name!r}")
    return GPTConfig(**{**GPT_PRESETS[name], **overrides})


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through ``F.scaled_dot_product_attention``.

    Example:
        >>> import torch
        >>> from trainopt.models import CausalSelfAttention
        >>> from trainopt.models import gpt_config
        >>> attn = CausalSelfAttention(gpt_config("tiny"))
        >>> x = torch.randn(2, 8, 64)
        >>> y = attn(x)
        >>> y.shape
        torch.Size([2, 8, 64])
        >>> x2 = x.clone(); x2[:, 5:] = 0.0  # change only the later positions
        >>> torch.allclose(attn(x2)[:, :5], y[:, :5], atol=1e-6)  # causal: earlier ones unchanged
        True
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (
            t.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v)
        )
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).contiguous().view(batch, seq, width))


class MLP(nn.Module):
    """The transformer's feed-forward block: width × 4, GELU, back to width.

    Example:
        >>> import torch
        >>> from trainopt.models import MLP
        >>> from trainopt.models import gpt_config
        >>> mlp = MLP(gpt_config("tiny"))
        >>> mlp.fc.weight.shape, mlp(torch.randn(2, 8, 64)).shape
        (torch.Size([256, 64]), torch.Size([2, 8, 64]))
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``.

    Example:
        >>> import torch
        >>> from trainopt.models import Block
        >>> from trainopt.models import gpt_config
        >>> block = Block(gpt_config("tiny"))
        >>> x = torch.randn(2, 8, 64)
        >>> block(x).shape
        torch.Size([2, 8, 64])
        >>> for p in (block.attn.proj.weight, block.mlp.proj.weight):
        ...     _ = torch.nn.init.zeros_(p)
        >>> torch.equal(block(x), x)  # zeroed output projections: only the residual path is left
        True
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A GPT-2 style language model.

    ``forward(idx, targets=None)`` returns logits, or the mean cross-entropy loss when targets
    are given (the loss path is what training and benchmarks use).

    Example:
        >>> import math
        >>> import torch
        >>> from trainopt.models import GPT
        >>> from trainopt.models import gpt_config
        >>> model = GPT(gpt_config("tiny"))
        >>> idx = torch.randint(0, 512, (2, 16))
        >>> model(idx).shape
        torch.Size([2, 16, 512])
        >>> loss = model(idx, targets=torch.randint(0, 512, (2, 16)))
        >>> loss.ndim, bool(abs(loss.item() - math.log(512)) < 0.5)  # ~uniform at init
        (0, True)
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as GPT-2
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):  # scaled init of residual projections (GPT-2)
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        seq = idx.shape[1]
        if seq > self.config.block_size:
            raise ValueError(f"sequence length {seq} exceeds block_size={self.config.block_size}")
        pos = torch.arange(seq, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Parameter count; ``non_embedding=True`` leaves out the position embedding.

        The token embedding is tied to the output layer, so it counts once (it does real
        matmul work in the head). This is the ``N`` of the ``6·N`` FLOPs rule.
        """
        n = sum(p.numel() for p in self.parameters())
        return n - self.wpe.weight.numel() if non_embedding else n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: ``6·N + 12·L·d·T`` (PaLM appendix B; nanoGPT's MFU).

        ``6·N`` counts the forward and backward matmuls of the weights, ``12·L·d·T`` those of
        attention scores and values at sequence length ``T``.
        """
        c = self.config
        return 6 * self.num_parameters(non_embedding=True) + 12 * c.n_layer * c.n_embd * seq_len


def synthetic_batch(
    config: GPTConfig,
    batch_size: int,
    seq_len: int | None = None,
    device: str | torch.device = "cpu",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``(inputs, targets)`` token batches of shape ``(batch_size, seq_len)``.

    Example:
        >>> from trainopt.models import gpt_config
        >>> from trainopt.models import synthetic_batch
        >>> x, y = synthetic_batch(gpt_config("tiny"), batch_size=4, seq_len=8)
        >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())
        (torch.Size([4, 8]), True)
    """
    seq_len = seq_len or config.block_size
    tokens = torch.randint(0, config.vocab_size, (batch_size, seq_len + 1), generator=generator)
    tokens = tokens.to(device)  # clone: at batch 1 .contiguous() returns views of one storage
    return tokens[:, :-1].clone(), tokens[:, 1:].clone()
