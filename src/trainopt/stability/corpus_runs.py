"""The runs of the stability page's corpora: small real tasks, each a model, its data and a loss.

Three tasks, each built from a seed with nothing downloaded:

- ``digits``: the digits MLP of :mod:`trainopt.models` on scikit-learn's bundled digits;
- ``language``: the project's GPT (``gpt_config("tiny")`` at a small width) as a character-level
  language model on :func:`generated_text`, English-like sentences from a fixed grammar;
- ``finetune``: the digits MLP trained first on the digits 0 to 4, then fine-tuned on all ten
  with a warm-up and a cosine decay.

:func:`build_task` returns what a training loop needs; :mod:`trainopt.stability.corpus` trains
each task through the stabilizer and through plain torch, with and without faults.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from trainopt.models import GPT, digits_data, digits_mlp, gpt_config

__all__ = ["Task", "build_task", "generated_text"]

_SUBJECTS = ["the model", "a small network", "the optimizer", "every layer", "the learning rate", "our run",
             "the gradient", "a warm restart", "the schedule", "this batch"]
_VERBS = ["lowers", "keeps", "follows", "skips", "measures", "tracks", "doubles", "halves", "reads", "saves"]
_OBJECTS = ["the loss", "a checkpoint", "the weights", "its momentum", "the norm", "each step", "the window",
            "a spike", "the median", "the data"]
_ENDINGS = [".", " again.", " on the device.", " every hundred steps.", " without a sync.", " at the boundary."]


def generated_text(sentences: int = 4000, seed: int = 0) -> str:
    """English-like text from a fixed grammar: enough structure for a small model to learn.

    Example:
        >>> from trainopt.stability.corpus_runs import generated_text
        >>> text = generated_text(3, seed=1)
        >>> text.count("."), text == generated_text(3, seed=1)
        (3, True)
    """
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}"
                    for _ in range(sentences))


@dataclass
class Task:
    """A model, an optimizer's settings, and batches: what one corpus run trains.

    Example:
        >>> from trainopt.stability.corpus_runs import build_task
        >>> task = build_task("language", batch_size=2)
        >>> x, y = task.batch(0)
        >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())  # next-character targets
        (torch.Size([2, 32]), True)
    """

    model: torch.nn.Module
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # step -> (inputs, targets)
    loss: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[torch.nn.Module], float]  # higher is better (accuracy, or minus the loss)
    steps_per_epoch: int
    inputs_scale: Any = None  # (mean, std) that undoes the standardisation: a batch "on another scale"


def _cross_entropy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _digits(batch_size: int, seed: int, classes: int = 10, start: torch.nn.Module | None = None) -> Task:
    x, y, x_val, y_val = digits_data(seed=0)
    keep, keep_val = y < classes, y_val < classes
    x, y, x_val, y_val = x[keep], y[keep], x_val[keep_val], y_val[keep_val]
    model = start if start is not None else digits_mlp(hidden=128, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    per_epoch = len(x) // batch_size
    order: list[torch.Tensor] = []

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, position = divmod(step, per_epoch)
        while len(order) <= epoch:
            order.append(torch.randperm(len(x), generator=generator))
        index = order[epoch][position * batch_size:(position + 1) * batch_size]
        return x[index], y[index]

    @torch.no_grad()
    def evaluate(m: torch.nn.Module) -> float:
        m.eval()
        accuracy = float((m(x_val).argmax(1) == y_val).float().mean())
        m.train()
        return accuracy

    from sklearn.datasets import load_digits

    raw = torch.as_tensor(load_digits().data, dtype=torch.float32)
    return Task(model, batch, _cross_entropy, evaluate, per_epoch, (raw.mean(0), raw.std(0)))


def _language(batch_size: int, seed: int, block: int = 32) -> Task:
    text = generated_text(seed=0)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    cut = int(0.9 * len(data))
    train, val = data[:cut], data[cut:]
    torch.manual_seed(seed)
    model = GPT(gpt_config("tiny", vocab_size=len(chars), block_size=block, n_embd=48, n_head=4, n_layer=2))
    generator = torch.Generator().manual_seed(seed)

    def windows(source: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = starts[:, None] + torch.arange(block + 1)
        chunk = source[index]
        return chunk[:, :-1], chunk[:, 1:]

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return windows(train, torch.randint(0, len(train) - block - 1, (batch_size,), generator=generator))

    val_x, val_y = windows(val, torch.arange(0, len(val) - block - 1, block))

    def loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return m(x, targets=y)

    @torch.no_grad()
    def evaluate(m: torch.nn.Module) -> float:
        return -float(m(val_x, targets=val_y))

    return Task(model, batch, loss, evaluate, len(train) // (batch_size * block))


def build_task(name: str, batch_size: int, seed: int = 0, start: torch.nn.Module | None = None) -> Task:
    """The task ``name`` (``"digits"``, ``"digits0-4"``, ``"language"``) at ``batch_size``.

    ``start`` replaces the freshly initialised model (a fine-tune starts from a trained one).

    Example:
        >>> from trainopt.stability.corpus_runs import build_task
        >>> task = build_task("digits", batch_size=16)
        >>> x, y = task.batch(0)
        >>> x.shape, task.steps_per_epoch
        (torch.Size([16, 64]), 89)
    """
    if name == "digits":
        return _digits(batch_size, seed, start=start)
    if name == "digits0-4":
        return _digits(batch_size, seed, classes=5, start=start)
    if name == "language":
        return _language(batch_size, seed)
    raise ValueError(f"task must be one of 'digits', 'digits0-4', 'language', got {name!r}")
