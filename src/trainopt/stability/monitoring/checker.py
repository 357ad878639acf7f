"""The stabilizer's monitors behind one ``update`` per step (device) and one ``check`` per window
(host)."""

from __future__ import annotations

import math
from typing import Any

import torch

from trainopt.stability.distributed import any_rank, in_process_group, max_over_ranks
from trainopt.stability.monitoring.gradients import GradientMonitor
from trainopt.stability.monitoring.loss import LossSpikeDetector, LossStabilityMonitor
from trainopt.stability.monitoring.statistics import nanmax, nanmedian, tail_score
from trainopt.validation import check_number

__all__ = ["StabilityChecker"]

# The numbers of a report that decide: each becomes its largest value over the ranks.
_RECENT = 10  # fewest recent losses whose median the divergence test reads
# How many times the reference's largest gradient norm a diverging run's median gradient norm
# exceeds.
GRAD_GROWTH = 2.0
# How many times below the reference's largest gradient norm a dead run's median gradient norm lies.
GRAD_COLLAPSE = 4.0

_REDUCED = (
    ("loss", "nonfinite"),
    ("loss", "spikes"),
    ("loss", "max_score"),
    ("loss", "diverging"),
    ("gradients", "nonfinite"),
    ("gradients", "explosions"),
    ("gradients", "max_grad_norm"),
    ("gradients", "param_norm"),
    ("gradients", "nonfinite_buffers"),
)


