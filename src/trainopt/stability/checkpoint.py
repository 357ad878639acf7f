"""Crash-safe, code-free checkpoints: everything a run needs to resume bit for bit.

:class:`CheckpointManager` writes ``<save_dir>/checkpoint_step_<step>.pt`` and
``best_checkpoint.pt`` holding the model, the optimizer, the scheduler, the loss scaler, any
other stateful helper (clippers, monitors: anything with ``state_dict()``), the step, the loss
and the Python, NumPy, torch and CUDA random number generator states.

- **Atomic.** Each file is written to a temporary file in the same directory, flushed,
  ``fsync``-ed, renamed over the target with ``os.replace`` and the directory is ``fsync``-ed:
  a crash leaves either the old file or the new one, never half of one.
- **No code on load.** Every load uses ``torch.load(..., weights_only=True)``. Everything saved
  is tensors and plain Python values (RNG states included), checked before writing, so a
  legitimate checkpoint always loads that way and a crafted pickle is refused with
  :class:`CheckpointError`.
- **Corruption-tolerant.** :meth:`CheckpointManager.load_latest` skips a truncated or corrupt
  file with a warning naming it and falls back to the newest valid one.
"""

from __future__ import annotations

import math
import os
import re
import uuid
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from trainopt.stability.fit import load_all_or_nothing
from trainopt.stability.rng import get_rng_state, set_rng_state

__all__ = ["CheckpointError", "CheckpointManager"]


FORMAT = "trainopt.stability.checkpoint/1"


_STEP_FILE = re.compile(r"^checkpoint_step_(\d+)\.pt$")


_REQUIRED = ("format", "step", "loss", "model", "optimizer", "scheduler", "scaler", "extra", "rng")


_LEAVES = (int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device, torch.Size)


_CONTAINERS = (dict, OrderedDict, list, tuple, set)


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


def _check_plain(value: Any, where: str) -> None:
    """Raise if ``value`` holds anything ``torch.load(weights_only=True)`` would refuse."""
    if isinstance(value, torch.Tensor) or type(value) in _LEAVES:
        return
    if type(value) not in _CONTAINERS:
        raise CheckpointError(
            f"{where} is a {type(value).__name__}: checkpoints hold only tensors and plain Python values "
            f"(dict, list, tuple, int, float, str, ...) so that they load with weights_only=True; "
            f"convert it in its state_dict()"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, f"{where} key")
            _check_plain(item, f"{where}[{key!r}]")
        return
    for index, item in enumerate(value):
        _check_plain(item, f"{where}[{index}]")


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


