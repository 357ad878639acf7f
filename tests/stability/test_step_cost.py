"""What a stabilized step adds, counted in operators: the page's "about 60 small operators per
step".

On a CPU, and in kernel launches on a GPU, a step of a small model costs per operator. These count
the operators dispatched by the stabilizer's update against a plain loop's ``clip_grad_norm_`` and
``optimizer.step()`` on the same gradients, so a change that adds per-step operators fails here
before the benchmark shows it.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from trainopt.models import GPT, gpt_config, synthetic_batch
from trainopt.schedules import cosine_annealing_schedule
from trainopt.stability import TrainingStabilizer


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = str(func.overloadpacket)
        if "profiler" not in name:  # torch's own record_function markers are not work
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _optimizer(form: str, params) -> torch.optim.Optimizer:  # noqa: ANN001
    return {
        "AdamW fused": lambda: torch.optim.AdamW(params, lr=3e-4, fused=True),
        "AdamW foreach": lambda: torch.optim.AdamW(params, lr=3e-4, foreach=True),
        "SGD default": lambda: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    }[form]()


@pytest.mark.parametrize(
    ("form", "most"), [("AdamW fused", 60), ("AdamW foreach", 70), ("SGD default", 70)]
)
def test_the_stabilized_update_adds_a_fixed_number_of_operators(form: str, most: int):
    torch.manual_seed(0)
    model = GPT(gpt_config("tiny"))
    x, y = synthetic_batch(model.config, 4, 32)
    opt = _optimizer(form, model.parameters())
    stabilizer = TrainingStabilizer(
        model,
        opt,
        cosine_annealing_schedule(opt, total_steps=1000, warmup_steps=10),
        max_grad_norm=1.0,
        check_every=100,
    )
    for _ in range(30):  # past min_history: the scores run
        stabilizer.step(lambda: model(x, targets=y))
    model(x, targets=y).backward()
    loss = torch.tensor(2.0)
    with _Count() as stabilized:
        stabilizer.core.update(loss)
    with _Count() as plain:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    added = sum(stabilized.ops.values()) - sum(plain.ops.values())
    assert 0 < added <= most, (added, stabilized.ops - plain.ops)
    assert stabilized.ops["aten.sort"] == 1  # one sort scores the loss and the gradient norm
