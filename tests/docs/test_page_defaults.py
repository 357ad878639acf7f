"""The defaults and documented behaviour of torch, Optuna, transformers and Lightning that pages
state (issue 33). Each test reads the installed package, so an upgrade that changes one fails here
and names the page to correct.
"""

from __future__ import annotations

import inspect

import optuna
import torch
from extras import require

from trainopt.hpo.study import make_pruner


def test_adam_first_step_moves_each_element_by_the_rate():
    """monitoring.md: Adam's update-to-weight ratio is at most about lr / RMS(W)."""
    weight = torch.nn.Parameter(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)))
    weight.grad = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    before = weight.detach().clone()
    torch.optim.AdamW([weight], lr=3e-4, weight_decay=0.0).step()
    assert torch.allclose((weight - before).abs(), torch.full_like(before, 3e-4), rtol=1e-3)


def test_adamw_decay_is_lr_times_lambda():
    """concepts/optimization.md: torch's AdamW decays by lr * lambda (muP's hidden rate cuts it)."""
    weight = torch.nn.Parameter(torch.ones(3))
    weight.grad = torch.zeros(3)
    torch.optim.AdamW([weight], lr=0.1, weight_decay=0.5).step()
    assert torch.allclose(weight.detach(), torch.full((3,), 1 - 0.1 * 0.5))


def test_grad_scaler_reads_the_host_only_for_unfused_optimizers():
    """use-with-your-trainer.md, distributed-training.md: a fused optimizer takes found_inf on the
    device (``_step_supports_amp_scaling``), so GradScaler.step makes no host read for it."""
    params = [torch.nn.Parameter(torch.ones(2))]
    assert torch.optim.AdamW(params, fused=True)._step_supports_amp_scaling
    assert not getattr(torch.optim.AdamW(params), "_step_supports_amp_scaling", False)
    source = inspect.getsource(torch.amp.GradScaler._maybe_opt_step)
    assert ".item()" in source  # the unfused path's read


def test_set_sync_debug_mode_is_documented_as_incomplete():
    """benchmarking.md, training-stability.md: the mode misses some synchronising operations."""
    doc = " ".join(torch.cuda.set_sync_debug_mode.__doc__.split())
    assert "not all synchronizing operations will trigger warning or error" in doc


def test_median_pruner_warm_up_trainopt_4_optuna_5():
    """hyperparameter-optimization.md: the median pruner waits for 4 trials here, 5 in Optuna."""
    default = inspect.signature(optuna.pruners.MedianPruner).parameters["n_startup_trials"]
    assert default.default == 5
    assert make_pruner("median")._n_startup_trials == 4
    assert isinstance(optuna.create_study().pruner, optuna.pruners.MedianPruner)  # HF's search


def test_transformers_defaults():
    """use-with-your-trainer.md, distributed-training.md: the Trainer's optimizer is fused AdamW,
    it averages tokens across devices, and its Optuna search uses the study's pruner."""
    require("transformers", "hf")
    from transformers import TrainingArguments
    from transformers.integrations import integration_utils

    fields = TrainingArguments.__dataclass_fields__
    assert fields["optim"].default == "adamw_torch_fused"
    assert fields["average_tokens_across_devices"].default is True
    search = inspect.getsource(integration_utils.run_hp_search_optuna)
    assert "optuna.create_study(" in search and "**kwargs" in search
    from transformers import Trainer

    assert "trial.should_prune()" in inspect.getsource(Trainer._report_to_hp_search)


def test_lightning_skips_a_batch_when_training_step_returns_none():
    """use-with-your-trainer.md: Lightning documents ``None`` from ``training_step`` as a skip."""
    require("lightning", "lightning")
    from lightning.pytorch import LightningModule

    doc = " ".join(LightningModule.training_step.__doc__.split())
    assert (
        "``None`` - In automatic optimization, this will skip to the next batch (but is not "
        "supported for multi-GPU, TPU, or DeepSpeed)."
    ) in doc
