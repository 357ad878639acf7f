"""The checkpoint file: its format, weights-only atomic writes, and reads that name what is wrong.

:class:`~trainopt.stability.checkpointing.checkpoint.CheckpointManager` writes and reads its files
through these.

- **Weights-only, as torch judges it.** :func:`save_weights_only` writes a payload to a temporary
  file beside the target, reads it back with ``torch.load(weights_only=True, mmap=True)`` (the
  tensors are mapped, not read), and only then renames it over the target: whatever the
  installed torch's loader accepts is accepted (``Counter`` and ``OrderedDict`` included, and
  classes passed to ``torch.serialization.add_safe_globals``), and anything else raises
  :class:`CheckpointError` naming the entry (``checkpoint['scheduler']['fn'] is a function``).
- **Atomic.** Temporary file, ``fsync``, ``os.replace``, ``fsync`` of the directory.
- **Validated reads.** :func:`read_checkpoint` raises :class:`CheckpointError` naming the file
  for a missing, torn, unsafe or foreign file, a missing entry, or an entry of the wrong type.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import torch

__all__ = ["FORMAT", "CheckpointError", "read_checkpoint", "save_weights_only"]


FORMAT = "trainopt.stability.checkpoint/1"


# What each payload entry must be; the scheduler, the scaler and the extra states are checked by
# their objects' load_state_dict.
_FIELDS: dict[str, tuple[type, ...]] = {
    "format": (str,),
    "step": (int,),
    "loss": (int, float),
    "model": (dict,),
    "optimizer": (dict, type(None)),
    "scheduler": (object,),
    "scaler": (object,),
    "extra": (dict,),
    "rng": (dict,),
}


_LEAVES = (
    int,
    float,
    bool,
    str,
    bytes,
    bytearray,
    complex,
    type(None),
    torch.dtype,
    torch.device,
    torch.Size,
)


_CONTAINERS = (dict, OrderedDict, Counter, list, tuple, set)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or loaded; the message names the file.

    Example:
        >>> import torch
        >>> from trainopt.stability import CheckpointError
        >>> from trainopt.stability import CheckpointManager
        >>> import tempfile
        >>> manager = CheckpointManager(tempfile.mkdtemp())
        >>> try:
        ...     manager.load_checkpoint(torch.nn.Linear(2, 1), None, manager.path_for(5))
        ... except CheckpointError as error:
        ...     print(error)
        checkpoint file .../checkpoint_step_5.pt does not exist
    """


def _first_refused(value: Any, where: str) -> str | None:
    """Where ``value`` holds something ``torch.load(weights_only=True)`` would refuse (``None``:
    nowhere known; the loader itself is the judge, this only names the entry)."""
    if (
        isinstance(value, torch.Tensor)
        or type(value) in _LEAVES
        or type(value) in getattr(torch.serialization, "get_safe_globals", list)()
    ):
        return None
    if type(value) not in _CONTAINERS:
        return f"{where} is a {type(value).__name__}"
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        found = (
            _first_refused(key, f"{where} key") if isinstance(value, dict) else None
        ) or _first_refused(item, f"{where}[{key!r}]")
        if found:
            return found
    return None


def _refusal(payload: dict[str, Any], exc: BaseException) -> CheckpointError:
    where = _first_refused(payload, "checkpoint")
    what = f"{where}: " if where else ""
    return CheckpointError(
        f"{what}checkpoints hold only what torch.load(weights_only=True) reads: tensors, dict, "
        "OrderedDict, Counter, list, tuple, set, int, float, complex, bool, str, bytes, None, "
        "torch.dtype, torch.device, torch.Size (and classes passed to "
        "torch.serialization.add_safe_globals); convert it in its "
        f"state_dict() ({type(exc).__name__}: {exc})"
    )


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, write: Any, verify: Any = None) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, ``verify(temporary path)``, then
    rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if verify is not None:
            verify(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def save_weights_only(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically, once ``torch.load(weights_only=True)`` reads it
    back.

    Args:
        path: The file to write (replaced only once the new one is complete and readable).
        payload: What to ``torch.save``.

    Raises:
        CheckpointError: The payload holds something the weights-only loader refuses (the
            message names the entry); ``path`` is left as it was and no temporary file remains.

    Example:
        >>> import collections, tempfile
        >>> from pathlib import Path
        >>> from trainopt.stability.checkpointing.files import CheckpointError, save_weights_only
        >>> folder = Path(tempfile.mkdtemp())
        >>> save_weights_only(folder / "a.pt", {"milestones": collections.Counter([5, 15])})
        >>> try:
        ...     save_weights_only(folder / "b.pt", {"scheduler": {"fn": print}})
        ... except CheckpointError as error:
        ...     print(str(error).split(":")[0])
        checkpoint['scheduler']['fn'] is a builtin_function_or_method
        >>> sorted(p.name for p in folder.iterdir())
        ['a.pt']
    """

    def write(f: Any) -> None:
        try:
            torch.save(payload, f)
        except OSError:
            raise
        except Exception as exc:  # PicklingError: a lambda, a local class
            raise _refusal(payload, exc) from exc

    def verify(tmp: Path) -> None:
        try:
            torch.load(tmp, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # UnpicklingError: a global the weights-only loader does not allow
            raise _refusal(payload, exc) from exc

    _atomic_write(Path(path), write, verify)


def read_checkpoint(
    path: str | os.PathLike[str], map_location: Any = None, mmap: bool = False
) -> dict[str, Any]:
    """Load one checkpoint file with ``weights_only=True`` and check its entries.

    Args:
        path: The file.
        map_location: As in ``torch.load``.
        mmap: Map the tensors instead of reading them: a cheap check of the whole file.

    Raises:
        CheckpointError: Naming the file: it does not exist, is torn, would run code, is not a
            checkpoint of this format, misses an entry, or holds an entry of the wrong type.

    Example:
        >>> import tempfile
        >>> import torch
        >>> from pathlib import Path
        >>> from trainopt.stability.checkpointing.files import CheckpointError, read_checkpoint
        >>> path = Path(tempfile.mkdtemp()) / "checkpoint_step_1.pt"
        >>> torch.save({"model": {}}, path)
        >>> try:
        ...     read_checkpoint(path)
        ... except CheckpointError as error:
        ...     print(error)
        checkpoint file .../checkpoint_step_1.pt is not a trainopt.stability.checkpoint/1 checkpoint
    """
    try:
        try:
            payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
        except RuntimeError as exc:
            if not (mmap and "mmap can only be used" in str(exc)):
                raise
            payload = torch.load(path, map_location=map_location, weights_only=True)  # says why
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} does not exist") from None
    except Exception as exc:  # UnpicklingError for forbidden globals, zip/EOF errors for torn files
        unsafe = "weights_only" in str(exc) or "Unsupported global" in str(exc)
        what = (
            "refused to load (it would run code: not a weights-only checkpoint)"
            if unsafe
            else "is corrupt or truncated"
        )
        raise CheckpointError(
            f"checkpoint file {path} {what}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint file {path} is not a {FORMAT} checkpoint")
    missing = [k for k in _FIELDS if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint file {path} is incomplete: missing {missing}")
    for key, kinds in _FIELDS.items():
        value = payload[key]
        if (
            not isinstance(value, kinds)
            or (key in ("step", "loss") and isinstance(value, bool))
            or (key == "step" and value < 0)
        ):
            allowed = (
                "a non-negative int" if key == "step" else " or ".join(k.__name__ for k in kinds)
            )
            raise CheckpointError(
                f"checkpoint file {path}: {key} is a {type(value).__name__}, must be {allowed}"
            )
    return payload
