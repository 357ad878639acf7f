"""Dynamic loss scaling for fp16 training, with the :class:`torch.amp.GradScaler` interface.

:class:`DynamicLossScaler` is a drop-in for ``torch.amp.GradScaler`` built from the same
kernels (``torch._amp_foreach_non_finite_check_and_unscale_`` and ``torch._amp_update_scale_``),
so with the default ``hysteresis=1`` it produces the same scales and the same parameters, step
for step (the tests check this bit for bit). It has every public method of ``GradScaler``
(``scale``, ``unscale_``, ``step``, ``update``, ``get_scale``, ``is_enabled``, the getters and
setters of ``growth_factor``, ``backoff_factor`` and ``growth_interval``, ``state_dict``,
``load_state_dict``) and takes its arguments by name. Its ``state_dict`` holds GradScaler's
five keys with the same values, plus three of its own (``hysteresis``, ``_overflow_tracker``,
``skipped_steps``): a GradScaler state loads into it and its state loads into a GradScaler. It adds:

- ``hysteresis``: back off only after that many overflowing steps in a row (large fp16 runs use
  2 so that one odd batch does not halve the scale);
- ``skip_mode="mask"``: a way to skip an overflowing step *without* a host sync for optimizers
  that have no fused path (see :func:`masked_step`);
- on-device counters (:attr:`DynamicLossScaler.skipped_steps`) that monitors can read later;
- an exact skip of a fused optimizer's first step
  (:func:`~trainopt.stability.skipping.step.fused_step`): GradScaler leaves fused SGD's momentum
  buffer uninitialised when that step overflows.

Where the host syncs. ``GradScaler.step`` reads ``found_inf`` on the host (``.item()``) to decide
whether to call ``optimizer.step()``; so does this class with ``skip_mode="sync"`` (the default).
Two paths avoid it: optimizers with ``_step_supports_amp_scaling`` (``torch.optim.AdamW(...,
fused=True)``, fused Adam and SGD) receive ``grad_scale`` and ``found_inf`` tensors and skip
inside their kernel, and ``skip_mode="mask"`` steps unconditionally and restores the old values
where ``found_inf`` is set (no sync on CUDA when the optimizer's state lives on the GPU: SGD, or
``capturable=True``; see :func:`~trainopt.stability.skipping.step.masked_step`). ``get_scale()`` and
``state_dict()`` read the scale (a sync): call
them at logging or checkpoint time, not every step. bf16 needs no loss scaling at all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from enum import Enum
from typing import Any

import torch

from trainopt.stability.scaling.kernels import unscale_grads_, update_scale_with_hysteresis_
from trainopt.stability.skipping.optimizers import check_skippable, skips_in_kernel
from trainopt.stability.skipping.step import fused_step, masked_step
from trainopt.validation import check_int

__all__ = ["DynamicLossScaler"]


class _Stage(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state() -> dict[str, Any]:
    return {"stage": _Stage.READY, "found_inf_per_device": {}}


class DynamicLossScaler:
    """Scale the loss up so fp16 gradients do not underflow; skip steps whose gradients overflow.

    The rule (GradScaler's, with hysteresis): after each step,

    - if any gradient was inf/NaN in ``hysteresis`` consecutive steps, ``scale *= backoff_factor``
      (once armed, every further overflow in the same run backs off again);
    - after ``growth_interval`` consecutive clean steps, ``scale *= growth_factor`` (only if the
      result is finite), and the count restarts;
    - an overflowing step is never applied to the weights.

    Args:
        init_scale: Starting scale.
        growth_factor: Multiplier after ``growth_interval`` clean steps (> 1).
        backoff_factor: Multiplier after an overflow (in (0, 1)).
        growth_interval: Clean steps in a row needed to grow.
        hysteresis: Overflowing steps in a row needed to back off (1 = GradScaler).
        enabled: ``False`` makes every method a pass-through (bf16/fp32 runs).
        skip_mode: ``"sync"`` reads ``found_inf`` on the host as GradScaler does; ``"mask"``
            skips with :func:`masked_step`, no sync, and refuses at the first step what
            :func:`~trainopt.stability.skipping.optimizers.check_skippable` refuses. Fused
            optimizers never sync either way.
        device: GradScaler's first argument, accepted by name: the scale is created on the
            device of the first loss it scales; before that, :meth:`get_scale_tensor` is on it.

    Example:
        >>> import torch
        >>> from trainopt.stability import DynamicLossScaler
        >>> model = torch.nn.Linear(3, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> scaler = DynamicLossScaler(init_scale=2.0**16, growth_interval=2)
        >>> for loss_factor in [1.0, 1.0, float("inf")]:
        ...     opt.zero_grad()
        ...     loss = model(torch.ones(4, 3)).sum() * loss_factor
        ...     scaler.scale(loss).backward()
        ...     scaler.step(opt)
        ...     scaler.update()
        >>> scaler.get_scale()   # grew once after 2 clean steps, halved on the overflow
        65536.0
        >>> int(scaler.skipped_steps)
        1
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        hysteresis: int = 1,
        enabled: bool = True,
        skip_mode: str = "sync",
        device: str | torch.device | None = None,
    ) -> None:
        if not float(init_scale) > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale=}")
        if not float(growth_factor) > 1.0:
            raise ValueError(f"growth_factor must be > 1.0, got {growth_factor=}")
        if not 0.0 < float(backoff_factor) < 1.0:
            raise ValueError(f"backoff_factor must be in (0, 1), got {backoff_factor=}")
        check_int("growth_interval", growth_interval, 1)
        check_int("hysteresis", hysteresis, 1)
        if skip_mode not in ("sync", "mask"):
            raise ValueError(f"skip_mode must be 'sync' or 'mask', got {skip_mode=}")
        self._enabled = bool(enabled)
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._hysteresis = hysteresis
        self.skip_mode = skip_mode
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._init_growth_tracker = 0
        self._init_overflow_tracker = 0
        self._scale: torch.Tensor | None = None
        self._growth_tracker: torch.Tensor | None = None
        self._overflow_tracker: torch.Tensor | None = None
        #: Steps skipped for non-finite gradients since construction (on-device counter).
        self.skipped_steps = torch.zeros((), dtype=torch.int64)
        #: ``found_inf`` of the last :meth:`update` (on device; > 0 means that step was skipped).
        self.last_found_inf = torch.zeros(())
        self._per_optimizer: dict[int, dict[str, Any]] = defaultdict(_fresh_state)
        self._skippable: set[int] = set()

    # ------------------------------------------------------------------ scaling and unscaling

    def _lazy_init(self, device: torch.device) -> None:
        self._scale = torch.full((), self._init_scale, dtype=torch.float32, device=device)
        self._growth_tracker = torch.full(
            (), self._init_growth_tracker, dtype=torch.int32, device=device
        )
        self._overflow_tracker = torch.full(
            (), self._init_overflow_tracker, dtype=torch.int32, device=device
        )
        self.skipped_steps = self.skipped_steps.to(device)
        self.last_found_inf = self.last_found_inf.to(device)

    def _require_scale(self, where: str) -> torch.Tensor:
        if self._scale is None:
            raise RuntimeError(f"{where}() called before scale(loss): scale the loss first")
        return self._scale

    def scale(self, outputs: torch.Tensor | Iterable[Any]) -> Any:
        """Multiply a tensor (or a nested list/tuple of tensors) by the current scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, torch.Tensor):
            if self._scale is None:
                self._lazy_init(outputs.device)
            return outputs * self._scale.to(device=outputs.device, non_blocking=True)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        if isinstance(outputs, Iterable):
            return map(self.scale, outputs)
        raise TypeError(
            f"outputs must be a Tensor or an iterable of Tensors, got {type(outputs).__name__}"
        )

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the optimizer's gradients by the scale in place and record inf/NaN (no sync).

        Call it before clipping or inspecting gradients; at most once per optimizer per step.
        """
        if not self._enabled:
            return
        scale = self._require_scale("unscale_")
        state = self._per_optimizer[id(optimizer)]
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update()"
            )
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step()")
        inv_scale = scale.double().reciprocal().float()  # as GradScaler: reciprocal in fp64
        found_inf = torch.zeros((), dtype=torch.float32, device=scale.device)
        state["found_inf_per_device"] = unscale_grads_(optimizer, inv_scale, found_inf, False)
        state["stage"] = _Stage.UNSCALED

    def found_inf(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """Non-zero when the optimizer's gradients had an inf/NaN this step (tensor, no sync).

        Valid after :meth:`unscale_` or :meth:`step` and before :meth:`update`.
        """
        scale = self._require_scale("found_inf")
        per_device = self._per_optimizer[id(optimizer)]["found_inf_per_device"]
        total = torch.zeros((), dtype=torch.float32, device=scale.device)
        for value in per_device.values():
            total = total + value.to(scale.device, non_blocking=True)
        return total

    # ------------------------------------------------------------------ stepping

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> float | None:
        """Unscale (if not done yet) and step the optimizer unless a gradient is inf/NaN.

        Returns what ``optimizer.step`` returned, or ``None`` for a skipped step in
        ``skip_mode="sync"``. Closures are not supported (as in GradScaler).
        """
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not supported with loss scaling")
        scale = self._require_scale("step")
        state = self._per_optimizer[id(optimizer)]
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update()")

        if skips_in_kernel(optimizer):
            # Fused optimizers unscale and skip inside their kernel: no sync (GradScaler's path,
            # plus fused_step's reset of state that a skipped first step creates).
            grad_scale = None
            if state["stage"] is _Stage.READY:
                found = torch.zeros((), dtype=torch.float32, device=scale.device)
                one = torch.ones((), dtype=torch.float32, device=scale.device)
                # check only (inv_scale = 1): the fused kernel divides by grad_scale itself
                state["found_inf_per_device"] = unscale_grads_(optimizer, one, found, True)
                grad_scale = scale * getattr(optimizer, "grad_scale", 1)
            result = fused_step(
                optimizer, self.found_inf(optimizer), *args, grad_scale=grad_scale, **kwargs
            )
            state["stage"] = _Stage.STEPPED
            return result

        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        if not state["found_inf_per_device"]:
            raise RuntimeError("no gradients were found for this optimizer: nothing to check")
        if self.skip_mode == "mask":
            if id(optimizer) not in self._skippable:
                check_skippable(optimizer)  # what masking cannot skip exactly is refused, once
                self._skippable.add(id(optimizer))
            result = masked_step(optimizer, self.found_inf(optimizer), *args, **kwargs)
        elif not sum(
            v.item() for v in state["found_inf_per_device"].values()
        ):  # the GradScaler sync
            result = optimizer.step(*args, **kwargs)
        else:
            result = None
        state["stage"] = _Stage.STEPPED
        return result

    # ------------------------------------------------------------------ updating the scale

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Grow or back off the scale from this step's ``found_inf`` (no sync); or set it.

        Call once per iteration, after :meth:`step` for every optimizer.
        """
        if not self._enabled:
            return
        scale = self._require_scale("update")
        assert self._growth_tracker is not None and self._overflow_tracker is not None
        if new_scale is not None:
            if isinstance(new_scale, torch.Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise ValueError("new_scale must be a float or a 1-element tensor without grad")
                scale.copy_(new_scale.reshape(()))
            else:
                scale.fill_(float(new_scale))
        else:
            found = [
                v.to(scale.device, non_blocking=True)
                for st in self._per_optimizer.values()
                for v in st["found_inf_per_device"].values()
            ]
            if not found:
                raise RuntimeError("update() called without step(): no inf checks were recorded")
            found_inf = found[0]
            for extra in found[1:]:
                found_inf = found_inf + extra
            if self._hysteresis == 1:
                torch._amp_update_scale_(
                    scale,
                    self._growth_tracker,
                    found_inf,
                    self._growth_factor,
                    self._backoff_factor,
                    self._growth_interval,
                )
            else:
                update_scale_with_hysteresis_(
                    scale,
                    self._growth_tracker,
                    self._overflow_tracker,
                    found_inf,
                    self._growth_factor,
                    self._backoff_factor,
                    self._growth_interval,
                    self._hysteresis,
                )
            self.skipped_steps.add_((found_inf > 0).to(self.skipped_steps.dtype))
            self.last_found_inf = found_inf
        self._per_optimizer = defaultdict(_fresh_state)

    # ------------------------------------------------------------------ reading and saving

    def get_scale(self) -> float:
        """The current scale as a float (reads the device: a sync). 1.0 when disabled."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale.item())

    def get_scale_tensor(self) -> torch.Tensor:
        """The current scale as a 0-d tensor on the loss's device (no sync)."""
        if not self._enabled:
            return torch.ones(())
        return (
            torch.tensor(self._init_scale, device=self._device)
            if self._scale is None
            else self._scale
        )

    def is_enabled(self) -> bool:
        """Whether scaling is on."""
        return self._enabled

    def get_growth_factor(self) -> float:
        """Multiplier of the scale after ``growth_interval`` clean steps."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set the growth factor (> 1)."""
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        """Multiplier of the scale after an overflow."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set the backoff factor (in (0, 1))."""
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        """Clean steps needed before the scale grows."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set the number of clean steps needed before the scale grows."""
        self._growth_interval = int(new_interval)

    @property
    def hysteresis(self) -> int:
        """Overflowing steps in a row needed before the scale backs off."""
        return self._hysteresis

    def state_dict(self) -> dict[str, Any]:
        """GradScaler's keys (floats/ints) plus ``hysteresis`` and ``_overflow_tracker``.

        Reads the device (a sync): call it at checkpoint time, after :meth:`update`. Empty when
        disabled, like GradScaler.
        """
        if not self._enabled:
            return {}

        def read(t: torch.Tensor | None, default: int) -> int:
            return default if t is None else int(t.item())

        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": read(self._growth_tracker, self._init_growth_tracker),
            "hysteresis": self._hysteresis,
            "_overflow_tracker": read(self._overflow_tracker, self._init_overflow_tracker),
            "skipped_steps": int(self.skipped_steps.item()),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state from :meth:`state_dict` or from ``torch.amp.GradScaler.state_dict()``."""
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError(
                "the scaler state_dict is empty: it was saved from a disabled scaler"
            )
        missing = [
            k
            for k in (
                "scale",
                "growth_factor",
                "backoff_factor",
                "growth_interval",
                "_growth_tracker",
            )
            if k not in state_dict
        ]
        if missing:
            raise KeyError(f"scaler state_dict is missing {missing}")
        self._init_scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        self._hysteresis = int(state_dict.get("hysteresis", self._hysteresis))
        self._init_overflow_tracker = int(state_dict.get("_overflow_tracker", 0))
        self.skipped_steps.fill_(int(state_dict.get("skipped_steps", 0)))
        if self._scale is not None:
            assert self._growth_tracker is not None and self._overflow_tracker is not None
            self._scale.fill_(self._init_scale)
            self._growth_tracker.fill_(self._init_growth_tracker)
            self._overflow_tracker.fill_(self._init_overflow_tracker)
