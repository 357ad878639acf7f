"""Estimate the peak memory of a training step of any ``nn.Module`` by tracing it on fake tensors.

:func:`estimate_step_memory` runs two training steps of the model on fake tensors
(``torch._subclasses.FakeTensorMode``): tensors with a shape, a dtype and a device but no
memory, whose operators run only their shape functions. The first step creates the optimizer
state; the second, the steady state, is counted by the same live-storage accounting that
measures a real step on a CPU (:class:`~trainopt.perf.peak.LiveStorageTracker`): every storage
an operator creates is added when it appears and subtracted when it is freed. The fake tensors
claim the training device, so autocast, the attention kernel and the optimizer's kernels are
the ones a real step on that device would pick. The model is not changed (its parameters are
swapped for fake ones during the call and back after).

Integer and boolean tensors keep their values (copies of the batch's and the targets', what
integer factories such as ``arange`` make, and what operators on only such tensors give), so
shapes that depend on data are exact where that data is integer: a boolean mask of the labels,
indices, the lengths of packed sequences. An operator whose output shape or value depends on
any other tensor is refused with one :class:`DataDependentShapeError`, which names it and the
module that ran it.

What the trace can't see, the estimate can't either: buffers an operator allocates and frees
inside its kernel, the CUDA caching allocator's rounding and the CUDA context. Two kernels keep
a buffer for backward that their shape function leaves out: oneDNN's RNN layer (LSTM on a CPU),
whose workspace is measured by running the kernel once on zeros at the traced shapes, and
cuDNN's RNN, whose reserve is not counted (a warning says so). On a GPU the estimate adds
:data:`~trainopt.perf.estimate.CUDA_WORKSPACE_BYTES` for the cuBLAS workspaces.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    is_fake,
    unset_fake_temporarily,
)
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


class DataDependentShapeError(RuntimeError):
    """The step has an operation whose output depends on values the estimate doesn't have.

    A trace on fake tensors knows shapes, not values. Integer and boolean tensors keep their
    values (the batch's, the targets', what integer factories and operations on them make), so
    a mask or the lengths of packed sequences computed from them are estimated exactly; an
    operation whose output shape or Python value depends on any other tensor is refused with
    this error. ``operation`` is the aten operator, ``where`` the qualified name of the module
    that ran it (``"encoder.rnn"``; the model's class name for its own forward, ``"loss_fn"`` for
    the loss, ``"backward (<autograd node>)"`` in the backward pass).

    Example:
        >>> import torch
        >>> from trainopt.perf import DataDependentShapeError, estimate_step_memory
        >>> def loss_fn(out):  # the rows whose first output is positive: a mask of floats
        ...     return out[out[:, 0] > 0].sum()
        >>> try:
        ...     estimate_step_memory(torch.nn.Linear(4, 2), torch.randn(8, 4), loss_fn=loss_fn)
        ... except DataDependentShapeError as error:
        ...     print(error.operation, error.where)
        aten.index.Tensor loss_fn
    """

    def __init__(self, operation: str, where: str, message: str) -> None:
        super().__init__(message)
        self.operation = operation
        self.where = where


_REFUSALS = {
    "pack": (
        "the packed size depends on the values of the lengths, which the estimate doesn't have "
        "(on meta, or computed from floating-point tensors)",
        "pass the lengths as a real integer tensor in the example batch: the estimate reads "
        "integer tensors",
    ),
    "shape": (
        "its output size depends on values the estimate doesn't have (a mask or indices on "
        "meta, or computed from floating-point tensors)",
        "make the mask from real integer tensors of the example batch or targets, which the "
        "estimate reads (a batch with the most elements kept that you expect gives the bound), "
        "or keep the shape fixed (ignore_index=, torch.where, a fixed capacity)",
    ),
    "value": (
        "reads a tensor's value (.item(), or a Python if on a tensor) that the estimate doesn't "
        "have (on meta, or computed from floating-point tensors)",
        "move the check out of forward, or compute it from real integer tensors of the example "
        "batch, which the estimate reads",
    ),
    "sparse": (
        "a sparse gradient (one row per index of the batch) is not traced",
        "estimate with sparse=False, which counts a dense gradient of num_embeddings x "
        "embedding_dim instead",
    ),
}


def _refusal(
    kind: str, operation: str, where: str, module: type | None = None
) -> DataDependentShapeError:
    problem, advice = _REFUSALS[kind]
    place = f"module {where!r} ({module.__name__})" if module is not None else where
    return DataDependentShapeError(
        operation, where, f"estimate_step_memory: {operation} in {place}: {problem}; {advice}"
    )


def _refuse_sparse_embeddings(model: nn.Module) -> None:
    for name, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse:
            operation = f"aten.embedding_backward ({type(module).__name__}, sparse=True)"
            raise _refusal("sparse", operation, name or type(model).__name__, type(module))


aten = torch.ops.aten

# Operators whose shape function leaves out the buffer the kernel keeps for backward: the index
# of that output, and of the argument that says it is kept (train). PyTorch's meta kernels of the
# oneDNN RNN layer and of cuDNN's RNN return an empty workspace (reserve).
_WORKSPACE_OUTPUTS = {aten.mkldnn_rnn_layer.default: (3, 15)}
_CUDNN_RNNS = {aten._cudnn_rnn.default: 12, aten.miopen_rnn.default: 10}
_INDEXING = (
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
)
_VALUE_BYTES = 2**24
"""Integer tensors made by factories (``arange``, ``zeros``) keep their values up to this size."""


def _signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, str(value.device))
    if isinstance(value, (list, tuple)):
        return tuple(_signature(v) for v in value)
    return value


@functools.lru_cache(maxsize=128)
def _workspace_bytes(func: Any, signature: tuple) -> int:
    """The bytes of the workspace ``func`` allocates at these shapes: run it once on zeros."""

    def real(item: Any) -> Any:
        if isinstance(item, tuple) and item[:1] == ("tensor",):
            return torch.zeros(item[1], dtype=item[2], device=item[3])
        return list(real(v) for v in item) if isinstance(item, tuple) else item

    with unset_fake_temporarily():  # not under no_grad: the kernel then keeps no workspace
        out = func(*(real(item) for item in signature))
    return out[_WORKSPACE_OUTPUTS[func][0]].untyped_storage().nbytes()


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    """The tensors among an operator's arguments or outputs (lists of tensors opened)."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += [v for v in value if isinstance(v, torch.Tensor)]
    return found


