"""μP (maximal update parametrization) for the project's GPT, and the concepts page's width sweep.

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

- :func:`mup_gpt` and :func:`mup_param_groups`: the model changes and the optimizer's groups;
- :func:`final_loss`, :func:`lr_sweep`, :func:`best_lrs`: the page's executed sweep;
- :func:`mup_sweep_figure`, :func:`mup_sweep_table`: the page's figure and table, from the
  results file ``python -m trainopt.concepts.mup --out docs/_data/mup_sweep.json`` writes.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainopt.concepts.rules import warmup_cosine_lr
from trainopt.models import GPT, CausalSelfAttention, GPTConfig, gpt_config

__all__ = [
    "MuAttention", "MuReadout", "best_lrs", "final_loss", "lr_sweep", "main", "mup_gpt", "mup_param_groups",
    "mup_sweep_figure", "mup_sweep_table", "sweep_text",
]

WIDTHS = (32, 64, 128)
LRS = (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2)


class MuAttention(CausalSelfAttention):
    """Causal self-attention whose logits are scaled by ``scale`` (μP: ``sqrt(d0) / d_head``).

    Example:
        >>> import torch
        >>> from trainopt.concepts.mup import MuAttention
        >>> from trainopt.models import CausalSelfAttention, gpt_config
        >>> config = gpt_config("tiny")
        >>> torch.manual_seed(0); plain = CausalSelfAttention(config)  # doctest: +ELLIPSIS
        <...>
        >>> mu = MuAttention(config, scale=1 / (64 // 4) ** 0.5); mu.load_state_dict(plain.state_dict())
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
        q, k, v = (t.view(batch, seq, self.n_head, width // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                           dropout_p=self.dropout if self.training else 0.0)
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
    """A :class:`~trainopt.models.GPT` in μP relative to ``base_width`` (``m = n_embd / base_width``).

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
        raise ValueError(f"base_width must be a positive multiple of n_head={config.n_head}, got {base_width}")
    model = GPT(config)
    m = config.n_embd / base_width
    d_head, d0 = config.n_embd // config.n_head, base_width // config.n_head
    with torch.no_grad():
        for name, param in model.named_parameters():
            if _is_hidden(name, param):
                param.mul_(m ** -0.5)
    for block in model.blocks:
        attn = MuAttention(config, scale=math.sqrt(d0) / d_head)
        attn.load_state_dict(block.attn.state_dict())
        block.attn = attn
    model.lm_head = MuReadout(model.wte.weight, multiplier=1.0 / m)
    return model


def mup_param_groups(model: nn.Module, lr: float, width: int, base_width: int,
                     weight_decay: float = 0.0) -> list[dict[str, Any]]:
    """Adam(W) parameter groups for μP: hidden weights at ``lr · base_width / width``, the rest at ``lr``.

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
    return [dict(name="hidden", params=hidden, lr=lr * base_width / width, weight_decay=weight_decay),
            dict(name="vector-like", params=vector, lr=lr, weight_decay=weight_decay)]


def sweep_text() -> torch.Tensor:
    """The sweep's data: :func:`~trainopt.stability.corpus_runs.generated_text` as character ids.

    Example:
        >>> from trainopt.concepts.mup import sweep_text
        >>> data = sweep_text()
        >>> data.ndim, int(data.max()) < 64
        (1, True)
    """
    from trainopt.stability.corpus_runs import generated_text

    text = generated_text(seed=0)
    chars = sorted(set(text))
    return torch.tensor([chars.index(c) for c in text])


def final_loss(width: int, lr: float, mup: bool, steps: int = 300, base_width: int = 32,
               batch_size: int = 32, block: int = 32, seed: int = 0, tail: int = 25) -> float:
    """Train the GPT (2 layers, 4 heads, ``n_embd=width``) on :func:`sweep_text`; the final train loss.

    AdamW (no weight decay), ``lr`` warmed up over the first 10 % of ``steps`` and cosine-decayed
    to zero; the same seed gives every run the same initial draws and the same batches. Returns the
    mean training loss of the last ``tail`` steps (``nan`` if the run diverged).

    Example:
        >>> from trainopt.concepts.mup import final_loss
        >>> loss = final_loss(32, lr=0.01, mup=True, steps=30, tail=5)
        >>> 0 < loss < 3.5  # ln(31 characters) ≈ 3.4 at the start
        True
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and the losses reproducible
    try:
        data = sweep_text()
        config = gpt_config("tiny", vocab_size=int(data.max()) + 1, block_size=block, n_embd=width,
                            n_head=4, n_layer=2)
        torch.manual_seed(seed)
        if mup:
            model = mup_gpt(config, base_width)
            groups = mup_param_groups(model, lr, width, base_width)
        else:
            model = GPT(config)
            groups = [dict(params=list(model.parameters()), lr=lr)]
        for group in groups:
            group["peak"] = group["lr"]
        optimizer = torch.optim.AdamW(groups, lr=lr, weight_decay=0.0)
        generator = torch.Generator().manual_seed(seed)
        losses = []
        for step in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = warmup_cosine_lr(step, max_lr=group["peak"], warmup_steps=steps // 10,
                                               total_steps=steps)
            starts = torch.randint(0, len(data) - block - 1, (batch_size,), generator=generator)
            chunk = data[starts[:, None] + torch.arange(block + 1)]
            loss = model(chunk[:, :-1], targets=chunk[:, 1:])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
        value = torch.stack(losses[-tail:]).mean().item()
        return value if math.isfinite(value) else float("nan")
    finally:
        torch.set_num_threads(threads)


def lr_sweep(widths: Sequence[int] = WIDTHS, lrs: Sequence[float] = LRS, steps: int = 300,
             base_width: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Final losses for every (parametrization, width, lr); μP relative to the smallest width.

    Example:
        >>> from trainopt.concepts.mup import lr_sweep
        >>> results = lr_sweep(widths=[32], lrs=[0.01], steps=10)
        >>> [(r["param"], r["width"], r["lr"]) for r in results["runs"]]
        [('SP', 32, 0.01), ('muP', 32, 0.01)]
    """
    base = base_width or min(widths)
    runs = []
    for param in ("SP", "muP"):
        for w in widths:
            for lr in lrs:
                loss = final_loss(w, lr, param == "muP", steps, base, seed=seed)
                runs.append(dict(param=param, width=w, lr=lr, loss=None if math.isnan(loss) else round(loss, 5)))
    return dict(kind="mup_sweep", steps=steps, base_width=base, widths=list(widths), lrs=list(lrs),
                seed=seed, runs=runs)


def best_lrs(results: dict[str, Any]) -> dict[str, dict[int, float]]:
    """``{param: {width: lr with the lowest final loss}}`` (diverged runs never win).

    Example:
        >>> from trainopt.concepts.mup import best_lrs
        >>> runs = [dict(param="SP", width=32, lr=lr, loss=loss) for lr, loss in [(0.01, 2.0), (0.1, 1.5)]]
        >>> best_lrs({"runs": runs})
        {'SP': {32: 0.1}}
    """
    best: dict[str, dict[int, tuple[float, float]]] = {}
    for run in results["runs"]:
        loss = run["loss"] if run["loss"] is not None and math.isfinite(run["loss"]) else math.inf
        current = best.setdefault(run["param"], {}).get(run["width"])
        if current is None or loss < current[0]:
            best[run["param"]][run["width"]] = (loss, run["lr"])
    return {param: {w: lr for w, (_, lr) in sorted(by_width.items())} for param, by_width in best.items()}


def _read(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def mup_sweep_figure(path: str | Path) -> Any:
    """Final loss against learning rate, one line per width: standard parametrization left, μP right.

    The best learning rate of each width is ringed.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from trainopt.concepts.mup import lr_sweep, mup_sweep_figure
        >>> path = Path(tempfile.mkdtemp()) / "mup.json"
        >>> _ = path.write_text(json.dumps(lr_sweep(widths=[32, 64], lrs=[0.01, 0.02], steps=5)))
        >>> len(mup_sweep_figure(path).axes)
        2
    """
    import matplotlib.pyplot as plt

    results = _read(path)
    best = best_lrs(results)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, param, title in zip(axes, ("SP", "muP"), ("standard parametrization", "μP")):
        for i, width in enumerate(results["widths"]):
            runs = sorted((r for r in results["runs"] if r["param"] == param and r["width"] == width),
                          key=lambda r: r["lr"])
            lrs = [r["lr"] for r in runs]
            losses = [r["loss"] if r["loss"] is not None else math.nan for r in runs]
            colour = f"C{i}"
            ax.plot(lrs, losses, "o-", color=colour, label=f"width {width}")
            top = best[param][width]
            ax.plot([top], [losses[lrs.index(top)]], "o", ms=14, mfc="none", mec=colour, mew=2)
        ax.set(xscale="log", xlabel="peak learning rate (AdamW)", title=title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    axes[0].set_ylabel(f"train loss, last steps of {results['steps']}")
    fig.tight_layout()
    return fig


def mup_sweep_table(path: str | Path) -> str:
    """A Markdown table of the best learning rate per width, standard parametrization and μP.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from trainopt.concepts.mup import mup_sweep_table
        >>> runs = [dict(param=p, width=32, lr=0.01, loss=2.0) for p in ("SP", "muP")]
        >>> path = Path(tempfile.mkdtemp()) / "mup.json"
        >>> _ = path.write_text(json.dumps({"runs": runs, "widths": [32]}))
        >>> print(mup_sweep_table(path).splitlines()[2])
        | 32 | 0.01 (2.000) | 0.01 (2.000) |
    """
    results = _read(path)
    best = best_lrs(results)
    loss = {(r["param"], r["width"], r["lr"]): r["loss"] for r in results["runs"]}
    lines = ["| width | best lr, standard (loss) | best lr, μP (loss) |", "| ---: | ---: | ---: |"]
    for width in results["widths"]:
        cells = [f"{best[p][width]:g} ({loss[p, width, best[p][width]]:.3f})" for p in ("SP", "muP")]
        lines.append(f"| {width} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep, write the results file, print the table; returns the exit status.

    Example:
        >>> from trainopt.concepts.mup import main
        >>> main(["--help"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        SystemExit: 0
    """
    from trainopt.config.cli import ArgumentParser, output_file, positive_int
    from trainopt.config.provenance import git_state

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = ArgumentParser(prog="python -m trainopt.concepts.mup",
                            description="The concepts page's μP sweep: the GPT at 3 widths, 6 learning rates, "
                                        "with and without μP.")
    parser.add_argument("--steps", type=positive_int, default=300, help="training steps per run (300)")
    parser.add_argument("--out", type=output_file, required=True, help="results JSON file to write")
    args = parser.parse_args(argv)
    results = {**lr_sweep(steps=args.steps), **git_state(),
               "command": shlex.join(["python", "-m", "trainopt.concepts.mup", *argv]),
               "torch": torch.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(mup_sweep_table(args.out))
    return 0


if __name__ == "__main__":
    from trainopt.config.cli import run_command

    sys.exit(run_command(main))
