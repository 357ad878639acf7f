"""A transformer's shape: what the layout planner needs to count its parameters and FLOPs.

:class:`ModelShape` is the handful of numbers a model card gives (layers, width, heads and
key-value heads, feed-forward width, vocabulary, sequence length). :meth:`ModelShape.from_module`
reads them off any transformer built as ``nn.Module``, on the ``meta`` device included: the
parameters of one block and of the rest are counted exactly, and the widths are read from the
block's ``nn.Linear`` layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn

from trainopt.validation import check_int


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only transformer.

    Args:
        layers: Transformer blocks.
        hidden: Width of the residual stream.
        heads: Attention (query) heads.
        ffn_hidden: Width of the feed-forward layer.
        vocab: Vocabulary size.
        seq_len: Tokens per sequence in training.
        kv_heads: Key-value heads (grouped-query attention); default ``heads``.
        gated_mlp: A SwiGLU-style feed-forward block (three matrices, as Llama) instead of two.
        tied_embeddings: The output layer shares the token embedding's weights (GPT-2).
        position_embeddings: Rows of a learned position embedding (GPT-2); 0 for rotary.
        layer_parameters: Parameters of one block, when counted from a module (default: the
            weights of the matrices and norms).
        other_parameters: Parameters outside the blocks, when counted from a module.

    Example:
        >>> from trainopt.perf.planner import ModelShape
        >>> llama8b = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8,
        ...                      ffn_hidden=14336, vocab=128256, seq_len=8192, gated_mlp=True)
        >>> round(llama8b.parameters() / 1e9, 2)  # Llama 3 8B
        8.03
    """

    layers: int
    hidden: int
    heads: int
    ffn_hidden: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None
    gated_mlp: bool = False
    tied_embeddings: bool = False
    position_embeddings: int = 0
    layer_parameters: int | None = None
    other_parameters: int | None = None

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "ffn_hidden", "vocab", "seq_len"):
            check_int(field, getattr(self, field), 1, owner="ModelShape")
        check_int("kv_heads", self.kv_heads, 1, none_ok=True, owner="ModelShape")
        check_int("position_embeddings", self.position_embeddings, 0, owner="ModelShape")
        if self.hidden % self.heads:
            raise ValueError(
                f"ModelShape.hidden must be divisible by heads, got hidden={self.hidden}, "
                f"heads={self.heads}"
            )
        if self.heads % self.kv_width_heads:
            raise ValueError(
                f"ModelShape.heads must be a multiple of kv_heads, got heads={self.heads}, "
                f"kv_heads={self.kv_heads}"
            )

    @property
    def kv_width_heads(self) -> int:
        """Key-value heads (``kv_heads``, or ``heads`` when not given)."""
        return self.kv_heads or self.heads

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values): key-value heads × head width."""
        return self.kv_width_heads * (self.hidden // self.heads)

    def block_parameters(self) -> int:
        """Parameters of one block: attention, feed-forward and two norms."""
        if self.layer_parameters is not None:
            return self.layer_parameters
        h, f = self.hidden, self.ffn_hidden
        attention = h * (h + 2 * self.kv_width) + h * h
        mlp = (3 if self.gated_mlp else 2) * h * f
        return attention + mlp + 2 * h

    def outer_parameters(self) -> int:
        """Parameters outside the blocks: embeddings, final norm and output layer."""
        if self.other_parameters is not None:
            return self.other_parameters
        h = self.hidden
        head = 0 if self.tied_embeddings else self.vocab * h
        return self.vocab * h + self.position_embeddings * h + h + head

    def parameters(self) -> int:
        """All parameters (a tied embedding counted once)."""
        return self.layers * self.block_parameters() + self.outer_parameters()

    def matmul_parameters(self) -> int:
        """The ``N`` of the ``6·N`` FLOPs rule: every weight that takes part in a matmul.

        The position embedding is a lookup; so is an untied input embedding, whose matmul
        twin is the output layer. A tied embedding counts once, for its work in the head
        (:meth:`trainopt.models.GPT.flops_per_token`).
        """
        lookups = self.position_embeddings * self.hidden
        if not self.tied_embeddings:
            lookups += self.vocab * self.hidden
        return self.parameters() - lookups

    def flops_per_token(self) -> float:
        """Training FLOPs per token, ``6·N + 12·L·d·T``: the definition MFU uses
        (:mod:`trainopt.perf.bench.mfu`)."""
        return 6 * self.matmul_parameters() + 12 * self.layers * self.hidden * self.seq_len

    def with_seq_len(self, seq_len: int) -> ModelShape:
        """The same model at another sequence length."""
        return replace(self, seq_len=seq_len)

    @classmethod
    def from_module(
        cls,
        model: nn.Module,
        seq_len: int,
        heads: int,
        kv_heads: int | None = None,
        blocks: nn.ModuleList | None = None,
    ) -> ModelShape:
        """The shape of a transformer ``model`` (any device, ``meta`` included).

        The blocks are ``blocks`` or the longest ``nn.ModuleList`` in the model. Parameters are
        counted from the module (one block, and everything else); the width is the token
        embedding's, the vocabulary its rows, the feed-forward width the widest ``nn.Linear``
        output in a block, and a block with two linears of that width is gated (SwiGLU).

        Example:
            >>> import torch
            >>> from trainopt.models import GPT, gpt_config
            >>> from trainopt.perf.planner import ModelShape
            >>> with torch.device("meta"):
            ...     model = GPT(gpt_config("small"))
            >>> shape = ModelShape.from_module(model, seq_len=256, heads=4)
            >>> shape.parameters() == sum(p.numel() for p in model.parameters())
            True
            >>> shape.flops_per_token() == model.flops_per_token(256)
            True
        """
        if blocks is None:
            lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
            if not lists:
                raise ValueError(
                    f"from_module: {type(model).__name__} has no nn.ModuleList of blocks; "
                    "pass blocks="
                )
            blocks = max(lists, key=len)
        embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
        if not embeddings:
            raise ValueError(f"from_module: {type(model).__name__} has no nn.Embedding")
        token = max(embeddings, key=lambda m: m.num_embeddings)
        block_ids = {id(p) for p in blocks.parameters()}
        per_block = sum(p.numel() for p in blocks[0].parameters())
        other = sum(p.numel() for p in model.parameters() if id(p) not in block_ids)
        linears = [m for m in blocks[0].modules() if isinstance(m, nn.Linear)]
        ffn = max(m.out_features for m in linears)
        positions = sum(m.num_embeddings for m in embeddings if m is not token)
        heads_out = [m for m in model.modules() if isinstance(m, nn.Linear) and m not in linears]
        tied = any(m.weight is token.weight for m in heads_out)
        return cls(
            layers=len(blocks),
            hidden=token.embedding_dim,
            heads=heads,
            kv_heads=kv_heads,
            ffn_hidden=ffn,
            vocab=token.num_embeddings,
            seq_len=seq_len,
            gated_mlp=sum(m.out_features == ffn for m in linears) >= 2,
            tied_embeddings=tied,
            position_embeddings=positions,
            layer_parameters=per_block,
            other_parameters=other,
        )


PRESETS: dict[str, ModelShape] = {
    "gpt2-1b": ModelShape(  # the memory page's 1.01B GPT-2 (36 layers of 1,536)
        layers=36, hidden=1536, heads=16, ffn_hidden=6144, vocab=50304, seq_len=1024,
        tied_embeddings=True, position_embeddings=1024,
    ),
    "llama3-1b": ModelShape(  # Llama 3.2 1B
        layers=16, hidden=2048, heads=32, kv_heads=8, ffn_hidden=8192, vocab=128256,
        seq_len=8192, gated_mlp=True, tied_embeddings=True,
    ),
    "llama3-8b": ModelShape(
        layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
        seq_len=8192, gated_mlp=True,
    ),
    "llama3-70b": ModelShape(
        layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256,
        seq_len=8192, gated_mlp=True,
    ),
    "llama3-405b": ModelShape(
        layers=126, hidden=16384, heads=128, kv_heads=8, ffn_hidden=53248, vocab=128256,
        seq_len=8192, gated_mlp=True,
    ),
}  # fmt: skip
"""Named shapes: the Llama 3 family (Llama 3 paper, table 3; Llama 3.2 1B's model card)."""