def _is_integral(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex())


class _StepTracker(LiveStorageTracker):
    """The live-storage accounting of a traced step, and what a trace on fake tensors lacks.

    Besides counting storages it notes which are autocast copies of weights; gives the oneDNN
    RNN layer the workspace its kernel really allocates; runs operators whose inputs are all
    real tensors for real (the values of integer tensors, so that masks, indices and the lengths
    of packed sequences are exact); and turns the fake-tensor errors of data-dependent operators
    into one :class:`DataDependentShapeError` naming the operator and the module.
    """

    def __init__(
        self,
        device: str | torch.device,
        weights: Iterable[torch.Tensor],
        names: dict[int, str] | None = None,
    ) -> None:
        super().__init__(device)
        self._weights = {id(w) for w in weights}
        self.casts: dict[int, int] = {}
        self.names = names or {}
        self.where: list[tuple[str, type | None]] = []  # (qualified name, module type)
        self.warned: set[str] = set()

    def enter(self, module: nn.Module, *_: Any) -> None:
        self.where.append((self.names.get(id(module), type(module).__name__), type(module)))

    def leave(self, *_: Any) -> None:
        self.where.pop()

    def location(self) -> tuple[str, type | None]:
        """Where the running operator is: the innermost module, the loss or the backward."""
        if self.where:
            return self.where[-1]
        node = torch._C._current_autograd_node()
        return (f"backward ({node.name()})" if node is not None else "the step"), None

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        try:
            out = self._run(func, args, kwargs)
        except DynamicOutputShapeException:
            kind = "pack" if func is aten._pack_padded_sequence.default else "shape"
            raise _refusal(kind, str(func), *self.location()) from None
        except DataDependentOutputException:
            raise _refusal("value", str(func), *self.location()) from None
        if func in _WORKSPACE_OUTPUTS:
            index, train = _WORKSPACE_OUTPUTS[func]
            if args[train] and is_fake(out[index]) and out[index].numel() == 0:
                self._add(out[index], _workspace_bytes(func, _signature(args)))
        for value in _tensors(out if isinstance(out, (tuple, list)) else [out]):
            if value.layout != torch.strided:
                raise _refusal("sparse", f"{func} ({value.layout})", *self.location())
            self._add(value)
        if func in _CUDNN_RNNS and args[_CUDNN_RNNS[func]] and func not in self.warned:
            self.warned.add(func)
            warnings.warn(
                f"estimate_step_memory: {func} in {self.location()[0]}: the reserve space the "
                "kernel keeps for backward is not counted (PyTorch's shape function reports "
                "none), so the estimate of this step is a lower bound",
                stacklevel=2,
            )
        if func is aten._to_copy.default and id(args[0]) in self._weights:
            storage = out.untyped_storage()
            self.casts[id(storage)] = storage.nbytes()
        return out

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        tensors = _tensors([*args, *kwargs.values()])
        if tensors and not any(is_fake(t) for t in tensors):
            with unset_fake_temporarily():  # values only: real inputs give real outputs
                return func(*args, **kwargs)
        if not tensors:
            out = func(*args, **kwargs)
            if (
                isinstance(out, torch.Tensor)
                and _is_integral(out)
                and out.numel() * out.element_size() <= _VALUE_BYTES
            ):
                with unset_fake_temporarily():  # an integer factory: arange, zeros, full
                    return func(*args, **kwargs)
            return out
        if func is aten._pack_padded_sequence.default and not is_fake(args[1]):
            return self._pack(*args, **kwargs)
        if func in _INDEXING and any(
            isinstance(i, torch.Tensor) and not is_fake(i) and i.dtype in (torch.bool, torch.uint8)
            for i in args[1]
        ):
            with unset_fake_temporarily():  # a real mask selects known positions
                indices = []
                for i in args[1]:
                    masked = isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                    indices += list(i.nonzero().unbind(1)) if masked else [i]
            return func(args[0], indices, *args[2:], **kwargs)
        return func(*args, **kwargs)

    @staticmethod
    def _pack(inputs: torch.Tensor, lengths: torch.Tensor, batch_first: bool) -> Any:
        batch, steps = (0, 1) if batch_first else (1, 0)
        with unset_fake_temporarily():
            shape = [1, 1, 1]  # one feature: only the lengths matter
            shape[batch], shape[steps] = inputs.shape[batch], inputs.shape[steps]
            data, batch_sizes = torch.ops.aten._pack_padded_sequence(
                torch.empty(shape), lengths, batch_first
            )
        return inputs.new_empty((data.shape[0], *inputs.shape[2:])), batch_sizes

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


