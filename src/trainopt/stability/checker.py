"""The stabilizer's monitors behind one ``update`` per step (device) and one ``check`` per window (host)."""

from __future__ import annotations

import math
from typing import Any

import torch

from trainopt.stability.distributed import any_rank, max_over_ranks
from trainopt.stability.gradients import GradientMonitor
from trainopt.stability.monitors import LossStabilityMonitor

__all__ = ["StabilityChecker"]

# The numbers of a report that decide: each becomes its largest value over the ranks.
_REDUCED = (("loss", "nonfinite"), ("loss", "spikes"), ("loss", "max_z"), ("gradients", "nonfinite"),
            ("gradients", "explosions"), ("gradients", "max_grad_norm"), ("gradients", "param_norm"))


class StabilityChecker:
    """Loss and gradient monitors behind one ``update`` (device only) and one ``check`` (host).

    :meth:`update` returns a 0-d bool tensor per step: ``True`` when the loss is non-finite or
    spikes, or the gradient norm is non-finite or explodes. :meth:`check` reads the monitors and
    says whether the last window was stable, and why not.

    Ranks agree. When ``torch.distributed`` is initialised, :meth:`update` agrees the flags of
    every rank in ``process_group`` (default: the whole world) with one MAX all-reduce on the
    device, so a loss spike that one rank alone sees flags the step on every rank; and
    :meth:`check` reduces the window's numbers (counts, maxima, the parameter norm) to their
    largest value over the ranks before it decides. Every rank must call both.

    Args:
        model_or_optimizer: What the :class:`~trainopt.stability.gradients.GradientMonitor` measures (an
            optimizer gives per-group norms).
        loss_monitor: Defaults to ``LossStabilityMonitor(check_every=check_every)``.
        gradient_monitor: Defaults to ``GradientMonitor(model_or_optimizer, check_every=check_every)``.
        check_every: Steps between host reads.
        process_group: The ranks that agree (``None``: the default group when one is initialised).

    Example:
        >>> import torch
        >>> from trainopt.stability import StabilityChecker
        >>> model = torch.nn.Linear(4, 1)
        >>> checker = StabilityChecker(model, check_every=20)
        >>> for step in range(20):
        ...     model.zero_grad()
        ...     loss = model(torch.randn(8, 4)).pow(2).mean()
        ...     loss.backward()
        ...     flag = checker.update(loss)
        >>> report = checker.check()
        >>> report["is_stable"], report["flagged_steps"]
        (True, 0)
    """

    def __init__(
        self,
        model_or_optimizer: torch.nn.Module | torch.optim.Optimizer,
        loss_monitor: LossStabilityMonitor | None = None,
        gradient_monitor: GradientMonitor | None = None,
        check_every: int = 100,
        process_group: Any = None,
    ) -> None:
        self.loss_monitor = loss_monitor or LossStabilityMonitor(check_every=check_every)
        self.gradient_monitor = gradient_monitor or GradientMonitor(model_or_optimizer, check_every=check_every)
        self.check_every = check_every
        self.process_group = process_group
        self.flagged = torch.zeros((), dtype=torch.long)
        self.last_flag = torch.tensor(False)
        self.last_grad_norm = torch.tensor(math.nan)
        self.nonfinite_grads = torch.tensor(False)

    @torch.no_grad()
    def update(self, loss: torch.Tensor) -> torch.Tensor:
        """Fold this step's loss and gradients into the monitors; return the agreed "unstable" flag."""
        self.loss_monitor.update(loss)
        self.last_grad_norm = self.gradient_monitor.update()
        detector = self.loss_monitor.detector
        nonfinite = ~torch.isfinite(self.last_grad_norm)
        local = (detector.last_spike | detector.last_nonfinite | nonfinite
                 | self.gradient_monitor.last_explosion)
        self.last_flag, self.nonfinite_grads = any_rank(torch.stack([local, nonfinite]), self.process_group)
        if self.flagged.device != self.last_flag.device:
            self.flagged = self.flagged.to(self.last_flag.device)
        self.flagged.add_(self.last_flag.long())
        return self.last_flag

    def check(self) -> dict[str, Any]:
        """Read both monitors (host), reduce over ranks, start a new window; ``is_stable`` and why."""
        loss = self.loss_monitor.check()
        grads = self.gradient_monitor.check()
        flagged = int(self.flagged.item())
        self.flagged.zero_()
        reports = {"loss": loss, "gradients": grads}
        if not math.isfinite(grads["param_norm"]):
            grads["param_norm"] = math.inf  # NaN would lose the MAX reduction
        reduced = max_over_ranks([float(reports[a][b]) for a, b in _REDUCED], self.flagged.device, self.process_group)
        for (a, b), value in zip(_REDUCED, reduced):
            reports[a][b] = int(value) if isinstance(reports[a][b], int) else value
        reasons = []
        if loss["nonfinite"]:
            reasons.append(f"{loss['nonfinite']} non-finite losses")
        if loss["spikes"]:
            reasons.append(f"{loss['spikes']} loss spikes (max robust z {loss['max_z']:.1f})")
        if grads["nonfinite"]:
            reasons.append(f"{grads['nonfinite']} non-finite gradient norms")
        if grads["explosions"]:
            reasons.append(f"{grads['explosions']} gradient explosions (max norm {grads['max_grad_norm']:.3g})")
        return {
            "is_stable": not reasons,
            "reasons": reasons,
            "flagged_steps": flagged,
            "weights_finite": math.isfinite(grads["param_norm"]),
            "loss": loss,
            "gradients": grads,
        }

    def state_dict(self) -> dict[str, Any]:
        """Settings, counters and tensors: everything to resume (loads with ``weights_only=True``)."""
        return {"loss_monitor": self.loss_monitor.state_dict(),
                "gradient_monitor": self.gradient_monitor.state_dict(),
                "flagged": self.flagged.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        missing = [k for k in ("loss_monitor", "gradient_monitor", "flagged") if k not in state]
        if missing:
            raise KeyError(f"StabilityChecker state_dict is missing {missing}")
        self.gradient_monitor.load_state_dict(state["gradient_monitor"])
        self.loss_monitor.load_state_dict(state["loss_monitor"])
        self.flagged = state["flagged"].detach().clone().to(self.flagged.device)