class StabilityChecker:
    """Loss and gradient monitors behind one ``update`` (device only) and one ``check`` (host).

    :meth:`update` returns a 0-d bool tensor per step: ``True`` when the loss is non-finite or
    spikes, or the gradient norm is non-finite or explodes. :meth:`check` reads the monitors and
    says whether the last window was stable, and why not. Two numbers in its report measure
    persistence, which a rollback needs and a single flagged step does not:

    - ``max_streak``, the longest run of consecutive flagged steps in the window;
    - ``loss["diverging"]``, 1 when the loss grows and the gradient norm leaves its range: the
      median of the recent losses lies above every loss of the window accepted at the last
      stable check (:attr:`reference`; before the first one, above the first ``min_history``
      losses of the run), *and* the median of the recent gradient norms lies more than
      ``grad_growth`` times above every gradient norm of that window (:attr:`grad_reference`),
      or more than ``GRAD_COLLAPSE`` (4) times below its largest. The recent values are
      the newer half of those since the last check, and at least the last ten. Each reference is
      the lower of the last two stable windows' largest values, so a window that saw the first
      steps of a divergence without being flagged does not raise the bar for the next one.

      A loss that rises alone is left alone: a KL or beta warm-up, a longer sequence, a new data
      mixture or a plateau raise the loss above an earlier window while the gradient norm stays
      in its range. A run that diverges (a learning rate far too high) grows both; or it dies:
      its loss climbs to chance while its gradient norm collapses (SGD at 30 times its rate).

    Ranks agree. When ``torch.distributed`` is initialised, :meth:`update` agrees the flags of
    every rank in ``process_group`` (default: the whole world) with one MAX all-reduce on the
    device, so a loss spike that one rank alone sees flags the step on every rank; and
    :meth:`check` reduces the window's numbers (counts, maxima, the parameter norm) to their
    largest value over the ranks before it decides. Every rank must call both.

    Args:
        model_or_optimizer: What the
            :class:`~trainopt.stability.monitoring.gradients.GradientMonitor` measures (an optimizer
            gives per-group norms).
        loss_monitor: Defaults to ``LossStabilityMonitor(check_every=check_every)``.
        gradient_monitor: Defaults to
            ``GradientMonitor(model_or_optimizer, check_every=check_every)``.
        check_every: Steps between host reads.
        grad_growth: How many times the reference window's largest gradient norm the recent median
            gradient norm must exceed, besides the loss exceeding the reference, for divergence.
        process_group: The ranks that agree (``None``: the default group when one is initialised).

    Example:
        >>> import torch
        >>> from trainopt.stability.monitoring.checker import StabilityChecker
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
        grad_growth: float = GRAD_GROWTH,
    ) -> None:
        check_number("grad_growth", grad_growth)
        self.grad_growth = float(grad_growth)
        self.loss_monitor = loss_monitor or LossStabilityMonitor(check_every=check_every)
        detector = self.loss_monitor.detector
        self.min_history = detector.min_history
        self.recent = torch.full((detector.window_size,), math.nan)
        self.first = torch.full((detector.min_history,), math.nan)
        self.recent_grads = torch.full((detector.window_size,), math.nan)
        self.first_grads = torch.full((detector.min_history,), math.nan)
        self.streak = torch.zeros((), dtype=torch.long)
        self.max_streak = torch.zeros((), dtype=torch.long)
        self.reference = math.nan  # host: the lower of the last two stable windows' largest losses
        self.last_window_max = math.nan
        self.grad_reference = math.nan  # host: the same for the largest gradient norms
        self.last_window_max_grad = math.nan
        self.steps = 0
        self.checked_at = 0
        self.gradient_monitor = gradient_monitor or GradientMonitor(
            model_or_optimizer, check_every=check_every
        )
        self.check_every = check_every
        self.process_group = process_group
        self.flagged = torch.zeros((), dtype=torch.long)
        self.last_flag = torch.tensor(False)
        self.last_grad_norm = torch.tensor(math.nan)
        self.nonfinite_grads = torch.tensor(False)
        self._joint: _JointStep | bool | None = None  # None: not decided yet

    @torch.no_grad()
    def update(self, loss: torch.Tensor) -> torch.Tensor:
        """Fold this step's loss and gradients into the monitors; return the agreed "unstable"
        flag."""
        grads = self.gradient_monitor
        detector = self.loss_monitor.detector
        if self._joint_fits(loss):
            return self._joint.update(self, loss)
        self.loss_monitor.update(loss)
        self.last_grad_norm = grads.update()
        nonfinite = grads.last_nonfinite
        local = detector.last_spike | detector.last_nonfinite | nonfinite | grads.last_explosion
        if in_process_group():
            self.last_flag, self.nonfinite_grads = any_rank(
                torch.stack([local, nonfinite]), self.process_group
            )
        else:  # nothing to agree on: no stack and unbind
            self.last_flag, self.nonfinite_grads = local, nonfinite
        device = self.last_flag.device
        if self.flagged.device != device:
            for key in self._tensors:
                setattr(self, key, getattr(self, key).to(device))
        self.flagged.add_(self.last_flag)
        self.streak = (self.streak + 1) * self.last_flag
        self.max_streak = torch.maximum(self.max_streak, self.streak)
        # the monitors' own finite-or-NaN values (a loss and a norm already made finite there)
        value = detector.last_value.to(device)
        norm = grads.last_value.to(device)
        self.recent[self.steps % self.recent.numel()] = value
        self.recent_grads[self.steps % self.recent_grads.numel()] = norm
        if self.steps < self.first.numel():
            self.first[self.steps] = value
            self.first_grads[self.steps] = norm
        self.steps += 1
        return self.last_flag

    def _joint_fits(self, loss: torch.Tensor) -> bool:
        """Whether both monitors can be updated together (:class:`_JointStep`): same windows and
        device."""
        if self._joint is None:
            detector, grads = self.loss_monitor.detector, self.gradient_monitor
            if not (
                type(self.loss_monitor) is LossStabilityMonitor
                and type(grads) is GradientMonitor
                and type(detector) is LossSpikeDetector
                and detector.window_size == grads.window_size == self.recent.numel()
                and detector.min_history == grads.min_history == self.first.numel()
            ):
                self._joint = False
                return False
            self._joint = _JointStep(self)
        if self._joint is False:
            return False
        return (
            loss.device == self.gradient_monitor.buffer.device
            and not in_process_group()
            and self.loss_monitor.detector.steps == self.gradient_monitor.steps == self.steps
        )

    def _recent_median(self, buffer: torch.Tensor) -> torch.Tensor:
        """Median of the newer half of the values since the last check (at least ten; else NaN)."""
        size = buffer.numel()
        count = min(max((self.steps - self.checked_at) // 2, _RECENT), size, self.steps)
        if count < min(_RECENT, size):
            return torch.full((), math.nan, device=buffer.device)
        index = torch.arange(self.steps - count, self.steps, device=buffer.device) % size
        return nanmedian(buffer[index])

    def check(self) -> dict[str, Any]:
        """Read both monitors (host), reduce over ranks, start a new window; ``is_stable`` and
        why."""
        recent = self._recent_median(self.recent)
        device = recent.device
        values = torch.stack(
            [
                recent,
                nanmax(self.first).to(device),
                self._recent_median(self.recent_grads),
                nanmax(self.first_grads).to(device),
                self.max_streak.to(device).float(),
            ]
        )
        recent_v, initial_v, recent_grad_v, initial_grad_v, max_streak = values.tolist()
        loss = self.loss_monitor.check()
        grads = self.gradient_monitor.check()
        flagged = int(self.flagged.item())
        self.flagged.zero_()
        self.max_streak.zero_()
        self.checked_at = self.steps
        limit = self.reference if math.isfinite(self.reference) else initial_v
        grad_limit = self.grad_reference if math.isfinite(self.grad_reference) else initial_grad_v
        loss["recent_median"], loss["reference"] = recent_v, limit
        grads["recent_median"], grads["reference"] = recent_grad_v, grad_limit
        loss_up = math.isfinite(recent_v) and math.isfinite(limit) and recent_v > limit
        grads_up = (
            math.isfinite(recent_grad_v)
            and math.isfinite(grad_limit)
            and recent_grad_v > self.grad_growth * grad_limit
        )
        # a dead run: the loss climbs back to chance while the gradients vanish (boundary reads
        # only)
        grads_down = (
            math.isfinite(recent_grad_v)
            and math.isfinite(grad_limit)
            and recent_grad_v * GRAD_COLLAPSE < grad_limit
        )
        loss["diverging"] = int(loss_up and (grads_up or grads_down))
        reports = {"loss": loss, "gradients": grads}
        if not math.isfinite(grads["param_norm"]):
            grads["param_norm"] = math.inf  # NaN would lose the MAX reduction
        reduced = max_over_ranks(
            [float(reports[a][b]) for a, b in _REDUCED], self.flagged.device, self.process_group
        )
        for (a, b), value in zip(_REDUCED, reduced):
            reports[a][b] = int(value) if isinstance(reports[a][b], int) else value
        reasons = []
        if loss["nonfinite"]:
            reasons.append(f"{loss['nonfinite']} non-finite losses")
        if loss["spikes"]:
            reasons.append(f"{loss['spikes']} loss spikes (max score {loss['max_score']:.1f})")
        if grads["nonfinite"]:
            reasons.append(f"{grads['nonfinite']} non-finite gradient norms")
        if grads["explosions"]:
            reasons.append(
                f"{grads['explosions']} gradient explosions (max norm {grads['max_grad_norm']:.3g})"
            )
        if loss["diverging"]:
            where = (
                f"above {self.grad_growth:g} times" if grads_up else f"below 1/{GRAD_COLLAPSE:g} of"
            )
            reasons.append(
                f"diverging (recent median loss {loss['recent_median']:.4g} above every accepted "
                f"loss of the reference window, max {loss['reference']:.4g}; recent median "
                f"gradient norm {grads['recent_median']:.4g} {where} "
                f"its largest, {grads['reference']:.4g})"
            )
        return {
            "is_stable": not reasons,
            "reasons": reasons,
            "flagged_steps": flagged,
            "max_streak": int(max_streak),
            # a NaN in BatchNorm's running statistics ruins the model as surely as one in a weight
            "weights_finite": math.isfinite(grads["param_norm"]) and not grads["nonfinite_buffers"],
            "loss": loss,
            "gradients": grads,
        }

    def state_dict(self) -> dict[str, Any]:
        """Settings, counters and tensors: everything to resume (loads with
        ``weights_only=True``)."""
        return {
            "loss_monitor": self.loss_monitor.state_dict(),
            "gradient_monitor": self.gradient_monitor.state_dict(),
            "reference": self.reference,
            "last_window_max": self.last_window_max,
            "steps": self.steps,
            "checked_at": self.checked_at,
            "grad_reference": self.grad_reference,
            "last_window_max_grad": self.last_window_max_grad,
            "grad_growth": self.grad_growth,
            **{k: getattr(self, k).detach().clone() for k in self._tensors},
        }

    _tensors = ("flagged", "streak", "max_streak", "recent", "first", "recent_grads", "first_grads")

    def accept(self, report: dict[str, Any]) -> None:
        """Take the window just checked as the reference of the divergence test (a stable check)."""
        largest = float(report["loss"].get("window_max", math.nan))
        if math.isfinite(largest):
            self.reference = (
                min(largest, self.last_window_max)
                if math.isfinite(self.last_window_max)
                else largest
            )
            self.last_window_max = largest
        largest = float(report["gradients"].get("max_grad_norm", math.nan))
        if math.isfinite(largest):
            last = self.last_window_max_grad
            self.grad_reference = min(largest, last) if math.isfinite(last) else largest
            self.last_window_max_grad = largest

    # what trainopt 0.4 did not save: the gradient norms' divergence reference starts empty
    _added = {
        "grad_reference": math.nan,
        "last_window_max_grad": math.nan,
        "grad_growth": None,
        "recent_grads": None,
        "first_grads": None,
    }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (or a trainopt 0.4 checker's state)."""
        missing = [
            k
            for k in (
                "loss_monitor",
                "gradient_monitor",
                "reference",
                "last_window_max",
                "steps",
                "checked_at",
                *self._tensors,
            )
            if k not in state and k not in self._added
        ]
        if missing:
            raise KeyError(f"StabilityChecker state_dict is missing {missing}")
        self.gradient_monitor.load_state_dict(state["gradient_monitor"])
        self.loss_monitor.load_state_dict(state["loss_monitor"])
        self.reference, self.last_window_max = (
            float(state["reference"]),
            float(state["last_window_max"]),
        )
        self.steps, self.checked_at = state["steps"], state["checked_at"]
        self.grad_reference = float(state.get("grad_reference", math.nan))
        self.last_window_max_grad = float(state.get("last_window_max_grad", math.nan))
        self.grad_growth = float(state.get("grad_growth", self.grad_growth))
        device = self.flagged.device
        for key in self._tensors:
            if key in state:
                setattr(self, key, state[key].detach().clone().to(device))
            else:
                getattr(self, key).fill_(math.nan)


