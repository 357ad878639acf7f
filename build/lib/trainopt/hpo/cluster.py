"""Workers on a cluster: who a worker is, which device it uses, and how it leaves on SIGTERM.

A scheduler starts each worker with a few environment variables; the command line reads them:

- **Worker id**: ``SLURM_ARRAY_TASK_ID`` (a Slurm job array), ``JOB_COMPLETION_INDEX`` (a
  Kubernetes indexed Job) or ``RANK`` (torchrun), recorded on each trial the worker runs.
- **Local rank**: ``LOCAL_RANK`` (torchrun), else ``SLURM_LOCALID``, else 0. With
  ``--device auto`` the worker trains on ``cuda:<local rank>`` (modulo the visible devices).

Slurm (at a time limit or a preemption) and Kubernetes (when a pod is evicted or deleted) send
SIGTERM, then SIGKILL after a grace period. Inside :func:`leave_on_sigterm`, SIGTERM stops
the trial that runs, the worker queues it again with its parameters (as for Ctrl-C), and exits
with status 143: no slot of the budget is lost, and a requeued job, or any other worker, runs
the trial again.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import optuna

SIGTERM_STATUS = 128 + signal.SIGTERM
"""The exit status of a worker stopped by SIGTERM (143, as the shell reports a process it
killed)."""

WORKER_ID_VARIABLES = (
    ("SLURM_ARRAY_TASK_ID", "slurm-array"),
    ("JOB_COMPLETION_INDEX", "k8s-index"),
    ("RANK", "rank"),
)
"""Where a worker's id comes from, first match wins: variable, label."""

LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID")
"""Where a worker's local rank (its index among the workers of one machine) comes from."""


def worker_id(env: Mapping[str, str] | None = None) -> str | None:
    """The worker's id from its scheduler's environment, or ``None`` when started by hand.

    Example:
        >>> from trainopt.hpo.cluster import worker_id
        >>> worker_id({"SLURM_ARRAY_JOB_ID": "812", "SLURM_ARRAY_TASK_ID": "3"})
        'slurm-array:812_3'
        >>> worker_id({"JOB_COMPLETION_INDEX": "5"}), worker_id({})
        ('k8s-index:5', None)
    """
    env = os.environ if env is None else env
    for variable, label in WORKER_ID_VARIABLES:
        if env.get(variable, "").strip():
            job = (
                env.get("SLURM_ARRAY_JOB_ID", "").strip()
                if variable == "SLURM_ARRAY_TASK_ID"
                else ""
            )
            return f"{label}:{job + '_' if job else ''}{env[variable].strip()}"
    return None


def local_rank(env: Mapping[str, str] | None = None) -> int:
    """The worker's index among the workers of its machine (0 when no launcher says).

    Example:
        >>> from trainopt.hpo.cluster import local_rank
        >>> local_rank({"LOCAL_RANK": "2"}), local_rank({"SLURM_LOCALID": "1"}), local_rank({})
        (2, 1, 0)
    """
    env = os.environ if env is None else env
    for variable in LOCAL_RANK_VARIABLES:
        text = env.get(variable, "").strip()
        if text:
            if not text.isdigit():
                raise ValueError(f"{variable} must be a non-negative int, got {text!r}")
            return int(text)
    return 0


