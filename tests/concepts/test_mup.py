"""μP for the GPT (trainopt.concepts.mup), and a reduced rerun of the page's sweep.

The sweep is the site's: :mod:`trainopt_site.concepts.mup_sweep`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainopt.concepts.mup import MuAttention, MuReadout, mup_gpt, mup_param_groups
from trainopt.models import GPT, gpt_config
from trainopt_site.concepts.mup_sweep import best_lrs, final_loss, mup_sweep_figure, mup_sweep_table

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs/_data/mup_sweep.json"


def test_at_the_base_width_mup_is_the_standard_model() -> None:
    idx = torch.randint(0, 512, (2, 16))
    torch.manual_seed(0)
    standard = GPT(gpt_config("tiny", n_embd=32))
    torch.manual_seed(0)
    mu = mup_gpt(gpt_config("tiny", n_embd=32), base_width=32)
    assert torch.allclose(mu(idx), standard(idx), atol=1e-5)


def test_wider_model_scales_init_attention_readout_and_hidden_lr() -> None:
    torch.manual_seed(0)
    model = mup_gpt(gpt_config("tiny", n_embd=128), base_width=32)  # m = 4, head width 32 (base 8)
    assert isinstance(model.blocks[0].attn, MuAttention) and isinstance(model.lm_head, MuReadout)
    assert abs(model.blocks[0].attn.scale - 8**0.5 / 32) < 1e-12  # ∝ 1/d_head, not 1/sqrt(d_head)
    assert (
        model.lm_head.multiplier == 0.25 and model.lm_head.weight is model.wte.weight
    )  # still tied
    assert abs(model.blocks[0].attn.qkv.weight.std().item() - 0.01) < 0.001  # 0.02 / sqrt(4)
    assert abs(model.wte.weight.std().item() - 0.02) < 0.001  # embeddings keep the base init
    hidden, vector = mup_param_groups(model, lr=0.01, width=128, base_width=32)
    assert hidden["lr"] == 0.0025 and vector["lr"] == 0.01
    ids = {id(p) for g in (hidden, vector) for p in g["params"]}
    assert ids == {id(p) for p in model.parameters()} and len(hidden["params"]) + len(
        vector["params"]
    ) == len(ids)
    assert all(p.ndim == 2 for p in hidden["params"]) and model.wte.weight in vector["params"]


def test_reduced_sweep_sp_best_lr_moves_down_with_width_and_mup_not_further() -> None:
    """2 widths, 3 learning rates, 60 steps: what a tiny run shows robustly.

    Under SP the best learning rate at width 128 is lower than at width 32. At this length μP's best
    at 128 is not reliably back at 32's (the page's 300-step sweep is the evidence for that); the
    test asserts only that it is no lower than SP's.
    """
    lrs = (4e-3, 1.6e-2, 6.4e-2)
    runs = [
        dict(
            param=p,
            width=w,
            lr=lr,
            loss=final_loss(w, lr, p == "muP", steps=60, batch_size=16, tail=10),
        )
        for p, w in (("SP", 32), ("SP", 128), ("muP", 128))
        for lr in lrs
    ]
    best = best_lrs({"runs": runs})
    assert best["SP"][128] < best["SP"][32]
    assert best["muP"][128] >= best["SP"][128]


def test_recorded_sweep_has_every_run_and_renders() -> None:
    results = json.loads(RESULTS.read_text())
    assert (
        results["kind"] == "mup_sweep"
        and results["widths"] == [32, 64, 128]
        and len(results["lrs"]) == 6
    )
    assert len(results["runs"]) == 2 * 3 * 6 and results["git_commit"]
    assert len(mup_sweep_figure(RESULTS).axes) == 2
    assert mup_sweep_table(RESULTS).count("\n") == 4