class _JointStep:
    """Both monitors' step in one pass: the loss and the gradient norm side by side, one sort
    for both.

    :meth:`StabilityChecker.update` would run :meth:`LossStabilityMonitor.update
    <trainopt.stability.monitoring.loss.LossStabilityMonitor.update>`, :meth:`GradientMonitor.update
    <trainopt.stability.monitoring.gradients.GradientMonitor.update>` and its own bookkeeping, each
    on 0-d tensors: about 90 operators per step, which on a CPU cost more than the arithmetic. This
    does the same on pairs (loss, gradient norm), so the monitors end in bitwise the same state
    (a test runs both ways): the two windows are the rows of one tensor, scored in one sort by
    the one :func:`~trainopt.stability.monitoring.statistics.tail_score`, and the counters,
    maxima and flags that the monitors hold are views into a few shared tensors written in place.
    About 45 operators.

    The monitors keep their attributes (``detector.buffer`` is a row of :attr:`ring`, and so on)
    and read them at the boundary as before. Where one of them replaces a tensor (a new window,
    a loaded state), the next step finds the view gone and binds again, copying the values.
    """

    # (owner, attribute, shared tensor, index): the monitors' per-step state as views
    _COUNTS = (
        ("detector", "num_spikes"),
        ("loss", "window_spikes"),
        ("loss", "window_nonfinite"),
        ("grads", "window_explosions"),
        ("grads", "window_nonfinite"),
        ("checker", "flagged"),
    )
    # where each counter's increment sits in cat([over (2), nonfinite (2), flag (1)])
    _INCREMENTS = (0, 0, 2, 1, 3, 4)

    def __init__(self, checker: StabilityChecker) -> None:
        detector = checker.loss_monitor.detector
        self.spike_factor = detector.spike_factor
        self.explosion_factor = checker.gradient_monitor.explosion_factor
        self.views: list[tuple[Any, str, torch.Tensor]] = []

    def _owners(self, checker: StabilityChecker) -> dict[str, Any]:
        return {
            "detector": checker.loss_monitor.detector,
            "loss": checker.loss_monitor,
            "grads": checker.gradient_monitor,
            "checker": checker,
        }

    def bound(self) -> bool:
        """Whether every attribute still is the view this pass writes."""
        return bool(self.views) and all(
            getattr(owner, name) is view for owner, name, view in self.views
        )

    def bind(self, checker: StabilityChecker, device: torch.device) -> None:
        """Gather the monitors' per-step tensors into shared ones and give the monitors views of
        them."""
        owners = self._owners(checker)
        detector, grads, monitor = owners["detector"], owners["grads"], owners["loss"]
        detector._to(device)
        if monitor.window_spikes.device != device:
            monitor._reset_window(device)
        for key in checker._tensors:
            if getattr(checker, key).device != device:
                setattr(checker, key, getattr(checker, key).to(device))
        self.ring = torch.stack([detector.buffer, grads.buffer])
        self.recent = torch.stack([checker.recent, checker.recent_grads])
        self.counts = torch.stack([getattr(owners[o], n).to(device) for o, n in self._COUNTS])
        self.maxes = torch.stack(
            [monitor.window_max_z.to(device).float(), grads.window_max_grad_norm]
        )
        self.value = torch.full((2,), math.nan, device=device)
        self.nans = torch.full((2,), math.nan, device=device)
        self.zeros = torch.zeros(2, device=device)
        self.score = torch.stack(
            [detector.last_z.to(device).float(), torch.full((), math.nan, device=device)]
        )
        self.over = torch.stack([detector.last_spike.to(device), grads.last_explosion.to(device)])
        self.nonfinite = torch.stack(
            [
                detector.last_nonfinite.to(device),
                getattr(grads, "last_nonfinite", torch.tensor(False)).to(device),
            ]
        )
        self.factors = torch.tensor([self.spike_factor, self.explosion_factor], device=device)
        self.pick_score = torch.tensor(
            [True, False], device=device
        )  # maxima: the loss's score, the norm
        self.increments = torch.tensor(self._INCREMENTS, device=device)
        views = [
            (detector, "buffer", self.ring[0]),
            (grads, "buffer", self.ring[1]),
            (checker, "recent", self.recent[0]),
            (checker, "recent_grads", self.recent[1]),
            (monitor, "window_max_z", self.maxes[0]),
            (grads, "window_max_grad_norm", self.maxes[1]),
            (detector, "last_value", self.value[0]),
            (grads, "last_value", self.value[1]),
            (detector, "last_z", self.score[0]),
            (detector, "last_spike", self.over[0]),
            (grads, "last_explosion", self.over[1]),
            (detector, "last_nonfinite", self.nonfinite[0]),
            (grads, "last_nonfinite", self.nonfinite[1]),
            (checker, "nonfinite_grads", self.nonfinite[1]),
        ]
        views += [(owners[o], n, self.counts[i]) for i, (o, n) in enumerate(self._COUNTS)]
        for owner, name, view in views:
            setattr(owner, name, view)
        self.views = views

    @torch.no_grad()
    def update(self, checker: StabilityChecker, loss: torch.Tensor) -> torch.Tensor:
        """One step of both monitors and of the checker; the step's "unstable" flag (0-d bool)."""
        grads = checker.gradient_monitor
        monitor = checker.loss_monitor
        detector = monitor.detector
        device = loss.device
        if not self.bound():
            self.bind(checker, device)
        norm = grads.measure()
        checker.last_grad_norm = norm
        if loss.dtype != torch.float32 or loss.dim() != 0 or loss.requires_grad:
            loss = loss.detach().float().reshape(())
        monitor.last_loss = loss
        pair = torch.stack([loss, norm])
        # x + x * 0: x where finite, NaN where inf or NaN (inf * 0 is NaN), in one operator
        torch.addcmul(pair, pair, self.zeros, out=self.value)
        torch.ne(self.value, self.value, out=self.nonfinite)  # NaN != NaN
        steps, size = checker.steps, self.ring.shape[1]
        if steps >= detector.min_history:
            # both rows (the loss, the gradient norm) scored by the one tail score, one sort
            tail_score(self.value, self.ring[:, : min(steps, size)], out=self.score)
            torch.gt(self.score, self.factors, out=self.over)  # NaN compares False
        else:
            self.score.fill_(math.nan)
            self.over.zero_()
        flag = (self.over | self.nonfinite).any()
        torch.where(self.over, self.nans, self.value, out=self.ring[:, steps % size])
        self.recent[:, steps % size].copy_(self.value)
        if steps < checker.first.numel():
            checker.first[steps] = self.value[0]
            checker.first_grads[steps] = self.value[1]
        self.counts.add_(torch.cat([self.over, self.nonfinite, flag.view(1)])[self.increments])
        torch.fmax(self.maxes, torch.where(self.pick_score, self.score, self.value), out=self.maxes)
        checker.streak = (checker.streak + 1) * flag
        checker.max_streak = torch.maximum(checker.max_streak, checker.streak)
        checker.last_flag = flag
        detector.steps += 1
        grads.steps += 1
        checker.steps += 1
        return flag
