"""The runs of the stability page's corpora: small real tasks, each a model, its data and a loss.

The tasks, each built from a seed with nothing downloaded:

- ``digits``: the digits MLP of :mod:`trainopt.models` on scikit-learn's bundled digits;
- ``language``: the project's GPT (``gpt_config("tiny")`` at a small width) as a character-level
  language model on :func:`generated_text`, English-like sentences from a fixed grammar;
- ``finetune``: the digits MLP trained first on the digits 0 to 4, then fine-tuned on all ten
  with a warm-up and a cosine decay.

And runs whose loss *rises or flattens* while they are healthy (the divergence test must leave
them alone):

- ``vae``: a VAE on the digits whose KL weight warms up from 0 to 1, so the loss rises;
- ``curriculum``: the GPT on :func:`generated_text` with a sequence-length curriculum (8, then
  16, then 32 characters): the loss rises at each step up, on positions it never saw;
- ``mixture``: the GPT on :func:`generated_text`, then on a mixture with a quarter of Python
  source (:func:`stdlib_text`): the loss rises at the switch;
- ``plateau``: a regression onto targets with noise, whose loss sits at the noise floor;
- ``policy``: a policy gradient on a digits contextual bandit, whose loss is minus the reward
  (negative, falling towards -1);
- ``stdlib``: the GPT as a character-level language model on Python's own standard-library
  sources, real text present on every machine.

:func:`build_task` returns what a training loop needs; :mod:`trainopt_site.stability.corpus` trains
each task through the stabilizer and through plain torch, with and without faults.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainopt.models import GPT, digits_data, digits_mlp, gpt_config

__all__ = ["TASKS", "Task", "build_task", "generated_text", "stdlib_text"]

_SUBJECTS = [
    "the model",
    "a small network",
    "the optimizer",
    "every layer",
    "the learning rate",
    "our run",
    "the gradient",
    "a warm restart",
    "the schedule",
    "this batch",
]
_VERBS = [
    "lowers",
    "keeps",
    "follows",
    "skips",
    "measures",
    "tracks",
    "doubles",
    "halves",
    "reads",
    "saves",
]
_OBJECTS = [
    "the loss",
    "a checkpoint",
    "the weights",
    "its momentum",
    "the norm",
    "each step",
    "the window",
    "a spike",
    "the median",
    "the data",
]
_ENDINGS = [
    ".",
    " again.",
    " on the device.",
    " every hundred steps.",
    " without a sync.",
    " at the boundary.",
]


def generated_text(sentences: int = 4000, seed: int = 0) -> str:
    """English-like text from a fixed grammar: enough structure for a small model to learn.

    Example:
        >>> from trainopt_site.stability.corpus_runs import generated_text
        >>> text = generated_text(3, seed=1)
        >>> text.count("."), text == generated_text(3, seed=1)
        (3, True)
    """
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}{rng.choice(_ENDINGS)}"
        for _ in range(sentences)
    )


def stdlib_text(chars: int = 200_000) -> str:
    """The first ``chars`` characters of Python's standard-library sources, non-ASCII as ``?``.

    The ``.py`` files next to :mod:`os`, in sorted order: real text that every machine has.

    Example:
        >>> from trainopt_site.stability.corpus_runs import stdlib_text
        >>> text = stdlib_text(1000)
        >>> len(text), max(map(ord, text)) < 128
        (1000, True)
    """
    parts, total = [], 0
    for path in sorted(Path(os.path.dirname(os.__file__)).glob("*.py")):
        part = path.read_text(encoding="utf-8", errors="replace")
        parts.append(part)
        total += len(part)
        if total >= chars:
            break
    return "".join(c if ord(c) < 128 else "?" for c in "".join(parts)[:chars])


@dataclass
class Task:
    """A model, an optimizer's settings, and batches: what one corpus run trains.

    Example:
        >>> from trainopt_site.stability.corpus_runs import build_task
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
    inputs_scale: Any = (
        None  # (mean, std) that undoes the standardisation: a batch "on another scale"
    )