def _atomic_write(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _read(path: Path, map_location: Any = None) -> dict[str, Any]:
    """Load and validate one checkpoint file; raise :class:`CheckpointError` naming it."""
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint file {path} does not exist") from None
    except Exception as exc:  # UnpicklingError for forbidden globals, zip/EOF errors for torn files
        unsafe = "weights_only" in str(exc) or "Unsupported global" in str(exc)
        what = "refused to load (it would run code: not a weights-only checkpoint)" if unsafe \
            else "is corrupt or truncated"
        raise CheckpointError(f"checkpoint file {path} {what}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint file {path} is not a {FORMAT} checkpoint")
    missing = [k for k in _REQUIRED if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint file {path} is incomplete: missing {missing}")
    return payload


class CheckpointManager:
    """Save and restore complete training state atomically; keep the last few and the best.

    Args:
        save_dir: Directory of the checkpoints (created if missing).
        save_frequency: :meth:`should_save` is true every this many steps.
        keep_last: Step checkpoints kept (older ones are deleted after each save); ``None``
            keeps all. ``best_checkpoint.pt`` is kept besides them; it is a hard link to the
            step file where the filesystem allows (no second write), a copy elsewhere.

    Example:
        >>> import torch
        >>> from trainopt.stability import CheckpointManager
        >>> import tempfile
        >>> model = torch.nn.Linear(2, 1); opt = torch.optim.AdamW(model.parameters())
        >>> manager = CheckpointManager(tempfile.mkdtemp(), save_frequency=10, keep_last=2)
        >>> for step in (10, 20, 30):
        ...     path = manager.save_checkpoint(model, opt, step, loss=1.0 / step)
        >>> [p.name for p in manager.checkpoints()], manager.best_path.exists()
        (['checkpoint_step_20.pt', 'checkpoint_step_30.pt'], True)
        >>> manager.load_latest(model, opt)
        (30, 0.03333333333333333)
    """

    def __init__(self, save_dir: str | os.PathLike[str], save_frequency: int = 1000, keep_last: int | None = 3):
        if not isinstance(save_frequency, int) or save_frequency < 1:
            raise ValueError(f"save_frequency must be a positive int, got {save_frequency=}")
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last must be a positive int or None, got {keep_last=}")
        self.save_dir = Path(save_dir)
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self.save_frequency = save_frequency
        self.keep_last = keep_last
        self.best_path = self.save_dir / "best_checkpoint.pt"
        self.best_loss = self._existing_best_loss()
        self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> None:
        """Delete temporary files left by writers that were killed (their process is gone)."""
        for tmp in self.save_dir.glob(".*.tmp"):
            parts = tmp.name.split(".")
            try:
                pid = int(parts[-3])
                os.kill(pid, 0)  # raises if no such process
            except (ValueError, IndexError, ProcessLookupError):
                tmp.unlink(missing_ok=True)
            except OSError:  # alive but not ours (PermissionError): leave it
                pass

    def _existing_best_loss(self) -> float:
        if not self.best_path.exists():
            return math.inf
        try:
            return float(_read(self.best_path, map_location="cpu")["loss"])
        except CheckpointError as exc:
            warnings.warn(f"ignoring unreadable {self.best_path}: {exc}", stacklevel=3)
            return math.inf

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is a multiple of ``save_frequency`` (step 0 excluded)."""
        return step > 0 and step % self.save_frequency == 0

    def path_for(self, step: int) -> Path:
        """``<save_dir>/checkpoint_step_<step>.pt``."""
        return self.save_dir / f"checkpoint_step_{int(step)}.pt"

    def checkpoints(self) -> list[Path]:
        """Step checkpoint files on disk, oldest step first."""
        found = [(int(m.group(1)), p) for p in self.save_dir.iterdir() if (m := _STEP_FILE.match(p.name))]
        return [p for _, p in sorted(found)]

    def save_checkpoint(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        step: int,
        loss: float | torch.Tensor,
        scheduler: Any = None,
        scaler: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Write ``checkpoint_step_<step>.pt`` (always) and ``best_checkpoint.pt`` (if best).

        The best is the lowest finite loss seen by this directory; a NaN or infinite loss is
        never best. Call it when :meth:`should_save` says so, or whenever you want a checkpoint.

        Args:
            model, optimizer, scheduler, scaler: Saved through their ``state_dict()``.
            step: Training step (a non-negative int) that names the file.
            loss: The loss to rank by (a float or a 0-d tensor; read on the host once).
            extra: Named objects with ``state_dict()`` (clippers, monitors, recovery state).

        Returns:
            The path of the step checkpoint.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step=}")
        loss = float(loss.item() if isinstance(loss, torch.Tensor) else loss)
        extra = extra or {}
        for name, obj in extra.items():
            if not hasattr(obj, "state_dict"):
                raise TypeError(f"extra[{name!r}] must have state_dict(), got {type(obj).__name__}")
        payload = {
            "format": FORMAT,
            "step": step,
            "loss": loss,
            "model": model.state_dict(),
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "scaler": None if scaler is None else scaler.state_dict(),
            "extra": {str(name): obj.state_dict() for name, obj in extra.items()},
            "rng": get_rng_state(),
            "torch_version": str(torch.__version__),
        }
        _check_plain(payload, "checkpoint")
        path = self.path_for(step)
        _atomic_write(path, lambda f: torch.save(payload, f))
        if not math.isnan(loss) and loss < self.best_loss:
            self._copy_to_best(path)
            self.best_loss = loss
        self._prune()
        return path

    def _copy_to_best(self, path: Path) -> None:
        tmp = self.best_path.with_name(f".{self.best_path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            os.link(path, tmp)  # a second name for the finished file: no second write
        except OSError:
            _atomic_write(self.best_path, lambda f: f.write(path.read_bytes()))
            return
        os.replace(tmp, self.best_path)
        _fsync_dir(self.save_dir)

    def _prune(self) -> None:
        if self.keep_last is None:
            return
        for old in self.checkpoints()[: -self.keep_last]:
            old.unlink(missing_ok=True)

    def load_checkpoint(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        checkpoint_path: str | os.PathLike[str],
        scheduler: Any = None,
        scaler: Any = None,
        extra: dict[str, Any] | None = None,
        map_location: Any = None,
        restore_rng: bool = True,
    ) -> tuple[int, float]:
        """Load a checkpoint into the given objects; return ``(step, loss)``.

        The file is read with ``weights_only=True``. Loading is all or nothing: a file that cannot
        be read, or that does not fit one of the objects (the model's keys or shapes, the
        optimizer's groups, the scheduler, the scaler, an extra object), raises
        :class:`CheckpointError` naming the file, the object and what does not fit, and leaves
        every object as it was (:func:`~trainopt.stability.fit.load_all_or_nothing`). Objects
        passed here must have been saved (a scheduler missing from the file is an error);
        objects not passed are left alone.
        """
        path = Path(checkpoint_path)
        return self._apply(_read(path, map_location), path, model, optimizer, scheduler, scaler, extra, restore_rng)

    @staticmethod
    def _apply(
        payload: dict[str, Any], path: Path, model: torch.nn.Module, optimizer: Any, scheduler: Any,
        scaler: Any, extra: dict[str, Any] | None, restore_rng: bool,
    ) -> tuple[int, float]:
        wanted = {"optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
        absent = [name for name, obj in wanted.items() if obj is not None and payload[name] is None]
        absent += [f"extra[{name!r}]" for name in (extra or {}) if name not in payload["extra"]]
        if absent:
            raise CheckpointError(f"checkpoint file {path} has no state for {absent}")
        pieces = [("optimizer", optimizer, payload["optimizer"]), ("scheduler", scheduler, payload["scheduler"]),
                  ("scaler", scaler, payload["scaler"])]
        pieces += [(f"extra[{name!r}]", obj, payload["extra"][name]) for name, obj in (extra or {}).items()]
        load_all_or_nothing(model, payload["model"], pieces,
                            lambda piece, why: CheckpointError(f"checkpoint file {path} does not fit the {piece}: {why}"))
        if restore_rng:
            set_rng_state(payload["rng"])
        return int(payload["step"]), float(payload["loss"])

    def load_latest(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        scheduler: Any = None,
        scaler: Any = None,
        extra: dict[str, Any] | None = None,
        map_location: Any = None,
        restore_rng: bool = True,
    ) -> tuple[int, float] | None:
        """Load the newest valid step checkpoint (then the best one); ``None`` if there is none.

        A file that cannot be read (truncated, corrupt, not weights-only) is skipped with a
        warning naming it. Errors of fit (a checkpoint of another model) are raised.
        """
        found = self._newest_readable(map_location)
        if found is None:
            return None
        path, payload = found
        return self._apply(payload, path, model, optimizer, scheduler, scaler, extra, restore_rng)

    def _newest_readable(self, map_location: Any = None) -> tuple[Path, dict[str, Any]] | None:
        for path in [*reversed(self.checkpoints()), self.best_path]:
            if not path.exists():
                continue
            try:
                return path, _read(path, map_location)
            except CheckpointError as exc:
                warnings.warn(f"skipping checkpoint {path}: {exc}", stacklevel=3)
        return None

    def latest_path(self) -> Path | None:
        """The file :meth:`load_latest` would load: the newest readable step checkpoint, or the best.

        Example:
            >>> import tempfile
            >>> import torch
            >>> from trainopt.stability import CheckpointManager
            >>> manager = CheckpointManager(tempfile.mkdtemp())
            >>> model = torch.nn.Linear(2, 1)
            >>> manager.latest_path() is None
            True
            >>> _ = manager.save_checkpoint(model, None, 7, loss=1.0)
            >>> manager.latest_path().name
            'checkpoint_step_7.pt'
        """
        found = self._newest_readable("cpu")
        return None if found is None else found[0]

    def state_dict(self) -> dict[str, Any]:
        """The manager's own state (best loss so far)."""
        return {"best_loss": self.best_loss}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.best_loss = float(state_dict["best_loss"])
