"""Crash-safe, code-free checkpoints: everything a run needs to resume bit for bit.

:class:`CheckpointManager` writes ``<save_dir>/checkpoint_step_<step>.pt`` and
``best_checkpoint.pt`` holding the model, the optimizer, the scheduler, the loss scaler, any
other stateful helper (clippers, monitors: anything with ``state_dict()``), the step, the loss
and the Python, NumPy, torch and CUDA random number generator states.

- **Atomic.** Each file is written to a temporary file in the same directory, flushed,
  ``fsync``-ed, renamed over the target with ``os.replace`` and the directory is ``fsync``-ed:
  a crash leaves either the old file or the new one, never half of one.
- **No code on load.** Every load uses ``torch.load(..., weights_only=True)``. Before the rename,
  the written file is read back that way (memory-mapped: the tensors are not read), so a save
  accepts exactly what the installed torch's ``weights_only`` loader accepts (``Counter`` and
  ``OrderedDict`` included), and refuses anything else naming the entry
  (:mod:`~trainopt.stability.checkpointing.files`). A crafted pickle is refused on load with
  :class:`~trainopt.stability.checkpointing.files.CheckpointError`.
- **Newest by the step it holds.** The file name carries the step, and each file's name is
  checked against the step in its payload (read once per file, memory-mapped): a renamed or
  copied file is ordered by the step it holds, never by its name.
- **Corruption-tolerant.** :meth:`CheckpointManager.load_latest` skips a truncated or corrupt
  file with a warning naming it and falls back to the newest valid one.
- **Every load failure is a** :class:`~trainopt.stability.checkpointing.files.CheckpointError`
  naming the file and the piece, and a load changes everything or nothing
  (:func:`~trainopt.stability.checkpointing.fit.load_all_or_nothing`).
"""

from __future__ import annotations

import math
import os
import re
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch

from trainopt.stability.checkpointing.files import (
    FORMAT,
    CheckpointError,
    _atomic_write,
    _fsync_dir,
    read_checkpoint,
    save_weights_only,
)
from trainopt.stability.checkpointing.fit import load_all_or_nothing
from trainopt.stability.checkpointing.rng import get_rng_state, set_rng_state
from trainopt.stability.config import deprecated_name
from trainopt.validation import check_int

__all__ = ["CheckpointError", "CheckpointManager"]

_STEP_FILE = re.compile(r"^checkpoint_step_(\d+)\.pt$")


class _Generators:
    """The random number generators as a piece of an all-or-nothing load."""

    state_dict = staticmethod(get_rng_state)
    load_state_dict = staticmethod(set_rng_state)


