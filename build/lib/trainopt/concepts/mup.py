"""μP (maximal update parametrization) for the project's GPT.

μP (Yang et al. 2022, "Tensor Programs V", arXiv:2203.03466) scales the initialisation, the
learning rates and two forward multipliers with the width multiplier ``m = width / base_width``,
so that every layer's update moves its activations by the same amount at every width, and the
best learning rate found at the base width stays the best at larger widths. For Adam:

- hidden (matrix-like) weights, whose two dimensions both grow with width: learning rate ``lr / m``,
  initial standard deviation ``1 / sqrt(m)`` times the base one;
- embeddings, LayerNorm gains and biases (vector-like: one dimension grows): base learning rate
  and initialisation;
- the readout (tied to the token embedding here): logits multiplied by ``1 / m``;
- attention logits scaled by ``1 / d_head`` instead of ``1 / sqrt(d_head)`` (written
  ``sqrt(d0) / d_head`` with ``d0`` the base head width, so the base model is unchanged).

At ``m = 1`` the μP model *is* the standard one: a sweep at the base width serves both.

:func:`mup_gpt` makes the model changes and :func:`mup_param_groups` builds the optimizer's
groups. The concepts page's width sweep, which shows the best learning rate staying put, is the
site's (``python -m trainopt_site.concepts.mup_sweep``), not the library's.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainopt.models import GPT, CausalSelfAttention, GPTConfig

__all__ = ["MuAttention", "MuReadout", "mup_gpt", "mup_param_groups"]


class MuAttention(CausalSelfAttention):
    """Causal self-attention whose logits are scaled by ``scale`` (μP: ``sqrt(d0) / d_head``).

    Example:
        >>> import torch
        >>> from trainopt.concepts.mup import MuAttention
        >>> from trainopt.models import CausalSelfAttention, gpt_config
        >>> config = gpt_config("tiny")
        >>> torch.manual_seed(0); plain = CausalSelfAttention(config)  # doctest: +ELLIPSIS
        <...>
        >>> mu = MuAttention(config, scale=1 / (64 // 4) ** 0.5)
        >>> mu.load_state_dict(plain.state_dict())
        <All keys matched successfully>
        >>> x = torch.randn(2, 8, 64)
        >>> torch.allclose(mu(x), plain(x), atol=1e-6)  # 1/sqrt(d_head): the standard attention
        True
    """

    def __init__(self, config: GPTConfig, scale: float) -> None:
        super().__init__(config)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        q, k, v = (
            t.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v)
        )
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0,
        )
        return self.proj(y.transpose(1, 2).contiguous().view(batch, seq, width))


class MuReadout(nn.Module):
    """The output layer ``multiplier · x Wᵀ`` on a weight it shares (the tied token embedding).

    Example:
        >>> import torch
        >>> from trainopt.concepts.mup import MuReadout
        >>> weight = torch.nn.Parameter(torch.ones(3, 4))
        >>> MuReadout(weight, multiplier=0.5)(torch.ones(1, 4))
        tensor([[2., 2., 2.]], grad_fn=<MulBackward0>)
    """

    def __init__(self, weight: nn.Parameter, multiplier: float) -> None:
        super().__init__()
        self.weight = weight
        self.multiplier = multiplier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) * self.multiplier


def _is_hidden(name: str, param: torch.Tensor) -> bool:
    """Matrix-like: both dimensions grow with width (every 2-D weight but the embeddings)."""
    return param.ndim == 2 and not name.startswith(("wte.", "wpe."))


def mup_gpt(config: GPTConfig, base_width: int) -> GPT:
    """A :class:`~trainopt.models.GPT` in μP relative to ``base_width``
    (``m = n_embd / base_width``).

    Hidden weights start at ``1 / sqrt(m)`` times GPT's standard deviations, attention uses
    :class:`MuAttention` with scale ``sqrt(d0) / d_head`` (``d0`` the head width at
    ``base_width``), and the tied readout is a :class:`MuReadout` with multiplier ``1 / m``.
    Train it with :func:`mup_param_groups`. Draws from torch's global generator, as ``GPT`` does.

    Example:
        >>> import torch
        >>> from trainopt.concepts.mup import mup_gpt
        >>> from trainopt.models import GPT, gpt_config
        >>> idx = torch.randint(0, 512, (2, 16))
        >>> _ = torch.manual_seed(0); standard = GPT(gpt_config("tiny"))
        >>> _ = torch.manual_seed(0); mu = mup_gpt(gpt_config("tiny"), base_width=64)
        >>> torch.allclose(mu(idx), standard(idx), atol=1e-5)  # at the base width, μP is SP
        True
        >>> wide = mup_gpt(gpt_config("tiny", n_embd=256), base_width=64)
        >>> round(wide.blocks[0].mlp.fc.weight.std().item() / 0.02, 1), wide.lm_head.multiplier
        (0.5, 0.25)
    """
    if base_width <= 0 or base_width % config.n_head:
        raise ValueError(
            f"base_width must be a positive multiple of n_head={config.n_head}, got {base_width}"
        )
    model = GPT(config)
    m = config.n_embd / base_width
    d_head, d0 = config.n_embd // config.n_head, base_width // config.n_head
    with torch.no_grad():
        for name, param in model.named_parameters():
            if _is_hidden(name, param):
                param.mul_(m**-0.5)
    for block in model.blocks:
        attn = MuAttention(config, scale=math.sqrt(d0) / d_head)
        attn.load_state_dict(block.attn.state_dict())
        block.attn = attn
    model.lm_head = MuReadout(model.wte.weight, multiplier=1.0 / m)
    return model


def mup_param_groups(
    model: nn.Module, lr: float, width: int, base_width: int, weight_decay: float = 0.0
) -> list[dict[str, Any]]:
    """Adam(W) parameter groups for μP: hidden weights at ``lr · base_width / width``, the rest
    at ``lr``.

    Example:
        >>> from trainopt.concepts.mup import mup_gpt, mup_param_groups
        >>> from trainopt.models import gpt_config
        >>> model = mup_gpt(gpt_config("tiny", n_embd=128), base_width=32)
        >>> groups = mup_param_groups(model, lr=0.01, width=128, base_width=32)
        >>> [(g["name"], g["lr"], len(g["params"])) for g in groups]
        [('hidden', 0.0025, 8), ('vector-like', 0.01, 7)]
    """
    hidden, vector = [], []
    for name, param in model.named_parameters():
        (hidden if _is_hidden(name, param) else vector).append(param)
    return [
        dict(name="hidden", params=hidden, lr=lr * base_width / width, weight_decay=weight_decay),
        dict(name="vector-like", params=vector, lr=lr, weight_decay=weight_decay),
    ]