@contextlib.contextmanager
def _locating(tracker: _StepTracker) -> Iterator[None]:
    """Keep ``tracker.where``, the stack of modules whose forward is running, in the block."""
    hooks = [
        torch.nn.modules.module.register_module_forward_pre_hook(tracker.enter),
        torch.nn.modules.module.register_module_forward_hook(tracker.leave, always_call=True),
    ]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


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
    keep_outputs: bool = False,
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
        example_batch: The model's inputs: a tensor, a tuple (``model(*batch)``) or a dict
            (``model(**batch)``). Floating-point tensors may be real or on ``meta`` (only their
            shapes are read); integer and boolean ones are read if real (the lengths of packed
            sequences, token ids that choose an expert): give the batch whose data-dependent
            sizes you want bounded, the largest you expect.
        targets: What ``loss_fn`` takes besides the output (a tensor or a pytree of tensors),
            read as the batch is (a boolean mask of integer labels is exact).
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
        keep_outputs: Estimate the loop that keeps the model's output and the loss in
            variables, ``out = model(x); loss = loss_fn(out, y); loss.backward()``: they live
            through backward and the optimizer step until the next step's forward replaces
            them. False (the default): the step keeps only the loss, and the output is freed
            once the loss is computed (what the loss saves for backward stays).

    Returns:
        A :class:`~trainopt.perf.estimate.MemoryEstimate`: ``weights`` (parameters and
        buffers), ``gradients``, ``optimizer_states``, ``activations`` (what the forward leaves
        alive, the loss included), ``weight_casts`` (autocast's low-precision weight copies kept
        for backward) and the ``phases``.

    Raises:
        DataDependentShapeError: An operator's output shape or value depends on values the
            trace doesn't have (``nonzero`` or a boolean mask of floats, ``.item()`` in
            forward, lengths on ``meta``), or a sparse gradient (``nn.Embedding(sparse=True)``).
        ValueError: An argument is not one this function takes; the message names it.

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
        >>> held = estimate_step_memory(model, x, targets=y, loss_fn=F.cross_entropy,
        ...                             keep_outputs=True)
        >>> held.peak - est.peak  # the 256 x 10 fp32 logits and the loss, alive in the step
        10244
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
    _refuse_sparse_embeddings(model)
    autocast_dtype = AUTOCAST_DTYPES[precision]
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if _is_integral(t) and t.device.type != "meta":
            with unset_fake_temporarily():  # values kept: labels, lengths, masks, token ids
                return t.to(device, copy=True)
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
        return out.requires_grad_(t.requires_grad) if t.is_leaf else out

    names = {id(m): name or type(model).__name__ for name, m in model.named_modules()}
    with checkpointed(model, checkpointing), mode:
        fakes = {id(t): fake(t) for t in [*model.parameters(), *model.buffers()]}
        params = [fakes[id(p)] for p in model.parameters()]
        buffers = [fakes[id(b)] for b in model.buffers()]
        batch, fake_targets = tree_map(fake, example_batch), tree_map(fake, targets)
        trained = [p for p in params if p.requires_grad]
        opt = make_optimizer(optimizer, trained)
        tracker = _StepTracker(device, params, names)
        phases: dict[str, int] = {}
        parts: dict[str, int] = {}
        held: dict[str, Any] = {}  # keep_outputs: the last step's output and loss

        def step(tracker: _StepTracker, count: bool) -> None:
            with torch.autocast(
                device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None
            ):
                output = call_model(model, batch)
                if keep_outputs:
                    held["output"] = output  # the last step's output is freed only now
                tracker.where.append(("loss_fn", None))
                loss = model_loss(output, fake_targets, loss_fn)
                tracker.where.pop()
                if keep_outputs:
                    held["loss"] = loss
                del output
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
            # the optimizer creates its state: the next step is the steady state
            with _StepTracker(device, params, names) as warm_up, _locating(warm_up):
                step(warm_up, count=False)
            state = [
                v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)
            ]
            tracker.count([*params, *buffers, *state])
            tracker.count(
                t for t in tree_leaves((batch, fake_targets)) if isinstance(t, torch.Tensor)
            )
            parts["start"] = tracker.current
            tracker.count(t for t in tree_leaves(held) if isinstance(t, torch.Tensor))
            with tracker, _locating(tracker):
                step(tracker, count=True)
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