def _cross_entropy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def _digits(
    batch_size: int, seed: int, classes: int = 10, start: torch.nn.Module | None = None
) -> Task:
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
        index = order[epoch][position * batch_size : (position + 1) * batch_size]
        return x[index], y[index]

    @torch.no_grad()
    def evaluate(m: torch.nn.Module) -> float:
        m.eval()
        accuracy = float((m(x_val).argmax(1) == y_val).float().mean())
        m.train()
        return accuracy

    from trainopt.models import digits_pixels

    raw = digits_pixels()[0].float()
    return Task(model, batch, _cross_entropy, evaluate, per_epoch, (raw.mean(0), raw.std(0)))


def _language(batch_size: int, seed: int, block: int = 32) -> Task:
    text = generated_text(seed=0)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    cut = int(0.9 * len(data))
    train, val = data[:cut], data[cut:]
    torch.manual_seed(seed)
    model = GPT(
        gpt_config("tiny", vocab_size=len(chars), block_size=block, n_embd=48, n_head=4, n_layer=2)
    )
    generator = torch.Generator().manual_seed(seed)

    def windows(source: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = starts[:, None] + torch.arange(block + 1)
        chunk = source[index]
        return chunk[:, :-1], chunk[:, 1:]

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return windows(
            train, torch.randint(0, len(train) - block - 1, (batch_size,), generator=generator)
        )

    val_x, val_y = windows(val, torch.arange(0, len(val) - block - 1, block))

    def loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return m(x, targets=y)

    @torch.no_grad()
    def evaluate(m: torch.nn.Module) -> float:
        return -float(m(val_x, targets=val_y))

    return Task(model, batch, loss, evaluate, len(train) // (batch_size * block))


def _char_lm(
    batch_size: int,
    seed: int,
    text: str,
    mixed: str = "",
    switch: int = 0,
    lengths: tuple[tuple[int, int], ...] = ((0, 32),),
    block: int = 32,
) -> Task:
    """The GPT on ``text``; from step ``switch`` a quarter of each batch from ``mixed``.

    ``lengths`` is the curriculum: ``(from_step, length)`` pairs, the sequence length of the
    batches from each step on. Validation is on full-length windows of both sources.
    """
    chars = sorted(set(text) | set(mixed))
    encode = {c: i for i, c in enumerate(chars)}
    sources = [torch.tensor([encode[c] for c in t]) for t in (text, mixed) if t]
    splits = [(d[: int(0.9 * len(d))], d[int(0.9 * len(d)) :]) for d in sources]
    torch.manual_seed(seed)
    model = GPT(
        gpt_config("tiny", vocab_size=len(chars), block_size=block, n_embd=48, n_head=4, n_layer=2)
    )
    generator = torch.Generator().manual_seed(seed)

    def windows(
        source: torch.Tensor, starts: torch.Tensor, length: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = source[starts[:, None] + torch.arange(length + 1)]
        return chunk[:, :-1], chunk[:, 1:]

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        length = [n for at, n in lengths if step >= at][-1]
        other = batch_size // 4 if len(splits) > 1 and step >= switch else 0
        parts = [
            windows(
                train, torch.randint(0, len(train) - length - 1, (n,), generator=generator), length
            )
            for (train, _), n in zip(splits, (batch_size - other, other))
            if n
        ]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])

    val = [windows(v, torch.arange(0, len(v) - block - 1, block)[:200], block) for _, v in splits]

    def loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return m(x, targets=y)

    @torch.no_grad()
    def evaluate(m: torch.nn.Module) -> float:
        return -sum(float(m(x, targets=y)) for x, y in val) / len(val)

    return Task(model, batch, loss, evaluate, len(splits[0][0]) // (batch_size * block))


class DigitsVAE(torch.nn.Module):
    """A VAE on the 64 pixels of a digit in [0, 1]: ``forward`` gives (reconstruction, KL) per
    image."""

    def __init__(self, latent: int = 8, hidden: int = 128) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(
            torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2 * latent)
        )
        self.decoder = torch.nn.Sequential(
            torch.nn.Linear(latent, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 64)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_var = self.encoder(x).chunk(2, dim=-1)
        z = mean + torch.randn_like(mean) * (0.5 * log_var).exp()
        logits = self.decoder(z)
        reconstruction = F.binary_cross_entropy_with_logits(logits, x, reduction="none").sum(1)
        kl = 0.5 * (mean.pow(2) + log_var.exp() - 1 - log_var).sum(1)
        return reconstruction, kl


def _vae(
    batch_size: int, seed: int, start: int = 100, warmup: int = 400, beta: float = 1.0
) -> Task:
    """The digits VAE; its targets are the KL weight of the step, 0 warming up to 1 over
    ``warmup``."""
    digits = _digits(batch_size, seed)
    mean, std = digits.inputs_scale
    x_val = (digits_data(seed=0)[2] * std + mean) / 16  # the raw pixels, 0 to 16, in [0, 1]
    torch.manual_seed(seed)
    model = DigitsVAE()

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (digits.batch(step)[0] * std + mean).clamp(0, 16) / 16, torch.tensor(
            beta * min(1.0, max(0.0, (step - start) / warmup))
        )

    def loss(m: torch.nn.Module, x: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        reconstruction, kl = m(x)
        return (reconstruction + beta * kl).mean()

    @torch.no_grad()
    def evaluate(m: torch.nn.Module) -> float:
        state = torch.get_rng_state()
        torch.manual_seed(0)
        value = -float(loss(m, x_val, torch.tensor(beta)))
        torch.set_rng_state(state)
        return value

    return Task(model, batch, loss, evaluate, digits.steps_per_epoch)


def _plateau(batch_size: int, seed: int, noise: float = 0.5) -> Task:
    """An MLP regression onto ``sin`` of a projection, plus noise: the loss sits at ``noise**2``."""
    data = torch.Generator().manual_seed(0)
    direction = torch.randn(8, generator=data)
    x_all = torch.randn(4096, 8, generator=data)
    y_all = torch.sin(x_all @ direction / 2) + noise * torch.randn(4096, generator=data)
    x, y, x_val, y_val = x_all[:3584], y_all[:3584], x_all[3584:], y_all[3584:]
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    generator = torch.Generator().manual_seed(seed)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.randint(0, len(x), (batch_size,), generator=generator)
        return x[index], y[index]

    def loss(m: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(m(inputs).squeeze(1), targets)

    @torch.no_grad()
    def evaluate(m: torch.nn.Module) -> float:
        return -float(loss(m, x_val, y_val))

    return Task(model, batch, loss, evaluate, len(x) // batch_size)


def _policy(batch_size: int, seed: int) -> Task:
    """A digits contextual bandit: the policy picks a class, the reward is 1 when it is right.

    The loss is the policy-gradient surrogate ``-mean(ratio * reward)`` with the ratio
    ``pi(a|x) / pi_old(a|x)`` at 1 (on-policy, as PPO's first epoch): its value is minus the
    mean reward of the sampled actions, negative and falling towards -1.
    """
    digits = _digits(batch_size, seed)
    actions = torch.Generator().manual_seed(seed + 1)

    def loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        log_p = torch.log_softmax(m(x), dim=1)
        action = torch.multinomial(log_p.detach().exp(), 1, generator=actions).squeeze(1)
        reward = (action == y).float()
        chosen = log_p.gather(1, action[:, None]).squeeze(1)
        return -((chosen - chosen.detach()).exp() * reward).mean()

    return Task(digits.model, digits.batch, loss, digits.evaluate, digits.steps_per_epoch)


TASKS = (
    "digits",
    "digits0-4",
    "language",
    "vae",
    "curriculum",
    "mixture",
    "plateau",
    "policy",
    "stdlib",
)


def build_task(
    name: str, batch_size: int, seed: int = 0, start: torch.nn.Module | None = None
) -> Task:
    """The task ``name`` (one of :data:`TASKS`) at ``batch_size``.

    ``start`` replaces the freshly initialised model (a fine-tune starts from a trained one).

    Example:
        >>> from trainopt_site.stability.corpus_runs import build_task
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
    if name == "vae":
        return _vae(batch_size, seed)
    if name == "curriculum":
        return _char_lm(
            batch_size,
            seed,
            generated_text(seed=0),
            lengths=((0, 8), (150, 16), (300, 24), (450, 32)),
        )
    if name == "mixture":
        return _char_lm(batch_size, seed, generated_text(seed=0), stdlib_text(100_000), switch=250)
    if name == "plateau":
        return _plateau(batch_size, seed)
    if name == "policy":
        return _policy(batch_size, seed)
    if name == "stdlib":
        return _char_lm(batch_size, seed, stdlib_text())
    raise ValueError(f"task must be one of {', '.join(map(repr, TASKS))}, got {name!r}")
