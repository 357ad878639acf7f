"""Estimate the peak memory of a training step of any ``nn.Module`` by tracing it on fake tensors.

:func:`estimate_step_memory` runs two training steps of the model on fake tensors
(``torch._subclasses.FakeTensorMode``): tensors with a shape, a dtype and a device but no
memory, whose operators run only their shape functions. The first step creates the optimizer
state; the second, the steady state, is counted by the same live-storage accounting that
measures a real step on a CPU (:class:`~trainopt.perf.peak.LiveStorageTracker`): every storage
an operator creates is added when it appears and subtracted when it is freed. The fake tensors
claim the training device, so autocast, the attention kernel and the optimizer's kernels are
the ones a real step on that device would pick. Nothing is allocated but Python objects; the
model is not changed (its parameters are swapped for fake ones during the call and back after).

What the trace can't see, the estimate can't either: buffers an operator allocates and frees
inside its kernel, the CUDA caching allocator's rounding and the CUDA context. On a GPU the
estimate adds :data:`~trainopt.perf.estimate.CUDA_WORKSPACE_BYTES` for the cuBLAS workspaces.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map

from trainopt.config.optimizers import OPTIMIZERS as _KINDS
from trainopt.config.precisions import AUTOCAST_DTYPES
from trainopt.perf.estimate import CUDA_WORKSPACE_BYTES, MemoryEstimate
from trainopt.perf.memory import _CHECKPOINTED, apply_activation_checkpointing
from trainopt.perf.peak import LiveStorageTracker

_RATES = {"adamw": 1e-3, "adam": 1e-3, "sgd": 1e-2, "sgd_momentum": 1e-2}
OPTIMIZERS: dict[str, Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer]] = {
    name: functools.partial(kind.build, lr=_RATES[name]) for name, kind in _KINDS.items()
}
"""The optimizers :func:`estimate_step_memory` builds by name, with torch's default kernels."""


Checkpointing = type | tuple | Callable[[nn.Module], bool] | Iterable[str | nn.Module] | None


def make_optimizer(
    optimizer: str | Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer],
    params: Iterable[torch.Tensor],
) -> torch.optim.Optimizer:
    """The optimizer ``optimizer`` names (:data:`OPTIMIZERS`), or ``optimizer(params)`` for a
    factory.

    Example:
        >>> import functools, torch
        >>> from trainopt.perf.traced_estimate import make_optimizer
        >>> layer = torch.nn.Linear(2, 2)
        >>> type(make_optimizer("adamw", layer.parameters())).__name__
        'AdamW'
        >>> sgd = functools.partial(torch.optim.SGD, lr=0.1)
        >>> make_optimizer(sgd, layer.parameters()).defaults["lr"]
        0.1
    """
    if callable(optimizer):
        return optimizer(params)
    if optimizer not in OPTIMIZERS:
        raise ValueError(
            f"optimizer must be one of {sorted(OPTIMIZERS)} or a callable params -> Optimizer, "
            f"got {optimizer!r}"
        )
    return OPTIMIZERS[optimizer](params)


def _checkpoint_predicate(
    model: nn.Module, checkpointing: Checkpointing
) -> Callable[[nn.Module], bool]:
    if isinstance(checkpointing, (type, tuple)) or (
        callable(checkpointing) and not isinstance(checkpointing, nn.Module)
    ):
        return checkpointing  # type: ignore[return-value]
    modules = dict(model.named_modules())
    chosen = []
    for item in checkpointing:  # type: ignore[union-attr]
        if isinstance(item, str) and item not in modules:
            raise ValueError(
                f"checkpointing: no submodule named {item!r} in {type(model).__name__}"
            )
        chosen.append(modules[item] if isinstance(item, str) else item)
    return lambda module: any(module is c for c in chosen)


@contextlib.contextmanager
def checkpointed(model: nn.Module, checkpointing: Checkpointing) -> Iterator[list[str]]:
    """Checkpoint the chosen submodules of ``model`` inside the block; restore them after.

    Args:
        model: The model.
        checkpointing: None (the model as it is, with any checkpointing it already has), a
            module type or tuple of types, a predicate ``module -> bool``, or an iterable of
            submodules or their qualified names.

    Example:
        >>> import torch
        >>> from trainopt.perf.traced_estimate import checkpointed
        >>> nn = torch.nn
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> with checkpointed(model, ["0", "2"]) as names:
        ...     print(names)
        ['0', '2']
        >>> with checkpointed(model, torch.nn.ReLU) as names:
        ...     print(names)
        ['1']
    """
    if checkpointing is None:
        yield []
        return
    names = apply_activation_checkpointing(model, _checkpoint_predicate(model, checkpointing))
    try:
        yield names
    finally:
        modules = dict(model.named_modules())
        for name in names:
            modules[name].forward = getattr(modules[name], _CHECKPOINTED)
            delattr(modules[name], _CHECKPOINTED)


