"""A skipped step consumes no schedule position, and the rates cost no host read.

A learning-rate scheduler counts calls to ``step()``, and knowing whether an optimizer step was
skipped needs the host. :class:`ScheduleWindow` removes the need. At each boundary (every
``check_every`` steps) the host steps the scheduler ahead ``length`` times on a saved copy of its
state and records every hyperparameter it changes (the learning rate, and the momentum or
``betas`` that ``OneCycleLR`` and ``CyclicLR`` cycle): row ``j`` of the table is what the ``j``-th
applied step of the window uses. During the window a device counter ``a`` counts the steps
applied so far, so a skipped step leaves ``a``, and the rate, where they were. At the next
boundary the host reads the count once and steps the real scheduler that many times.

How the optimizer receives row ``a`` depends on what its step can take without reading the host:

- **Rescaled** (the default and ``foreach=True`` forms of SGD, Adam, AdamW, Adamax, NAdam, RAdam,
  RMSprop, Adadelta, Adagrad and Muon): their update is linear in the learning rate, so the step
  runs with a Python float, the window's largest rate ``r``, and
  :func:`~trainopt.stability.skipping.step.masked_step` scales the change of each parameter by
  ``lr[a] / r`` on the device. torch handed a tensor rate would read it on the host once per
  parameter (``param.add_(grad, alpha=-lr)``), or drop ``foreach`` for the slow single-tensor
  path.
- **On the device** (``fused=True`` for the learning rate; ``capturable=True`` for every value;
  the other optimizers' learning rate): a 0-d tensor holding row ``a``, which these kernels read
  on the device.
- **At the host's position** (momentum and ``betas`` of the forms that read them on the host,
  and Adafactor's rate, which it compares on the host):
  the Python float of row ``k``, where ``k`` counts the window's steps, skipped ones included.
  Until the window's first skip this is row ``a``; after ``s`` skips it is ``s`` rows ahead, until
  the next boundary sets it right. Exact on every step: ``capturable=True``, or ``check_every=1``.

The guarantee: the learning rate of every applied step is the one the scheduler gives at the
count of applied steps, as in a plain loop that never saw the skipped batches, to float32
rounding (the rescaled change, the rate rounded to float32). It holds for every scheduler stepped
once per step with no argument, at any ``check_every``. Where nothing changes within a window (no
scheduler, a constant one, ``check_every=1``) the optimizer keeps its Python floats and runs
exactly as without the window.

Between steps each changing value of ``param_groups`` (and the scheduler's ``get_last_lr()``)
holds, as a Python float, the value at the host's position: the rate the last step used until
the window's first skipped step, one row ahead per skip after it, until the boundary. Logging
callbacks that read them (Lightning's ``LearningRateMonitor``, the ``Trainer``'s
``learning_rate``, which transformers reads after every step) log the schedule as it runs, with
no host read. :meth:`ScheduleWindow.applied_rates` gives the exact rates as device tensors.
:meth:`ScheduleWindow.check` refuses, when the stabilizer is built, what torch itself cannot
take: a tensor rate given by the user (the look-ahead fills it in place), and ``foreach=True``
without ``capturable`` for an optimizer whose update is not linear in the rate (``ASGD``,
``Rprop``).
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["LINEAR_IN_LR", "ScheduleWindow", "UnsupportedScheduleError"]

# torch.optim classes whose change of the parameters is the learning rate times a quantity the
# rate does not enter (decoupled weight decay included: p - lr * (wd * p + u)), and whose state
# never depends on the rate. Exact classes only: a subclass may compute its step otherwise.
LINEAR_IN_LR: tuple[type, ...] = tuple(
    cls
    for cls in (
        getattr(torch.optim, name, None)
        for name in (
            "SGD",
            "Adam",
            "AdamW",
            "Adamax",
            "NAdam",
            "RAdam",
            "RMSprop",
            "Adadelta",
            "Adagrad",
            "Muon",
        )
    )
    if cls is not None
)

# Optimizers that compare the rate on the host (Adafactor: ``min(lr, 1 / sqrt(step))``): they get
# the rate at the host's position, like a cycled momentum.
HOST_LR: tuple[type, ...] = tuple(
    cls for cls in (getattr(torch.optim, "Adafactor", None),) if cls is not None
)


class UnsupportedScheduleError(ValueError):
    """An optimizer that cannot take a value its scheduler changes without a host read.

    Example:
        >>> import torch
        >>> from trainopt.stability.skipping.schedule import (
        ...     ScheduleWindow, UnsupportedScheduleError)
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> opt = torch.optim.ASGD([w], lr=0.1, foreach=True)
        >>> sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
        >>> try:
        ...     ScheduleWindow([(opt, sched)], length=4).check()
        ... except UnsupportedScheduleError as error:
        ...     print(str(error).split(":")[0])
        ASGD(foreach=True) cannot take the rates of ExponentialLR on the device
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