class CheckpointManager:
    """Save and restore complete training state atomically; keep the last few and the best.

    Args:
        save_dir: Directory of the checkpoints (created if missing).
        save_every: :meth:`should_save` is true every this many steps (``save_frequency=``,
            its former name, is deprecated).
        keep_last: Step checkpoints kept (the ones holding the oldest steps are deleted after
            each save); ``None`` keeps all. ``best_checkpoint.pt`` is kept besides them; it is a
            hard link to the step file where the filesystem allows (no second write), a copy
            elsewhere.

    Example:
        >>> import torch
        >>> from trainopt.stability import CheckpointManager
        >>> import tempfile
        >>> model = torch.nn.Linear(2, 1); opt = torch.optim.AdamW(model.parameters())
        >>> manager = CheckpointManager(tempfile.mkdtemp(), save_every=10, keep_last=2)
        >>> for step in (10, 20, 30):
        ...     path = manager.save_checkpoint(model, opt, step, loss=1.0 / step)
        >>> [p.name for p in manager.checkpoints()], manager.best_path.exists()
        (['checkpoint_step_20.pt', 'checkpoint_step_30.pt'], True)
        >>> manager.load_latest(model, opt)
        (30, 0.03333333333333333)
    """

    def __init__(
        self,
        save_dir: str | os.PathLike[str],
        save_every: int = 1000,
        keep_last: int | None = 3,
        *,
        save_frequency: int | None = None,
    ):
        save_every = deprecated_name(
            "CheckpointManager", "save_frequency", save_frequency, save_every, 1000
        )
        check_int("save_every", save_every, 1)
        check_int("keep_last", keep_last, 1, none_ok=True)
        self.save_dir = Path(save_dir)
        self.save_dir.mkdir(parents=True, exist_ok=True)
        self.save_every = save_every
        self.keep_last = keep_last
        self.best_path = self.save_dir / "best_checkpoint.pt"
        self._held: dict[
            str, tuple[tuple[int, int, int], int | None]
        ] = {}  # name -> (stat, step held)
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
            return float(read_checkpoint(self.best_path, map_location="cpu", mmap=True)["loss"])
        except CheckpointError as exc:
            warnings.warn(f"ignoring unreadable {self.best_path}: {exc}", stacklevel=3)
            return math.inf

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is a multiple of ``save_every`` (step 0 excluded)."""
        return step > 0 and step % self.save_every == 0

    @property
    def save_frequency(self) -> int:
        """Deprecated: say :attr:`save_every`."""
        warnings.warn(
            "CheckpointManager.save_frequency is deprecated: say save_every",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.save_every

    def path_for(self, step: int) -> Path:
        """``<save_dir>/checkpoint_step_<step>.pt``."""
        return self.save_dir / f"checkpoint_step_{int(step)}.pt"

    @staticmethod
    def _identity(path: Path) -> tuple[int, int, int]:
        stat = path.stat()
        return stat.st_ino, stat.st_size, stat.st_mtime_ns

    def _step_held(self, path: Path, named: int) -> int | None:
        """The step in the payload of ``path`` (``None``: unreadable), read once per version of
        the file."""
        identity = self._identity(path)
        cached = self._held.get(path.name)
        if cached is not None and cached[0] == identity:
            return cached[1]
        try:
            held: int | None = int(read_checkpoint(path, map_location="cpu", mmap=True)["step"])
        except CheckpointError:
            held = None  # ordered by its name; loading it warns and skips it
        if held is not None and held != named:
            warnings.warn(
                f"checkpoint file {path} holds step {held}, not the {named} its name says "
                "(renamed or copied?): it is ordered by the step it holds",
                stacklevel=4,
            )
        self._held[path.name] = (identity, held)
        return held

    def checkpoints(self) -> list[Path]:
        """Step checkpoint files on disk, ordered by the step each one holds, oldest first.

        The name gives the step; the payload's step (read once per file, memory-mapped) decides.
        An unreadable file is placed by its name; of two files holding the same step, the one
        whose name says it comes last.

        Example:
            >>> import shutil, tempfile
            >>> import torch
            >>> from trainopt.stability import CheckpointManager
            >>> manager = CheckpointManager(tempfile.mkdtemp(), keep_last=None)
            >>> model = torch.nn.Linear(2, 1)
            >>> for step in (10, 20):
            ...     path = manager.save_checkpoint(model, None, step, loss=1.0)
            >>> _ = shutil.copy(manager.path_for(10), manager.path_for(99))  # an old file renamed
            >>> [p.name for p in manager.checkpoints()]  # it holds step 10: not the newest
            ['checkpoint_step_99.pt', 'checkpoint_step_10.pt', 'checkpoint_step_20.pt']
        """
        found = []
        for path in self.save_dir.iterdir():
            if not (match := _STEP_FILE.match(path.name)):
                continue
            named = int(match.group(1))
            try:
                held = self._step_held(path, named)
            except FileNotFoundError:  # pruned by another writer meanwhile
                continue
            found.append(((named if held is None else held, held == named, named), path))
        return [path for _, path in sorted(found)]

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
        The file is read back with ``torch.load(weights_only=True)`` before it replaces anything:
        state that loader refuses raises :class:`CheckpointError` naming the entry, and nothing
        is written.

        Args:
            model, optimizer, scheduler, scaler: Saved through their ``state_dict()``.
            step: Training step (a non-negative int) that names the file.
            loss: The loss to rank by (a float or a 0-d tensor; read on the host once).
            extra: Named objects with ``state_dict()`` (clippers, monitors, recovery state).

        Returns:
            The path of the step checkpoint.
        """
        check_int("step", step, 0)
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
        path = self.path_for(step)
        save_weights_only(path, payload)
        self._held[path.name] = (self._identity(path), step)
        if not math.isnan(loss) and loss < self.best_loss:
            self._copy_to_best(path)
            self.best_loss = loss
        self._prune()
        return path

    def _copy_to_best(self, path: Path) -> None:
        tmp = self.best_path.with_name(
            f".{self.best_path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        )
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
        optimizer's groups or the shapes of its state, the scheduler, the scaler, an extra
        object, the random number generators), raises :class:`CheckpointError` naming the file,
        the object and what does not fit, and leaves every object and generator as it was
        (:func:`~trainopt.stability.checkpointing.fit.load_all_or_nothing`). Objects passed here
        must have been saved (a scheduler missing from the file is an error); objects not passed are
        left alone.
        """
        path = Path(checkpoint_path)
        payload = read_checkpoint(path, map_location)
        return self._apply(payload, path, model, optimizer, scheduler, scaler, extra, restore_rng)

    @staticmethod
    def _apply(
        payload: dict[str, Any],
        path: Path,
        model: torch.nn.Module,
        optimizer: Any,
        scheduler: Any,
        scaler: Any,
        extra: dict[str, Any] | None,
        restore_rng: bool,
    ) -> tuple[int, float]:
        wanted = {"optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
        absent = [name for name, obj in wanted.items() if obj is not None and payload[name] is None]
        absent += [f"extra[{name!r}]" for name in (extra or {}) if name not in payload["extra"]]
        if absent:
            raise CheckpointError(f"checkpoint file {path} has no state for {absent}")
        pieces = [
            ("optimizer", optimizer, payload["optimizer"]),
            ("scheduler", scheduler, payload["scheduler"]),
            ("scaler", scaler, payload["scaler"]),
        ]
        pieces += [
            (f"extra[{name!r}]", obj, payload["extra"][name]) for name, obj in (extra or {}).items()
        ]
        pieces += [
            ("random number generators", _Generators() if restore_rng else None, payload["rng"])
        ]
        load_all_or_nothing(
            model,
            payload["model"],
            pieces,
            lambda piece, why: CheckpointError(
                f"checkpoint file {path} does not fit the {piece}: {why}"
            ),
        )
        return payload["step"], float(payload["loss"])

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

        Newest is the highest step held in a file (see :meth:`checkpoints`). A file that cannot
        be read (truncated, corrupt, not weights-only) is skipped with a warning naming it.
        Errors of fit (a checkpoint of another model) are raised as :class:`CheckpointError`.
        """
        path = self._newest_readable()
        if path is None:
            return None
        payload = read_checkpoint(path, map_location)
        return self._apply(payload, path, model, optimizer, scheduler, scaler, extra, restore_rng)

    def _newest_readable(self) -> Path | None:
        for path in [*reversed(self.checkpoints()), self.best_path]:
            if not path.exists():
                continue
            try:
                read_checkpoint(path, "cpu", mmap=True)
                return path
            except CheckpointError as exc:
                warnings.warn(f"skipping checkpoint {path}: {exc}", stacklevel=3)
        return None

    def latest_path(self) -> Path | None:
        """The file :meth:`load_latest` would load: the newest readable step checkpoint, or
        the best.

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
        return self._newest_readable()

    def state_dict(self) -> dict[str, Any]:
        """The manager's own state (best loss so far)."""
        return {"best_loss": self.best_loss}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.best_loss = float(state_dict["best_loss"])