def model_loss(
    output: Any, targets: Any = None, loss_fn: Callable[..., torch.Tensor] | None = None
) -> torch.Tensor:
    """The loss of one forward pass: ``loss_fn(output[, targets])``, or the model's own loss.

    Without ``loss_fn``, the output must be the loss (a one-element tensor) or carry it, as a
    Hugging Face ``ModelOutput`` or a dict does under ``"loss"``.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from trainopt.perf.traced_estimate import model_loss
        >>> logits, labels = torch.zeros(4, 3), torch.tensor([0, 1, 2, 0])
        >>> round(float(model_loss(logits, labels, F.cross_entropy)), 4)
        1.0986
        >>> float(model_loss({"loss": torch.tensor(0.5)}))
        0.5
    """
    if loss_fn is not None:
        return loss_fn(output) if targets is None else loss_fn(output, targets)
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", output)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(
            f"loss_fn: the model returned {shape}, not a loss; pass loss_fn= (and targets=), "
            "e.g. loss_fn=torch.nn.functional.cross_entropy"
        )
    return loss


def call_model(model: nn.Module, batch: Any) -> Any:
    """``model(**batch)`` for a dict, ``model(*batch)`` for a tuple or list, else ``model(batch)``.

    Example:
        >>> import torch
        >>> from trainopt.perf.traced_estimate import call_model
        >>> call_model(torch.nn.Linear(3, 2), (torch.ones(5, 3),)).shape
        torch.Size([5, 2])
    """
    args, kwargs = _arguments(batch)
    return model(*args, **kwargs)


def _arguments(batch: Any) -> tuple[tuple, dict]:
    if isinstance(batch, dict):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    return (batch,), {}


class _StepTracker(LiveStorageTracker):
    """A live-storage tracker that also notes which storages are autocast copies of weights."""

    def __init__(self, device: str | torch.device, weights: Iterable[torch.Tensor]) -> None:
        super().__init__(device)
        self._weights = {id(w) for w in weights}
        self.casts: dict[int, int] = {}

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func is torch.ops.aten._to_copy.default and id(args[0]) in self._weights:
            storage = out.untyped_storage()
            self.casts[id(storage)] = storage.nbytes()
        return out

    def live_casts(self) -> int:
        return sum(size for key, size in self.casts.items() if key in self._live)


@contextlib.contextmanager
def swapped_tensors(model: nn.Module, replacements: dict[int, torch.Tensor]) -> Iterator[None]:
    """Put ``replacements[id(t)]`` in place of each parameter and buffer ``t`` of ``model`` in the
    block.

    Tied weights stay tied: a tensor is replaced wherever it appears. Unlike
    ``torch.func.functional_call``, the swap lasts until the block ends, so that the backward
    pass (and the recomputation of checkpointed modules in it) sees the replacements too.

    Example:
        >>> import torch
        >>> from trainopt.perf.traced_estimate import swapped_tensors
        >>> layer = torch.nn.Linear(2, 1, bias=False)
        >>> with swapped_tensors(layer, {id(layer.weight): torch.ones(1, 2)}):
        ...     print(layer(torch.tensor([[1.0, 2.0]])).item())
        3.0
        >>> isinstance(layer.weight, torch.nn.Parameter)
        True
    """
    swapped = []
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is not None and id(tensor) in replacements:
                    swapped.append((table, name, tensor))
                    table[name] = replacements[id(tensor)]
    try:
        yield
    finally:
        for table, name, tensor in swapped:
            table[name] = tensor


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum({id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}.values())


