"""The tiny Llama the trainer examples train: built from its config, so nothing is downloaded.

:func:`tiny_causal_lm` is the model of :func:`trainopt.hpo.integrations.hf.trainer_objective`
(the objective of the tuning config ``hpo_trainer.yaml``) and of the trainer page's comparison
runs. It imports ``transformers`` when called, not before.
"""

from __future__ import annotations

import torch

__all__ = ["VOCAB", "tiny_causal_lm"]

VOCAB = 32
"""The tiny Llama's vocabulary size."""


def tiny_causal_lm() -> torch.nn.Module:
    """A one-layer Llama with a 32-token vocabulary, built from its config (no download).

    Example:
        >>> from trainopt.stability.integrations.tiny import tiny_causal_lm
        >>> model = tiny_causal_lm()
        >>> model.config.vocab_size, sum(p.numel() for p in model.parameters()) < 10_000
        (32, True)
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=16,
    )
    return LlamaForCausalLM(config)
