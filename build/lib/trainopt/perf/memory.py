"""Training memory: activation checkpointing, per-phase reports and CUDA memory snapshots."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainopt.validation import check_int

_CHECKPOINTED = "_trainopt_checkpointed_forward"


def _matmul_and_attention_ops() -> set[Any]:
    names = [
        "mm",
        "addmm",
        "bmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    ]
    return {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}


def _selective_context_fn() -> Callable[[], Any]:
    """Save matmul and attention outputs; recompute the cheap ops (norms, GELU, casts)."""
    try:
        from torch.utils.checkpoint import (
            CheckpointPolicy,
            create_selective_checkpoint_contexts,
        )
    except ImportError as exc:  # torch < 2.4
        raise RuntimeError("selective checkpointing needs torch >= 2.4") from exc
    saved = _matmul_and_attention_ops()

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
        return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


def apply_activation_checkpointing(
    model: nn.Module,
    modules: type[nn.Module] | tuple[type[nn.Module], ...] | Callable[[nn.Module], bool],
    every: int = 1,
    selective: bool = False,
) -> list[str]:
    """Recompute the activations of chosen submodules in backward instead of storing them.

    Each chosen module's ``forward`` runs under ``torch.utils.checkpoint.checkpoint`` with
    ``use_reentrant=False``: autograd keeps only the module's inputs and runs its forward
    again during backward. Outside grad mode (evaluation) the module runs as before.

    Args:
        model: The model to modify in place.
        modules: A module type (or tuple of types), or a predicate ``module -> bool``.
        every: Checkpoint every ``every``-th matching module (1: all, 2: every second …),
            counting from the first in ``model.named_modules()`` order.
        selective: Keep matmul and attention outputs, recompute only the cheap ops between
            them (``torch.utils.checkpoint.create_selective_checkpoint_contexts``).

    Returns:
        The qualified names of the modules now checkpointed.

    Example:
        >>> from trainopt.perf import apply_activation_checkpointing
        >>> from trainopt.models import GPT, Block, gpt_config
        >>> model = GPT(gpt_config("tiny", n_layer=4))
        >>> apply_activation_checkpointing(model, Block, every=2)
        ['blocks.0', 'blocks.2']
    """
    check_int("every", every, 1)
    if isinstance(modules, type) or isinstance(modules, tuple):
        types = modules
        predicate: Callable[[nn.Module], bool] = lambda m: isinstance(m, types)  # noqa: E731
    elif callable(modules):
        predicate = modules
    else:
        raise TypeError(
            f"modules must be a module type, a tuple of types or a predicate, got {modules!r}"
        )
    context_fn = _selective_context_fn() if selective else None
    matches = [(name, m) for name, m in model.named_modules() if name and predicate(m)]
    chosen = matches[::every]
    for _, module in chosen:
        _wrap_forward(module, context_fn)
    return [name for name, _ in chosen]


def _wrap_forward(module: nn.Module, context_fn: Callable[[], Any] | None) -> None:
    if hasattr(module, _CHECKPOINTED):
        raise ValueError(f"{type(module).__name__} is already checkpointed")
    original = module.forward
    extra = {"context_fn": context_fn} if context_fn is not None else {}

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        return checkpoint(original, *args, use_reentrant=False, **extra, **kwargs)

    setattr(module, _CHECKPOINTED, original)
    module.forward = forward


def remove_activation_checkpointing(model: nn.Module) -> list[str]:
    """Undo :func:`apply_activation_checkpointing`; return the names restored.

    Example:
        >>> from trainopt.perf import apply_activation_checkpointing
        >>> from trainopt.perf.memory import remove_activation_checkpointing
        >>> from trainopt.models import GPT, Block, gpt_config
        >>> model = GPT(gpt_config("tiny"))
        >>> apply_activation_checkpointing(model, Block)
        ['blocks.0', 'blocks.1']
        >>> remove_activation_checkpointing(model)
        ['blocks.0', 'blocks.1']
        >>> remove_activation_checkpointing(model)  # nothing left to undo
        []
    """
    restored = []
    for name, module in model.named_modules():
        if hasattr(module, _CHECKPOINTED):
            module.forward = getattr(module, _CHECKPOINTED)
            delattr(module, _CHECKPOINTED)
            restored.append(name)
    return restored


def saved_activation_bytes(model: nn.Module, fn: Callable[[], Any]) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs (any device).

    Storages are counted once; the model's parameters are left out (they exist anyway), so
    what remains is activations plus, under autocast, the low-precision copies of weights.
    The inputs that checkpointed modules keep are counted; what they recompute is not.

    Example:
        >>> import torch
        >>> from trainopt.perf import saved_activation_bytes
        >>> layer = torch.nn.Linear(8, 8)
        >>> x = torch.randn(4, 8, requires_grad=True)
        >>> saved_activation_bytes(layer, lambda: torch.relu(layer(x)).sum())
        256
    """
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