def estimate_step_memory(
    model: nn.Module,
    example_batch: Any,
    *,
    targets: Any = None,
    loss_fn: Callable[..., torch.Tensor] | None = None,
    optimizer: str | Callable[[Iterable[torch.Tensor]], torch.optim.Optimizer] = "adamw",
    precision: str = "fp32",
    checkpointing: Checkpointing = None,
    device: str | torch.device | None = None,
) -> MemoryEstimate:
    """Estimate the peak memory of a steady-state training step of any model, without running it.

    The step is ``loss = loss_fn(model(batch), targets)`` under autocast, ``loss.backward()``,
    ``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)``. Its peak is the largest
    of the three phases (forward, backward, optimizer step), each the most bytes alive at once
    while it runs: weights, buffers and optimizer state throughout, the batch, what the
    forward saves for backward, gradients as backward produces them, the optimizer's
    temporaries.

    Args:
        model: Any ``nn.Module``, on any device, ``meta`` included: only shapes are read. Its
            mode (``train()``/``eval()``) is used as it is.
        example_batch: The model's inputs (real or ``meta`` tensors: only shapes are read): a
            tensor, a tuple (``model(*batch)``) or a dict (``model(**batch)``).
        targets: What ``loss_fn`` takes besides the output (a tensor or a pytree of tensors).
        loss_fn: ``loss_fn(output, targets)`` (or ``loss_fn(output)`` without targets); None if
            the model returns its loss (a scalar, or a Hugging Face output with ``loss``).
        optimizer: A name in :data:`OPTIMIZERS` or a factory ``params -> Optimizer`` such as
            ``functools.partial(torch.optim.AdamW, fused=True)``.
        precision: ``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp16"`` (autocast; weights stay in
            their dtype). An fp16 loss scaler's few scalars are not counted.
        checkpointing: Submodules to checkpoint for the estimate (:func:`checkpointed`); None
            keeps the model's own checkpointing, if any.
        device: Where it will train; default: the device of the model's parameters (the CPU for
            a model on ``meta``). CUDA adds the cuBLAS workspace.

    Returns:
        A :class:`~trainopt.perf.estimate.MemoryEstimate`: ``weights`` (parameters and
        buffers), ``gradients``, ``optimizer_states``, ``activations`` (what the forward leaves
        alive, the loss included), ``weight_casts`` (autocast's low-precision weight copies kept
        for backward) and the ``phases``.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> from trainopt.perf import estimate_step_memory
        >>> nn = torch.nn
        >>> model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10))
        >>> x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
        >>> est = estimate_step_memory(
        ...     model, x, targets=y, loss_fn=F.cross_entropy, optimizer="adamw"
        ... )
        >>> n = sum(p.numel() for p in model.parameters())
        >>> est.weights == 4 * n and est.optimizer_states == 8 * n + 4 * 4  # two moments, 4 steps
        True
        >>> est.peak_phase, round(est.peak / 2**20, 1)
        ('optimizer step', 12.7)
    """
    if precision not in AUTOCAST_DTYPES:
        raise ValueError(f"precision must be one of {list(AUTOCAST_DTYPES)}, got {precision!r}")
    if not callable(optimizer) and optimizer not in OPTIMIZERS:
        raise ValueError(
            f"optimizer must be one of {sorted(OPTIMIZERS)} or a callable params -> Optimizer, "
            f"got {optimizer!r}"
        )
    first = next(iter(model.parameters()), None)
    if first is None:
        raise ValueError(f"model: {type(model).__name__} has no parameters to train")
    if device is None:
        device = "cpu" if first.device.type == "meta" else first.device
    device = torch.device(device)
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and not (hasattr(backend, "is_available") and backend.is_available()):
        raise ValueError(
            f"device: {device.type!r} is not available here; estimate on a device this machine has "
            "(the CPU's estimate differs from a GPU's only where kernels differ)"
        )
    autocast_dtype = AUTOCAST_DTYPES[precision]
    mode = FakeTensorMode()

    def fake(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
        return out.requires_grad_(t.requires_grad) if t.is_leaf else out

    with checkpointed(model, checkpointing), mode:
        fakes = {id(t): fake(t) for t in [*model.parameters(), *model.buffers()]}
        params = [fakes[id(p)] for p in model.parameters()]
        buffers = [fakes[id(b)] for b in model.buffers()]
        batch, fake_targets = tree_map(fake, example_batch), tree_map(fake, targets)
        trained = [p for p in params if p.requires_grad]
        opt = make_optimizer(optimizer, trained)
        tracker = _StepTracker(device, params)
        phases: dict[str, int] = {}
        parts: dict[str, int] = {}

        def step(count: bool) -> None:
            with torch.autocast(
                device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                loss = model_loss(call_model(model, batch), fake_targets, loss_fn)
            if count:
                phases["forward"] = tracker.peak
                parts["activations"] = tracker.current - parts["start"]
                parts["weight_casts"] = tracker.live_casts()
                tracker.reset_peak()
            loss.backward()
            del loss
            if count:
                phases["backward"] = tracker.peak
                parts["gradients"] = _nbytes(p.grad for p in trained if p.grad is not None)
                tracker.reset_peak()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if count:
                phases["optimizer step"] = tracker.peak

        with swapped_tensors(model, fakes):
            step(count=False)  # the optimizer creates its state: the next step is the steady state
            state = [
                v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)
            ]
            tracker.count([*params, *buffers, *state])
            tracker.count(
                t for t in tree_leaves((batch, fake_targets)) if isinstance(t, torch.Tensor)
            )
            parts["start"] = tracker.current
            with tracker:
                step(count=True)
    weights = _nbytes([*params, *buffers])
    return MemoryEstimate(
        weights=weights,
        gradients=parts["gradients"],
        optimizer_states=_nbytes(state),
        master_weights=0,
        activations=parts["activations"] - parts["weight_casts"],
        weight_casts=parts["weight_casts"],
        phases=phases,
        workspace=CUDA_WORKSPACE_BYTES if device.type == "cuda" else 0,
    )
