"""One name for a numeric precision: ``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp16"``.

:meth:`Precision.from_name` turns the name and a device into everything a training step needs:

- an autocast context (``torch.autocast`` for ``bf16`` and ``fp16``, disabled otherwise),
- the float32 matmul setting (``"highest"`` keeps true fp32; ``"high"`` lets CUDA use TF32),
  applied and restored by :meth:`Precision.matmul_settings`,
- a loss scaler only for ``fp16``, whose five exponent bits underflow small gradients
  (:class:`trainopt.stability.scaling.scaler.DynamicLossScaler` by default,
  ``torch.amp.GradScaler`` with
  ``scaler="torch"``: the same interface); ``bf16`` has fp32's exponent range and needs none.

It checks the hardware first and says what is allowed when the choice can't run:
``bf16`` runs on a CPU and on CUDA GPUs with native bf16 (:func:`native_bf16_supported`); ``fp16``
and ``tf32`` need CUDA (TF32 needs compute capability 8.0, Ampere, or newer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from trainopt.config.precisions import AUTOCAST_DTYPES, PRECISIONS

SCALERS: tuple[str, ...] = ("trainopt", "torch")


class PrecisionNotSupportedError(RuntimeError):
    """The chosen precision can't run on the chosen device.

    A ``RuntimeError``; its message names the precisions the device allows.

    Example:
        >>> from trainopt.perf import Precision
        >>> from trainopt.perf import PrecisionNotSupportedError
        >>> try:
        ...     Precision.from_name("tf32", "cpu")
        ... except PrecisionNotSupportedError as err:
        ...     print(isinstance(err, RuntimeError), err)
        True precision 'tf32' needs a CUDA GPU, got device 'cpu'; on 'cpu' use one of
            ['fp32', 'bf16']
    """


@dataclass(frozen=True)
class MatmulSettings:
    """The process-wide float32 matmul settings that decide whether TF32 is used.

    Attributes:
        float32_matmul_precision: ``torch.get_float32_matmul_precision()``: ``"highest"``
            (true fp32), ``"high"`` (TF32 on CUDA) or ``"medium"``.
        cudnn_allow_tf32: ``torch.backends.cudnn.allow_tf32`` (convolutions).

    Example:
        >>> import torch
        >>> from trainopt.perf import MatmulSettings
        >>> before = MatmulSettings.current()
        >>> MatmulSettings("high", True).apply()
        >>> torch.get_float32_matmul_precision()
        'high'
        >>> before.apply()
        >>> MatmulSettings.current() == before
        True
    """

    float32_matmul_precision: str
    cudnn_allow_tf32: bool

    @classmethod
    def current(cls) -> MatmulSettings:
        """Read the settings now in force."""
        return cls(torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)

    def apply(self) -> None:
        """Make these the settings in force."""
        torch.set_float32_matmul_precision(self.float32_matmul_precision)
        torch.backends.cudnn.allow_tf32 = self.cudnn_allow_tf32


def check_supported(name: str, device: str | torch.device = "cpu") -> None:
    """Raise if precision ``name`` can't run on ``device``; return ``None`` if it can.

    Raises:
        ValueError: ``name`` is not one of :data:`PRECISIONS`.
        PrecisionNotSupportedError: the device can't run it; the message names the choice,
            the device and the precisions the device allows.

    Example:
        >>> from trainopt.perf import PrecisionNotSupportedError
        >>> from trainopt.perf import check_supported
        >>> check_supported("bf16", "cpu")  # bf16 autocast runs on a CPU
        >>> try:
        ...     check_supported("fp16", "cpu")
        ... except PrecisionNotSupportedError as err:
        ...     print(err)
        precision 'fp16' needs a CUDA GPU, got device 'cpu'; on 'cpu' use one of ['fp32', 'bf16']
    """
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {name!r}")
    device = torch.device(device)
    reason = _unsupported_reason(name, device)
    if reason is not None:
        allowed = supported_precisions(device)
        raise PrecisionNotSupportedError(
            f"precision {name!r} {reason}, got device {str(device)!r}; "
            f"on {str(device)!r} use one of {allowed}"
        )


def supported_precisions(device: str | torch.device = "cpu") -> list[str]:
    """The precisions that can run on ``device``, in the order of :data:`PRECISIONS`.

    Example:
        >>> from trainopt.perf import supported_precisions
        >>> supported_precisions("cpu")
        ['fp32', 'bf16']
    """
    device = torch.device(device)
    return [name for name in PRECISIONS if _unsupported_reason(name, device) is None]


def _unsupported_reason(name: str, device: torch.device) -> str | None:
    if name == "fp32":
        return None
    if device.type != "cuda":
        if name == "bf16" and _autocast_available(device.type):
            return None
        return "needs a CUDA GPU"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU, and torch.cuda.is_available() is False"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if name == "tf32" and torch.cuda.get_device_capability(index) < (8, 0):
        return "needs a CUDA GPU of compute capability 8.0 (Ampere) or newer"
    if name == "bf16" and not native_bf16_supported(index):
        return "needs a CUDA GPU with native bf16 (compute capability 8.0, Ampere, or newer)"
    return None


def make_scaler(
    kind: str, device_type: str, init_scale: float = 2.0**16, growth_interval: int = 2000
) -> Any:
    """A dynamic loss scaler: ``"trainopt"``
    (:class:`~trainopt.stability.scaling.scaler.DynamicLossScaler`)
    or ``"torch"`` (``torch.amp.GradScaler``); both have GradScaler's interface.

    Example:
        >>> from trainopt.perf import make_scaler
        >>> make_scaler("torch", "cpu", init_scale=8.0).get_scale()
        8.0
        >>> type(make_scaler("trainopt", "cpu")).__name__
        'DynamicLossScaler'
    """
    if kind not in SCALERS:
        raise ValueError(f"scaler must be one of {list(SCALERS)}, got {kind!r}")
    if kind == "torch":
        return torch.amp.GradScaler(
            device_type, init_scale=init_scale, growth_interval=growth_interval
        )
    from trainopt.stability.scaling.scaler import DynamicLossScaler

    return DynamicLossScaler(init_scale=init_scale, growth_interval=growth_interval)


def _autocast_available(device_type: str) -> bool:
    is_available = getattr(torch.amp, "is_autocast_available", None)
    return device_type == "cpu" if is_available is None else bool(is_available(device_type))


def native_bf16_supported(device: int | str | torch.device | None = None) -> bool:
    """Whether a CUDA GPU runs bf16 natively (compute capability 8.0, Ampere, or newer).

    ``torch.cuda.is_bf16_supported()`` also counts emulation by default, so it says ``True`` on
    a V100 or a T4, where bf16 matmuls run through fp32 units, slower than fp16. This asks for
    the native kind (``including_emulation=False``); torch versions without that argument
    reported the native kind already. ``False`` where CUDA is not available.

    Example:
        >>> import torch
        >>> from trainopt.perf import native_bf16_supported
        >>> native_bf16_supported() == (torch.cuda.is_available()
        ...                             and torch.cuda.get_device_capability() >= (8, 0))
        True
    """
    if not torch.cuda.is_available():
        return False
    if device is not None:
        with torch.cuda.device(device):
            return native_bf16_supported()
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:
        return torch.cuda.is_bf16_supported()


@dataclass
class Precision:
    """A numeric precision bound to a device: autocast, matmul settings and loss scaler.

    Build it with :meth:`from_name`. A training step then runs the forward pass inside
    ``precision.autocast()``, calls ``precision.backward(loss)`` instead of ``loss.backward()``,
    and ``precision.step(optimizer)`` instead of ``optimizer.step()``: for fp16 that unscales the
    gradients, skips the step on an inf or NaN and updates the loss scale.

    Attributes:
        name: One of :data:`PRECISIONS`.
        device_type: ``"cuda"``, ``"cpu"``, … (what ``torch.autocast`` takes).
        autocast_dtype: ``torch.bfloat16`` / ``torch.float16``, or ``None`` (no autocast).
        matmul: The float32 matmul settings this precision wants.
        scaler: A dynamic loss scaler for ``fp16`` (see :func:`make_scaler`), else ``None``.

    Example:
        >>> import torch
        >>> from trainopt.perf import Precision
        >>> model = torch.nn.Linear(4, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> precision = Precision.from_name("bf16", "cpu")
        >>> with precision.autocast():
        ...     out = model(torch.randn(8, 4))
        >>> loss = out.float().pow(2).mean()
        >>> precision.backward(loss)
        >>> precision.step(optimizer)
        >>> out.dtype, model.weight.dtype, precision.state_dict()
        (torch.bfloat16, torch.float32, {'scaler': None})
    """

    name: str
    device_type: str
    autocast_dtype: torch.dtype | None
    matmul: MatmulSettings
    scaler: Any = field(default=None)

    @classmethod
    def from_name(
        cls,
        name: str,
        device: str | torch.device = "cpu",
        *,
        init_scale: float = 2.0**16,
        growth_interval: int = 2000,
        scaler: str = "trainopt",
    ) -> Precision:
        """Set up precision ``name`` for ``device`` after checking the hardware supports it.

        Args:
            name: ``"fp32"`` (true fp32, TF32 off), ``"tf32"`` (fp32 storage, TF32 matmuls),
                ``"bf16"`` or ``"fp16"`` (autocast; weights and optimizer stay fp32).
            device: The device the model trains on.
            init_scale: First loss scale of the fp16 scaler.
            growth_interval: Clean steps in a row before the fp16 scaler doubles its scale.
            scaler: ``"trainopt"``
                (:class:`~trainopt.stability.scaling.scaler.DynamicLossScaler`) or
                ``"torch"`` (``torch.amp.GradScaler``); used for fp16 only.

        Raises:
            ValueError: unknown ``name`` or ``scaler``, or a non-positive ``init_scale``.
            PrecisionNotSupportedError: the device can't run ``name``.

        Example:
            >>> import torch
            >>> from trainopt.perf import Precision
            >>> p = Precision.from_name("bf16", "cpu")
            >>> with p.autocast():
            ...     y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
            >>> y.dtype, p.scaler is None
            (torch.bfloat16, True)
        """
        if not init_scale > 0:
            raise ValueError(f"init_scale must be positive, got {init_scale=}")
        if scaler not in SCALERS:
            raise ValueError(f"scaler must be one of {list(SCALERS)}, got {scaler!r}")
        check_supported(name, device)
        device_type = torch.device(device).type
        matmul = MatmulSettings("high" if name == "tf32" else "highest", name == "tf32")
        loss_scaler = (
            make_scaler(scaler, device_type, init_scale, growth_interval)
            if name == "fp16"
            else None
        )
        return cls(name, device_type, AUTOCAST_DTYPES[name], matmul, loss_scaler)

    def autocast(self) -> torch.autocast:
        """A ``torch.autocast`` context for the forward pass; disabled for fp32 and tf32."""
        if self.autocast_dtype is None:
            return torch.autocast(device_type=self.device_type, enabled=False)
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)

    @contextlib.contextmanager
    def matmul_settings(self) -> Iterator[MatmulSettings]:
        """Apply this precision's float32 matmul settings; restore the previous ones on exit.

        Example:
            >>> import torch
            >>> from trainopt.perf import Precision
            >>> before = torch.get_float32_matmul_precision()
            >>> with Precision.from_name("fp32").matmul_settings():
            ...     inside = torch.get_float32_matmul_precision()
            >>> inside, torch.get_float32_matmul_precision() == before
            ('highest', True)
        """
        previous = MatmulSettings.current()
        self.matmul.apply()
        try:
            yield previous
        finally:
            previous.apply()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaling the loss first when there is a scaler."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale (before clipping); no-op without a scaler."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; with a scaler, skip on inf/NaN gradients and update the scale."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (empty without a scaler), for checkpoints."""
        return {"scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the scaler's state saved by :meth:`state_dict`."""
        if (state.get("scaler") is None) != (self.scaler is None):
            raise ValueError(
                f"state_dict has scaler state={state.get('scaler') is not None}, but precision "
                f"{self.name!r} has scaler={self.scaler is not None}"
            )
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
