"""The concepts page's μP width sweep: the best learning rate per width, with and without μP.

``python -m trainopt_site.concepts.mup_sweep --out docs/_data/mup_sweep.json`` trains the GPT at
3 widths and 6 learning rates, in the standard parametrization and in μP
(:func:`trainopt.concepts.mup.mup_gpt`, :func:`trainopt.concepts.mup.mup_param_groups`), and
writes the results file the page's figure (:func:`mup_sweep_figure`) and table
(:func:`mup_sweep_table`) read. :func:`final_loss`, :func:`lr_sweep` and :func:`best_lrs` are the
sweep itself; its data is the stability corpus's generated text (:func:`sweep_text`).
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

from trainopt.concepts.mup import mup_gpt, mup_param_groups
from trainopt.concepts.rules import warmup_cosine_lr
from trainopt.models import GPT, gpt_config
from trainopt_site.stability.corpus_runs import generated_text

__all__ = [
    "best_lrs",
    "final_loss",
    "lr_sweep",
    "main",
    "mup_sweep_figure",
    "mup_sweep_table",
    "sweep_text",
]

WIDTHS = (32, 64, 128)
LRS = (2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2)


def sweep_text() -> torch.Tensor:
    """The sweep's data: :func:`~trainopt_site.stability.corpus_runs.generated_text` as character
    ids.

    Example:
        >>> from trainopt_site.concepts.mup_sweep import sweep_text
        >>> data = sweep_text()
        >>> data.ndim, int(data.max()) < 64
        (1, True)
    """
    text = generated_text(seed=0)
    chars = sorted(set(text))
    return torch.tensor([chars.index(c) for c in text])


def final_loss(
    width: int,
    lr: float,
    mup: bool,
    steps: int = 300,
    base_width: int = 32,
    batch_size: int = 32,
    block: int = 32,
    seed: int = 0,
    tail: int = 25,
) -> float:
    """Train the GPT (2 layers, 4 heads, ``n_embd=width``) on :func:`sweep_text`; the final train
    loss.

    AdamW (no weight decay), ``lr`` warmed up over the first 10 % of ``steps`` and cosine-decayed
    to zero; the same seed gives every run the same initial draws and the same batches. Returns the
    mean training loss of the last ``tail`` steps (``nan`` if the run diverged).

    Example:
        >>> from trainopt_site.concepts.mup_sweep import final_loss
        >>> loss = final_loss(32, lr=0.01, mup=True, steps=30, tail=5)
        >>> 0 < loss < 3.5  # ln(31 characters) ≈ 3.4 at the start
        True
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and the losses reproducible
    try:
        data = sweep_text()
        config = gpt_config(
            "tiny",
            vocab_size=int(data.max()) + 1,
            block_size=block,
            n_embd=width,
            n_head=4,
            n_layer=2,
        )
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
                group["lr"] = warmup_cosine_lr(
                    step, max_lr=group["peak"], warmup_steps=steps // 10, total_steps=steps
                )
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


def lr_sweep(
    widths: Sequence[int] = WIDTHS,
    lrs: Sequence[float] = LRS,
    steps: int = 300,
    base_width: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Final losses for every (parametrization, width, lr); μP relative to the smallest width.

    Example:
        >>> from trainopt_site.concepts.mup_sweep import lr_sweep
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
                runs.append(
                    dict(
                        param=param,
                        width=w,
                        lr=lr,
                        loss=None if math.isnan(loss) else round(loss, 5),
                    )
                )
    return dict(
        kind="mup_sweep",
        steps=steps,
        base_width=base,
        widths=list(widths),
        lrs=list(lrs),
        seed=seed,
        runs=runs,
    )


def best_lrs(results: dict[str, Any]) -> dict[str, dict[int, float]]:
    """``{param: {width: lr with the lowest final loss}}`` (diverged runs never win).

    Example:
        >>> from trainopt_site.concepts.mup_sweep import best_lrs
        >>> runs = [dict(param="SP", width=32, lr=lr, loss=loss)
        ...         for lr, loss in [(0.01, 2.0), (0.1, 1.5)]]
        >>> best_lrs({"runs": runs})
        {'SP': {32: 0.1}}
    """
    best: dict[str, dict[int, tuple[float, float]]] = {}
    for run in results["runs"]:
        loss = run["loss"] if run["loss"] is not None and math.isfinite(run["loss"]) else math.inf
        current = best.setdefault(run["param"], {}).get(run["width"])
        if current is None or loss < current[0]:
            best[run["param"]][run["width"]] = (loss, run["lr"])
    return {
        param: {w: lr for w, (_, lr) in sorted(by_width.items())}
        for param, by_width in best.items()
    }


def _read(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def mup_sweep_figure(path: str | Path) -> Any:
    """Final loss against learning rate, one line per width: standard parametrization left, μP
    right.

    The best learning rate of each width is ringed.

    Example:
        >>> import json, tempfile
        >>> from pathlib import Path
        >>> from trainopt_site.concepts.mup_sweep import lr_sweep, mup_sweep_figure
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
            runs = sorted(
                (r for r in results["runs"] if r["param"] == param and r["width"] == width),
                key=lambda r: r["lr"],
            )
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
        >>> from trainopt_site.concepts.mup_sweep import mup_sweep_table
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
        cells = [
            f"{best[p][width]:g} ({loss[p, width, best[p][width]]:.3f})" for p in ("SP", "muP")
        ]
        lines.append(f"| {width} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep, write the results file, print the table; returns the exit status.

    Example:
        >>> from trainopt_site.concepts.mup_sweep import main
        >>> main(["--help"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        SystemExit: 0
    """
    from trainopt.config.cli import ArgumentParser, output_file, positive_int
    from trainopt.config.provenance import git_state

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = ArgumentParser(
        prog="python -m trainopt_site.concepts.mup_sweep",
        description="The concepts page's μP sweep: the GPT at 3 widths, 6 learning rates, "
        "with and without μP.",
    )
    parser.add_argument(
        "--steps", type=positive_int, default=300, help="training steps per run (300)"
    )
    parser.add_argument("--out", type=output_file, required=True, help="results JSON file to write")
    args = parser.parse_args(argv)
    results = {
        **lr_sweep(steps=args.steps),
        **git_state(),
        "command": shlex.join(["python", "-m", "trainopt_site.concepts.mup_sweep", *argv]),
        "torch": torch.__version__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(mup_sweep_table(args.out))
    return 0


if __name__ == "__main__":
    from trainopt.config.cli import run_command

    sys.exit(run_command(main))
