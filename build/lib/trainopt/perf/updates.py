"""Update-to-weight ratios per layer: how far one optimizer step moves each weight tensor.

``||Δw|| / ||w||`` for each parameter, measured around ``optimizer.step()`` every
``check_every`` steps. The ratios stay on the device; the host reads them when asked, so the
hot path makes no host-device synchronisation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class UpdateRatioMonitor:
    """Measure ``||Δw|| / ||w||`` of each parameter around ``optimizer.step()``.

    On a checked step the monitor copies the parameters before the step (memory: one copy of
    the weights, on that step only) and computes every ratio with foreach kernels after it,
    into one device tensor. With Adam a tensor's ratio is at most about ``lr / RMS(w)`` per
    step (SGD's rule of thumb of ``1e-3`` does not apply); a layer far above the others, or a
    sudden jump, is a step that moved further than the rest.

    Args:
        model: The module whose parameters (those that require gradients) are watched.
        check_every: Measure on steps ``0, check_every, 2 * check_every, ...``.
        eps: Added to ``||w||`` so that a zero tensor gives a finite ratio.

    Example:
        >>> import torch
        >>> from trainopt.perf import UpdateRatioMonitor
        >>> model = torch.nn.Linear(4, 4, bias=False)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> monitor = UpdateRatioMonitor(model, check_every=1)
        >>> model(torch.ones(2, 4)).sum().backward()
        >>> expected = 0.1 * model.weight.grad.norm() / model.weight.norm()
        >>> with monitor.watch(step=0):
        ...     optimizer.step()
        >>> ratios = monitor.read()
        >>> list(ratios), torch.isclose(torch.tensor(ratios["weight"]), expected).item()
        (['weight'], True)
    """

    def __init__(self, model: nn.Module, check_every: int = 100, eps: float = 1e-12) -> None:
        if check_every < 1:
            raise ValueError(f"check_every must be at least 1, got {check_every=}")
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.check_every = check_every
        self.eps = eps
        self.steps: list[int] = []
        self.history: list[torch.Tensor] = []

    @contextlib.contextmanager
    def watch(self, step: int) -> Iterator[None]:
        """Wrap ``optimizer.step()``; on a checked ``step``, record every parameter's ratio.

        Example:
            >>> import torch
            >>> from trainopt.perf import UpdateRatioMonitor
            >>> model = torch.nn.Linear(2, 2)
            >>> monitor = UpdateRatioMonitor(model, check_every=10)
            >>> with monitor.watch(step=3):  # not a checked step: nothing copied
            ...     pass
            >>> monitor.steps
            []
        """
        if step % self.check_every:
            yield
            return
        with torch.no_grad():
            before = [p.detach().clone() for p in self.params]
        yield
        with torch.no_grad():
            deltas = torch._foreach_sub([p.detach() for p in self.params], before)
            ratios = torch.stack(torch._foreach_norm(deltas)) / (
                torch.stack(torch._foreach_norm(before)) + self.eps
            )
        self.steps.append(step)
        self.history.append(ratios)

    def read(self, index: int = -1) -> dict[str, float]:
        """The ratios of one checked step (default: the latest) by parameter name; one host sync.

        Example:
            >>> import torch
            >>> from trainopt.perf import UpdateRatioMonitor
            >>> UpdateRatioMonitor(torch.nn.Linear(2, 2)).read()
            {}
        """
        if not self.history:
            return {}
        return dict(zip(self.names, self.history[index].tolist()))

    def largest(self, k: int = 3, index: int = -1) -> list[tuple[str, float]]:
        """The ``k`` parameters that moved most, relative to their size, on one checked step.

        Example:
            >>> import torch
            >>> from trainopt.perf import UpdateRatioMonitor
            >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
            >>> monitor = UpdateRatioMonitor(model, check_every=1)
            >>> with monitor.watch(0):
            ...     _ = model[1].weight.data.mul_(2.0)  # doubles: a ratio of 1
            >>> monitor.largest(1)
            [('1.weight', 1.0)]
        """
        return sorted(self.read(index).items(), key=lambda item: -item[1])[:k]

    def state_dict(self) -> dict[str, object]:
        """The recorded steps and ratios, for a checkpoint.

        Example:
            >>> import torch
            >>> from trainopt.perf import UpdateRatioMonitor
            >>> sorted(UpdateRatioMonitor(torch.nn.Linear(2, 2)).state_dict())
            ['history', 'names', 'steps']
        """
        return {"names": list(self.names), "steps": list(self.steps), "history": list(self.history)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore what :meth:`state_dict` saved; the parameter names must match.

        Example:
            >>> import torch
            >>> from trainopt.perf import UpdateRatioMonitor
            >>> first, second = (UpdateRatioMonitor(torch.nn.Linear(2, 2)) for _ in range(2))
            >>> second.load_state_dict(first.state_dict())
            >>> second.steps
            []
        """
        if state["names"] != self.names:
            raise ValueError(
                f"names must match the model's parameters {self.names}, got {state['names']}"
            )
        self.steps = list(state["steps"])  # type: ignore[call-overload]
        self.history = list(state["history"])  # type: ignore[call-overload]