def _mode(optimizer: torch.optim.Optimizer, group: dict[str, Any], key: str) -> str:
    """How ``optimizer`` receives a changing ``group[key]``: rescale, device or host."""
    if group.get("capturable"):
        return "device"
    if key == "lr":
        if group.get("fused"):
            return "device"
        if type(optimizer) in LINEAR_IN_LR:
            return "rescale"
        return "host" if type(optimizer) in HOST_LR else "device"
    return "host"


def _set(group: dict[str, Any], key: str, index: int, value: Any) -> None:
    if index < 0:
        group[key] = value
    else:
        items = list(group[key])
        items[index] = value
        group[key] = type(group[key])(items)


class ScheduleWindow:
    """The hyperparameters of the next ``length`` applied steps, selected by a device counter.

    Args:
        pairs: ``(optimizer, scheduler)`` pairs; a ``None`` scheduler keeps its optimizer's values.
        length: Steps per window (the stabilizer's ``check_every``).

    Example:
        >>> import torch
        >>> from trainopt.stability.skipping.schedule import ScheduleWindow
        >>> w = torch.nn.Parameter(torch.zeros(1))
        >>> opt = torch.optim.SGD([w], lr=1.0)
        >>> sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)
        >>> window = ScheduleWindow([(opt, sched)], length=3)
        >>> used = []
        >>> for skip in (False, True, False):  # the second step is skipped
        ...     with window.applied() as ratios:  # SGD steps at the window's largest rate, 1.0
        ...         used.append(float(ratios[id(opt.param_groups[0])]))  # times this ratio
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
        self.position = 0  # host: steps of this window, skipped ones included
        self._open()

    def _open(self) -> None:
        """Simulate the window's rows on copies of the schedulers' states; keep what changes."""
        self.slots: list[tuple[dict[str, Any], str, int, str]] = []
        self.base: list[tuple[dict[str, Any], str, Any]] = []
        rows: list[list[float]] = []
        for optimizer, scheduler in self.pairs:
            if scheduler is None:
                continue
            before = [_values(g) for g in optimizer.param_groups]
            state, groups = (
                copy.deepcopy(scheduler.state_dict()),
                [dict(g) for g in optimizer.param_groups],
            )
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
                for (key, index), first in before[g].items():
                    column = [row[g].get((key, index), first) for row in table]
                    if any(v != first for v in column):
                        self.slots.append((group, key, index, _mode(optimizer, group, key)))
                        rows.append(column)
                        if all(b[0] is not group or b[1] != key for b in self.base):
                            self.base.append((group, key, group[key]))
        self.schedulers = [s for _, s in self.pairs if s is not None]
        self.last_lrs = [
            (s, list(s._last_lr))
            for _, s in self.pairs
            if s is not None and isinstance(getattr(s, "_last_lr", None), list)
        ]
        self.host_rows = [list(row) for row in zip(*rows)] if rows else []
        if rows:
            table = torch.tensor(rows, dtype=torch.float32, device=self.device).T.contiguous()
            # rescaled slots hold lr / r, r the column's largest rate (> 0: the column changes)
            self.references = [
                max(abs(v) for v in column) if mode == "rescale" else 1.0
                for column, (_, _, _, mode) in zip(rows, self.slots)
            ]
            self.table = table / torch.tensor(
                self.references, dtype=torch.float32, device=self.device
            )
            self.current = self.table[0].clone()
        self.applied_steps.zero_()
        self.position = 0

    def check(self) -> None:
        """Refuse a value the optimizer cannot take without a host read, or a tensor rate it was
        given."""
        for optimizer, scheduler in self.pairs:
            name = type(optimizer).__name__
            for index, group in enumerate(optimizer.param_groups):
                tensors = [k for k, v in group.items() if k != "params" and torch.is_tensor(v)]
                if tensors and scheduler is not None:
                    raise UnsupportedScheduleError(
                        f"{name}.param_groups[{index}][{tensors[0]!r}] is a tensor: the schedule "
                        f"window fills the rates itself, on the device; pass {tensors[0]} as a "
                        "Python float"
                    )
            modes = {
                mode
                for group, _, _, mode in self.slots
                if any(group is g for g in optimizer.param_groups)
            }
            defaults = optimizer.defaults
            if (
                "device" in modes
                and defaults.get("foreach")
                and not defaults.get("capturable")
                and not defaults.get("fused")
            ):
                raise UnsupportedScheduleError(
                    f"{name}(foreach=True) cannot take the rates of {type(scheduler).__name__} "
                    "on the device: its update is not linear in the rate and torch's foreach path "
                    "takes no tensor rate without capturable=True. Use foreach=False or "
                    "capturable=True, or check_every=1"
                )

    def _row(self, values: torch.Tensor) -> None:
        """Set every changing value of the groups from ``values`` (device) and the host position."""
        host = self.host_rows[min(self.position, self.length - 1)]
        for i, (group, key, index, mode) in enumerate(self.slots):
            if mode == "rescale":
                _set(group, key, index, self.references[i])
            elif mode == "device":
                _set(group, key, index, values[i])
            else:
                _set(group, key, index, host[i])

    @contextlib.contextmanager
    def applied(self) -> Iterator[dict[int, torch.Tensor]]:
        """Within: every changing value is the window's row at the applied count (see the module
        notes).

        Yields ``{id(param_group): ratio}`` for the rescaled groups:
        :func:`~trainopt.stability.skipping.step.masked_step` multiplies each parameter's change by
        its group's ratio.
        """
        if not self.slots:
            yield {}
            return
        self.current.copy_(self.table.index_select(0, self.applied_steps.view(1)).view(-1))
        self._row(self.current)
        ratios = {
            id(group): self.current[i]
            for i, (group, key, _, mode) in enumerate(self.slots)
            if mode == "rescale" and key == "lr"
        }
        try:
            yield ratios
        finally:
            self._publish()

    def _publish(self) -> None:
        """Leave in each group, as a Python float, the value at the host's position (no host
        read)."""
        if not self.slots:
            return
        host = self.host_rows[min(self.position, self.length - 1)]
        for i, (group, key, index, _) in enumerate(self.slots):
            _set(group, key, index, host[i])
        for optimizer, scheduler in self.pairs:
            if scheduler is not None and hasattr(scheduler, "_last_lr"):
                scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]

    def restore(self) -> None:
        """Put the boundary's Python floats back into the groups (before a scheduler step or a
        save)."""
        for group, key, value in self.base:
            group[key] = value
        for scheduler, last in self.last_lrs:
            scheduler._last_lr = last

    def applied_rates(self) -> list[list[Any]]:
        """The learning rate the last step used, per optimizer and group: exact, on the device.

        A 0-d device tensor where the rate changes within the window (``float()`` of it is a host
        read), the Python float elsewhere. ``param_groups`` hold the rate at the host's position
        (see the module notes), which is this one until the window's first skipped step.
        """
        used = (
            self.current * torch.tensor(self.references, dtype=torch.float32, device=self.device)
            if self.slots
            else None
        )
        rates = [[group["lr"] for group in optimizer.param_groups] for optimizer, _ in self.pairs]
        for i, (group, key, index, _) in enumerate(self.slots):
            if key == "lr" and index < 0:
                for o, (optimizer, _) in enumerate(self.pairs):
                    for g, candidate in enumerate(optimizer.param_groups):
                        if candidate is group:
                            rates[o][g] = used[i]
        return rates

    def count(self, skipped: torch.Tensor) -> None:
        """Count this step as applied unless ``skipped`` (a 0-d bool tensor; no sync)."""
        self.applied_steps.add_(~skipped.to(self.device, torch.bool))
        self.position += 1

    def close(self, applied: int | None = None) -> int:
        """End the window: step the real schedulers once per applied step, open the next window.

        ``applied`` is the count of applied steps when the caller already read it; otherwise it is
        read here (one host read). Returns it.
        """
        applied = int(self.applied_steps.item()) if applied is None else int(applied)
        self.restore()
        for scheduler in self.schedulers:
            _advance(scheduler, applied)
        self._open()
        return applied

    def reopen(self) -> None:
        """Open a new window from the schedulers' current state (after a rollback or a resume)."""
        self.restore()
        self._open()
