"""A skipped step consumes no schedule position: the window's rates, chosen on the device.

A learning-rate scheduler counts calls to ``step()``, and knowing whether an optimizer step was
skipped needs the host. :class:`ScheduleWindow` removes the need. At each boundary (every
``check_every`` steps) the host steps the scheduler ahead ``length`` times on a saved copy of its
state and records every hyperparameter it changes (the learning rate, and the momentum or
``betas`` that ``OneCycleLR`` and ``CyclicLR`` cycle): row ``j`` of the table is what the ``j``-th
applied step of the window uses. During the window, :meth:`ScheduleWindow.applied` hands the
optimizer 0-d device tensors that hold row ``a``, where ``a`` counts the steps applied so far in
the window (a device counter), so a skipped step leaves ``a`` and therefore the rate where they
were. At the next boundary the host reads the count once and steps the real scheduler that many
times.

The guarantee: the hyperparameters of every applied step are those the scheduler gives at the
count of applied steps, as in a plain loop that never saw the skipped batches. It holds for every
scheduler stepped once per step with no argument, at any ``check_every``.

What it costs: nothing where nothing changes within a window (no scheduler, a constant one,
``check_every=1``): the optimizer keeps its Python floats and runs exactly as without it. Where a
value changes, the optimizer receives it as a tensor, which ``torch.optim`` accepts for ``lr`` in
fused, capturable and single-tensor (``foreach=False``) steps; :meth:`ScheduleWindow.check`
refuses, when the stabilizer is built, a configuration that cannot take a changing value as a
tensor (``foreach=True`` without ``capturable``, a fused step whose momentum or ``betas`` cycle).
A tensor rate is rounded to float32 where the float path computes in float64: the weights agree
with the float run to float32 rounding, not bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["ScheduleWindow", "UnsupportedScheduleError"]


class UnsupportedScheduleError(ValueError):
    """An optimizer that cannot take a value its scheduler changes as a device tensor.

    Example:
        >>> import torch
        >>> from trainopt.stability.schedule_window import ScheduleWindow, UnsupportedScheduleError
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> opt = torch.optim.Adam([w], lr=0.1, foreach=True)
        >>> sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
        >>> try:
        ...     ScheduleWindow([(opt, sched)], length=4).check()
        ... except UnsupportedScheduleError as error:
        ...     print(str(error).split(":")[0])
        Adam(foreach=True) cannot take the rates of ExponentialLR on the device
    """


def _values(group: dict[str, Any]) -> dict[tuple[str, int], float]:
    """The numeric hyperparameters of a group, tuples flattened: ``{(key, index): value}``."""
    out: dict[tuple[str, int], float] = {}
    for key, value in group.items():
        if key == "params":
            continue
        if isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) for v in value):
            out.update({(key, i): float(v) for i, v in enumerate(value)})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[(key, -1)] = float(value)
    return out


def _advance(scheduler: Any, steps: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()"
        for _ in range(steps):
            scheduler.step()


class ScheduleWindow:
    """The hyperparameters of the next ``length`` applied steps, selected by a device counter.

    Args:
        pairs: ``(optimizer, scheduler)`` pairs; a ``None`` scheduler keeps its optimizer's values.
        length: Steps per window (the stabilizer's ``check_every``).

    Example:
        >>> import torch
        >>> from trainopt.stability.schedule_window import ScheduleWindow
        >>> w = torch.nn.Parameter(torch.zeros(1))
        >>> opt = torch.optim.SGD([w], lr=1.0)
        >>> sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
        >>> window = ScheduleWindow([(opt, sched)], length=3)
        >>> used = []
        >>> for skip in (False, True, False):  # the second step is skipped
        ...     with window.applied():
        ...         used.append(float(opt.param_groups[0]["lr"]))
        ...     window.count(torch.tensor(skip))
        >>> window.close()  # two steps applied: the schedule moves on by two
        2
        >>> used, opt.param_groups[0]["lr"]
        ([1.0, 0.5, 0.5], 0.25)
    """

    def __init__(self, pairs: list[tuple[torch.optim.Optimizer, Any]], length: int) -> None:
        self.pairs = pairs
        self.length = length
        first = next(p for opt, _ in pairs for g in opt.param_groups for p in g["params"])
        self.device = first.device
        self.applied_steps = torch.zeros((), dtype=torch.long, device=self.device)
        self._open()

    def _open(self) -> None:
        """Simulate the window's rows on copies of the schedulers' states; keep what changes."""
        self.slots: list[tuple[dict[str, Any], str, int]] = []
        rows: list[list[float]] = []
        for optimizer, scheduler in self.pairs:
            if scheduler is None:
                continue
            before = [_values(g) for g in optimizer.param_groups]
            state, groups = copy.deepcopy(scheduler.state_dict()), [dict(g) for g in optimizer.param_groups]
            table = [before]
            try:
                for _ in range(self.length - 1):
                    _advance(scheduler, 1)
                    table.append([_values(g) for g in optimizer.param_groups])
            except Exception:  # noqa: BLE001 - e.g. OneCycleLR past total_steps: the real run raises there
                pass
            finally:
                scheduler.load_state_dict(state)
                for group, saved in zip(optimizer.param_groups, groups):
                    group.update(saved)
            table += [table[-1]] * (self.length - len(table))
            for g, group in enumerate(optimizer.param_groups):
                for slot, first in before[g].items():
                    column = [row[g].get(slot, first) for row in table]
                    if any(v != first for v in column):
                        self.slots.append((group, *slot))
                        rows.append(column)
        self.schedulers = [s for _, s in self.pairs if s is not None]
        if rows:
            self.table = torch.tensor(rows, dtype=torch.float32, device=self.device).T.contiguous()
            self.current = self.table[0].clone()
        self.applied_steps.zero_()

    def check(self) -> None:
        """Refuse an optimizer that would receive a changing value it cannot take as a tensor."""
        for optimizer, scheduler in self.pairs:
            changed = {key for group, key, _ in self.slots if any(group is g for g in optimizer.param_groups)}
            if not changed:
                continue
            defaults = optimizer.defaults
            name = type(optimizer).__name__
            why = None
            if defaults.get("foreach") and not defaults.get("capturable") and not defaults.get("fused"):
                why = f"{name}(foreach=True)"
            elif defaults.get("fused") and changed - {"lr"}:
                why = f"{name}(fused=True) with a cycled {sorted(changed - {'lr'})}"
            if why:
                raise UnsupportedScheduleError(
                    f"{why} cannot take the rates of {type(scheduler).__name__} on the device: a skipped step "
                    "would shift the schedule. Use foreach=False or capturable=True (fused=True for the learning "
                    "rate alone), cycle_momentum=False, or check_every=1")

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Within: every changing value of the optimizers is the window's row at the applied count."""
        if not self.slots:
            yield
            return
        self.current.copy_(self.table.index_select(0, self.applied_steps.view(1)).view(-1))
        saved = []
        for i, (group, key, index) in enumerate(self.slots):
            saved.append((group, key, group[key]))
            value = self.current[i]
            if index < 0:
                group[key] = value
            else:
                items = list(group[key])
                items[index] = value
                group[key] = type(group[key])(items)
        try:
            yield
        finally:
            for group, key, value in reversed(saved):
                group[key] = value

    def count(self, skipped: torch.Tensor) -> None:
        """Count this step as applied unless ``skipped`` (a 0-d bool tensor; no sync)."""
        self.applied_steps.add_((~skipped.to(self.device, torch.bool)).long())

    def close(self, applied: int | None = None) -> int:
        """End the window: step the real schedulers once per applied step, open the next window.

        ``applied`` is the count of applied steps when the caller already read it; otherwise it is
        read here (one host read). Returns it.
        """
        applied = int(self.applied_steps.item()) if applied is None else int(applied)
        for scheduler in self.schedulers:
            _advance(scheduler, applied)
        self._open()
        return applied

    def reopen(self) -> None:
        """Open a new window from the schedulers' current state (after a rollback or a resume)."""
        self._open()