@dataclass(frozen=True)
class PhaseMemory:
    """CUDA memory after one phase of a step, in bytes (``None`` where unavailable).

    Example:
        >>> from trainopt.perf import PhaseMemory
        >>> p = PhaseMemory("backward", allocated=3 * 2**20, reserved=4 * 2**20, peak=5 * 2**20)
        >>> p.phase, p.peak / 2**20, p.reserved >= p.allocated
        ('backward', 5.0, True)
    """

    phase: str
    allocated: int | None
    reserved: int | None
    peak: int | None


class MemoryTracker:
    """Record allocated, reserved and peak memory for each phase of a training step.

    ``with tracker.phase("forward"): ...`` resets the peak counter on entry and, on exit,
    synchronises and reads ``torch.cuda.memory_allocated``, ``memory_reserved`` and
    ``max_memory_allocated``. It is a diagnostic: the sync per phase is the price, so use it
    for a few steps, not on every step of a run. On a CPU it records ``None`` and
    :attr:`available` is ``False``: PyTorch keeps no allocator statistics for CPU tensors.

    Example:
        >>> import torch
        >>> from trainopt.perf import MemoryTracker
        >>> tracker = MemoryTracker("cpu")
        >>> with tracker.phase("forward"):
        ...     _ = torch.ones(3) * 2
        >>> tracker.available, tracker.phases[0]
        (False, PhaseMemory(phase='forward', allocated=None, reserved=None, peak=None))
    """

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.available = self.device.type == "cuda" and torch.cuda.is_available()
        self.phases: list[PhaseMemory] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Measure the block as phase ``name``."""
        if self.available:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        yield
        if not self.available:
            self.phases.append(PhaseMemory(name, None, None, None))
            return
        torch.cuda.synchronize(self.device)
        self.phases.append(
            PhaseMemory(
                name,
                torch.cuda.memory_allocated(self.device),
                torch.cuda.memory_reserved(self.device),
                torch.cuda.max_memory_allocated(self.device),
            )
        )

    @property
    def peak(self) -> int | None:
        """Highest peak over the recorded phases."""
        peaks = [p.peak for p in self.phases if p.peak is not None]
        return max(peaks) if peaks else None

    def table(self) -> str:
        """The phases as a Markdown table in MiB (or a note that stats are unavailable)."""
        if not self.available:
            return f"CUDA memory statistics are unavailable on {self.device.type!r}."
        rows = [
            "| phase | allocated (MiB) | reserved (MiB) | peak (MiB) |",
            "| --- | ---: | ---: | ---: |",
        ]
        rows += [
            f"| {p.phase} | {p.allocated / 2**20:,.0f} | {p.reserved / 2**20:,.0f} | "
            f"{p.peak / 2**20:,.0f} |"
            for p in self.phases
        ]
        return "\n".join(rows)


@contextlib.contextmanager
def record_memory_history(
    path: str | Path, max_entries: int = 100_000, device: str | torch.device = "cuda"
) -> Iterator[Path]:
    """Record every CUDA allocation in the block and dump a snapshot to ``path`` on exit.

    Open the file at https://pytorch.org/memory_viz (drag and drop) to see each allocation
    over time with its Python stack. The memory page records one on a GPU.

    Raises:
        ValueError: ``device`` is not a CUDA device: only CUDA's allocator keeps a history.
        RuntimeError: CUDA is not available.

    Example:
        >>> import pickle
        >>> import tempfile
        >>> import torch
        >>> from pathlib import Path
        >>> from trainopt.perf import record_memory_history
        >>> try:
        ...     with record_memory_history("snapshot.pickle", device="cpu"):
        ...         pass
        ... except ValueError as error:
        ...     print(error)
        record_memory_history records CUDA allocations: device must be a CUDA device, got 'cpu'

        .. skip: start if(not torch.cuda.is_available(), reason="needs CUDA")

        >>> path = Path(tempfile.mkdtemp()) / "snapshot.pickle"
        >>> with record_memory_history(path):
        ...     block = torch.ones(2**20, device="cuda")  # 4 MiB
        >>> snapshot = pickle.loads(path.read_bytes())
        >>> any(e["action"] == "alloc" and e["size"] == 2**22 for e in snapshot["device_traces"][0])
        True

        .. skip: end
    """
    if torch.device(device).type != "cuda":
        raise ValueError(
            f"record_memory_history records CUDA allocations: device must be a CUDA device, "
            f"got {str(device)!r}"
        )
    if not torch.cuda.is_available():
        raise RuntimeError("record_memory_history needs CUDA: torch.cuda.is_available() is False")
    path = Path(path)
    torch.cuda.memory._record_memory_history(max_entries=max_entries, device=device)
    try:
        yield path
    finally:
        torch.cuda.memory._dump_snapshot(str(path))
        torch.cuda.memory._record_memory_history(enabled=None, device=device)


def allocator_settings(conf: str | None = None) -> dict[str, str]:
    """Parse the CUDA caching allocator's settings (default: from the environment).

    ``PYTORCH_ALLOC_CONF`` holds ``key:value`` pairs separated by commas, read once when CUDA
    first allocates. The older ``PYTORCH_CUDA_ALLOC_CONF`` is still read for backward
    compatibility, and CUDA's allocator reads it first, so it wins where both are set.

    Example:
        >>> from trainopt.perf import allocator_settings
        >>> allocator_settings("expandable_segments:True,max_split_size_mb:128")
        {'expandable_segments': 'True', 'max_split_size_mb': '128'}
    """
    if conf is None:
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF", "")
    settings = {}
    for item in filter(None, (part.strip() for part in conf.split(","))):
        key, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"allocator setting must be 'key:value', got {item!r}")
        settings[key.strip()] = value.strip()
    return settings


def expandable_segments_in_use(segments: list[dict[str, Any]] | None = None) -> bool:
    """Whether the CUDA allocator's segments are expandable, from its live snapshot.

    Args:
        segments: Segments as ``torch.cuda.memory_snapshot()`` lists them; default: the live
            allocator's (a probe tensor makes sure there is one).

    Raises:
        RuntimeError: no ``segments`` given and CUDA is not available.

    Example:
        >>> from trainopt.perf import expandable_segments_in_use
        >>> expandable_segments_in_use([{"is_expandable": True}, {"is_expandable": True}])
        True
        >>> expandable_segments_in_use([{"is_expandable": True}, {"is_expandable": False}])
        False

        On a GPU, the live allocator's answer follows ``PYTORCH_ALLOC_CONF``:

        >>> import torch
        >>> from trainopt.perf import allocator_settings

        .. skip: start if(not torch.cuda.is_available(), reason="needs CUDA")

        >>> wanted = allocator_settings().get("expandable_segments") == "True"
        >>> expandable_segments_in_use() == wanted
        True

        .. skip: end
    """
    if segments is None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "expandable_segments_in_use needs CUDA: torch.cuda.is_available() is False"
            )
        probe = torch.empty(1, device="cuda")
        segments = torch.cuda.memory_snapshot()
        del probe
    return bool(segments) and all(s.get("is_expandable", False) for s in segments)