def resolve_device(
    text: str, env: Mapping[str, str] | None = None, cuda_count: int | None = None
) -> str:
    """The device ``--device TEXT`` names, checked against the machine; ``ValueError`` says what
    is allowed.

    ``cpu``, ``cuda`` (the current CUDA device), ``cuda:N`` (N below the number of visible
    devices), or ``auto``: ``cuda:<local rank modulo the device count>`` where CUDA is
    available, else ``cpu``.

    Example:
        >>> from trainopt.hpo.cluster import resolve_device
        >>> (resolve_device("auto", {"LOCAL_RANK": "3"}, cuda_count=2),
        ...  resolve_device("auto", cuda_count=0))
        ('cuda:1', 'cpu')
        >>> try:
        ...     resolve_device("cuda:2", cuda_count=2)
        ... except ValueError as error:
        ...     print(error)
        cuda:2 is not a device here: this machine has 2 CUDA devices (cuda:0 to cuda:1)
    """
    import torch

    count = torch.cuda.device_count() if cuda_count is None else cuda_count
    allowed = "give cpu, cuda, cuda:N or auto"
    if text == "auto":
        return f"cuda:{local_rank(env) % count}" if count else "cpu"
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise ValueError(f"{text!r} is not a device; {allowed}") from None
    if device.type == "cpu" and device.index is None:
        return "cpu"
    if device.type != "cuda":
        raise ValueError(f"{text!r} is not supported; {allowed}")
    if count == 0:
        raise ValueError(
            f"{text} is not available: this machine has no CUDA device; give cpu or auto"
        )
    if device.index is not None and device.index >= count:
        devices = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        raise ValueError(
            f"{text} is not a device here: this machine has {count} CUDA "
            f"device{'s' if count > 1 else ''} ({devices})"
        )
    return str(device)


class Terminated(SystemExit):
    """SIGTERM stopped the worker: a ``SystemExit`` with status 143, raised where the worker was.

    Optuna records no state for it (it catches ``Exception`` and ``KeyboardInterrupt`` only),
    and :func:`~trainopt.hpo.workers.run_worker` queues the trial it stopped again, then lets it
    through, as it does for Ctrl-C.

    Example:
        >>> from trainopt.hpo.cluster import Terminated
        >>> stopped = Terminated(trial=3)
        >>> stopped.code, stopped.trial, isinstance(stopped, SystemExit)
        (143, 3, True)
    """

    def __init__(self, trial: int | None = None) -> None:
        super().__init__(SIGTERM_STATUS)
        self.trial = trial


@dataclass
class Running:
    """What :func:`leave_on_sigterm` shares with the worker's objective.

    Attributes:
        trial: The number of the trial whose objective runs now (``None`` between trials).
        signalled: Whether SIGTERM arrived.

    Example:
        >>> from trainopt.hpo.cluster import Running
        >>> Running()
        Running(trial=None, signalled=False)
    """

    trial: int | None = None
    signalled: bool = False

    def track(self, objective: Any) -> Any:
        """``objective(trial, params)`` that notes the trial it runs.

        Example:
            >>> from types import SimpleNamespace
            >>> from trainopt.hpo.cluster import Running
            >>> running = Running()
            >>> tracked = running.track(lambda trial, params: running.trial)
            >>> tracked(SimpleNamespace(number=7), {}), running.trial
            (7, None)
        """

        def run(trial: optuna.Trial, params: dict[str, Any]) -> Any:
            self.trial = trial.number
            try:
                return objective(trial, params)
            finally:
                self.trial = None

        return run


@contextmanager
def leave_on_sigterm() -> Iterator[Running]:
    """While active, the first SIGTERM raises :class:`Terminated` where the worker is; later ones
    wait.

    The worker queues the trial it stopped again and exits (its status: 143). A second SIGTERM
    while it does so is ignored, so that the trial is not lost half-way. The previous handler
    comes back on exit.

    Example:
        >>> import os
        >>> import signal
        >>> from trainopt.hpo.cluster import Terminated, leave_on_sigterm
        >>> try:
        ...     with leave_on_sigterm() as running:
        ...         os.kill(os.getpid(), signal.SIGTERM)
        ... except Terminated as stopped:
        ...     print(stopped.code, running.signalled)
        143 True
    """
    running = Running()

    def handler(signum: int, frame: Any) -> None:
        if not running.signalled:
            running.signalled = True
            raise Terminated(running.trial)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield running
    finally:
        signal.signal(signal.SIGTERM, previous)
