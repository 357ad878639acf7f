"""Start and join local process groups: one process per rank, errors reported with their rank."""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import os
import signal
import socket
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainopt.validation import check_int


class WorkerError(RuntimeError):
    """A function run by :func:`launch` raised on one rank; the message names the rank.

    Example:
        >>> from trainopt.perf.distributed import WorkerError
        >>> error = WorkerError(1, "ValueError: bad batch")
        >>> error.rank, str(error).splitlines()
        (1, ['rank 1 failed:', 'ValueError: bad batch'])
    """

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(f"rank {rank} failed:\n{message}")
        self.rank = rank


class WorkerTimeoutError(WorkerError):
    """Ranks started by :func:`launch` did not finish by its deadline; they were stopped.

    ``ranks`` lists the ranks still running at the deadline (``rank`` is the first of them); the
    message names them and, on POSIX, shows where each one was (its Python stack).

    Example:
        >>> from trainopt.perf.distributed.processes import WorkerTimeoutError
        >>> error = WorkerTimeoutError([1], 30.0, "")
        >>> error.rank, error.ranks, str(error)
        (1, [1], 'rank 1 did not finish within 30 s: stopped')
    """

    def __init__(self, ranks: list[int], timeout: float, stacks: str) -> None:
        names = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        RuntimeError.__init__(self, f"{names} did not finish within {timeout:g} s: stopped{stacks}")
        self.rank, self.ranks = ranks[0], list(ranks)


def default_backend(nprocs: int) -> str:
    """``"nccl"`` when there is one CUDA device per process, else ``"gloo"`` (CPU).

    Example:
        >>> from trainopt.perf.distributed.processes import default_backend
        >>> default_backend(1) in ("gloo", "nccl")
        True
    """
    if (
        torch.cuda.is_available()
        and torch.cuda.device_count() >= nprocs
        and dist.is_nccl_available()
    ):
        return "nccl"
    return "gloo"


def free_port() -> int:
    """A TCP port on the loopback that was free a moment ago (the OS picks it).

    Example:
        >>> from trainopt.perf.distributed.processes import free_port
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_device() -> torch.device:
    """The device of this rank: ``cuda:<LOCAL_RANK>`` under NCCL, else the CPU.

    Example:
        >>> from trainopt.perf.distributed.processes import rank_device
        >>> from trainopt.perf.distributed import single_process_group
        >>> with single_process_group("gloo"):
        ...     rank_device()
        device(type='cpu')
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_from_env(backend: str | None = None, timeout: float | None = None) -> torch.device:
    """Join the process group that ``torchrun`` describes in the environment; return the device.

    Reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` (``init_method="env://"``).
    Under NCCL it first calls ``torch.cuda.set_device(LOCAL_RANK)``: without it every process
    of a node creates its NCCL communicator and its first allocations on ``cuda:0``, which
    runs that GPU out of memory or hangs the first collective.

    Args:
        backend: ``"nccl"`` or ``"gloo"``; ``None`` picks NCCL when CUDA is available.
        timeout: Seconds a collective may wait for the other ranks before it raises; ``None``
            keeps torch's default (10 minutes for NCCL, 30 for gloo).

    Returns:
        ``cuda:<LOCAL_RANK>`` under NCCL, else the CPU.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> import torch.distributed as dist
        >>> from trainopt.perf.distributed import init_from_env
        >>> from trainopt.perf.distributed.processes import free_port
        >>> env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
        ...        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        >>> with mock.patch.dict(os.environ, env):
        ...     device = init_from_env("gloo")
        >>> device, dist.get_world_size()
        (device(type='cpu'), 1)
        >>> dist.destroy_process_group()
        >>> dist.is_initialized()
        False
    """
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    kwargs = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
    dist.init_process_group(backend, init_method="env://", **kwargs)
    return device


@contextlib.contextmanager
def single_process_group(backend: str = "gloo") -> Iterator[None]:
    """A process group of this one process (world size 1): run distributed code without spawning.

    Handy to step through DDP or FSDP2 code in a debugger, and for quick checks.

    Example:
        >>> import torch.distributed as dist
        >>> from trainopt.perf.distributed import rank_and_world_size
        >>> from trainopt.perf.distributed import single_process_group
        >>> with single_process_group():
        ...     rank_and_world_size()
        (0, 1)
        >>> dist.is_initialized()
        False
    """
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _start_method() -> str:
    """How :func:`launch` starts its ranks: ``"forkserver"`` where the platform has it (Linux,
    macOS), ``"spawn"`` elsewhere. Either way a rank is a fresh process that imports ``fn`` by
    name and shares no state with the caller; a forkserver imports torch once, and each rank
    forks from it in milliseconds instead of importing torch again (about 3 s a launch on a CPU).
    """
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(["torch", __name__])  # read when the server starts
    return "forkserver"


def _run_rank(
    rank: int,
    fn: Callable[..., Any],
    args: tuple,
    nprocs: int,
    port: int,
    backend: str,
    out_dir: str,
    collective_timeout: float,
    environ: dict[str, str],
) -> None:
    # The caller's environment as it is now (a forkserver's ranks would otherwise see the
    # environment from when the server started).
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(nprocs),
    )
    if hasattr(signal, "SIGUSR1"):  # launch asks a rank that is late where it is
        stack = (Path(out_dir) / f"rank{rank}.stack").open("w")
        faulthandler.register(signal.SIGUSR1, file=stack, all_threads=True)
    if backend == "gloo":  # as torchrun does: N processes must not each start one thread per core
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nprocs))
    init_from_env(backend, timeout=collective_timeout)
    try:
        result = fn(*args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()  # leave together: a rank that tears down early can abort a peer's gloo
    except BaseException:
        # Other ranks fail next (a peer vanished mid-collective): keep the time to find the first.
        (Path(out_dir) / f"rank{rank}.error").write_text(
            f"{time.time()!r}\n{traceback.format_exc()}"
        )
        raise
    finally:
        dist.destroy_process_group()


def _first_error(out_dir: str) -> WorkerError | None:
    errors = []
    for path in Path(out_dir).glob("rank*.error"):
        stamp, _, message = path.read_text().partition("\n")
        errors.append((float(stamp), int(path.stem[4:]), message))
    if not errors:
        return None
    errors.sort()
    _, rank, message = errors[0]
    # a peer that vanished mid-collective fails its partners within milliseconds, so the first
    # stamp is not always the cause: every other rank's last line goes along
    others = [
        f"rank {r}: {m.strip().splitlines()[-1] if m.strip() else '?'}" for _, r, m in errors[1:]
    ]
    if others:
        message = message.rstrip("\n") + "\nother ranks failed too:\n" + "\n".join(others) + "\n"
    return WorkerError(rank, message)


def _stop_late(context: Any, out_dir: str, timeout: float) -> WorkerTimeoutError:
    """Stop the ranks still running (their stacks first, where the OS can say); name them."""
    late = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
    if hasattr(signal, "SIGUSR1"):
        for rank in late:
            with contextlib.suppress(ProcessLookupError):
                os.kill(context.processes[rank].pid, signal.SIGUSR1)
        time.sleep(0.5)
    for rank in late:
        context.processes[rank].terminate()
    for rank in late:
        context.processes[rank].join(2.0)
        if context.processes[rank].is_alive():
            context.processes[rank].kill()
            context.processes[rank].join()
    stacks = ""
    for rank in late:
        path = Path(out_dir) / f"rank{rank}.stack"
        text = path.read_text().strip() if path.exists() else ""
        stacks += f"\n--- rank {rank} was in:\n{text}" if text else ""
    return WorkerTimeoutError(late, timeout, stacks)


def launch(
    fn: Callable[..., Any],
    nprocs: int,
    *args: Any,
    backend: str | None = None,
    timeout: float | None = 3600.0,
    collective_timeout: float = 60.0,
) -> list[Any]:
    """Run ``fn(*args)`` on ``nprocs`` local processes joined in one process group, by a deadline.

    Each process gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT`` (a free loopback port) in its environment, as ``torchrun`` sets them, and
    joins the default group with ``init_method="env://"``. ``fn`` must be importable (defined
    in a module, not in ``__main__`` or a notebook): each rank is a fresh process (started by a
    forkserver that has imported torch once, or spawned where there is none) with the caller's
    environment. Its result must be made of tensors, numbers, strings, lists and dicts.

    Nothing waits forever: a collective that waits more than ``collective_timeout`` seconds for
    the other ranks raises on its rank (ranks that disagree on the collectives they call, for
    example), and ranks still running ``timeout`` seconds after the start are stopped.

    Args:
        fn: The function each rank runs; it reads its rank from ``torch.distributed``.
        nprocs: Number of processes (the world size), at least 1.
        *args: Passed to ``fn`` on every rank.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per process); ``None`` picks
            :func:`default_backend`.
        timeout: Seconds from the start until the ranks still running are stopped (the start
            of the processes included); ``None`` waits for ever.
        collective_timeout: The process group's timeout, in seconds: how long a collective waits.

    Returns:
        The results of ``fn``, indexed by rank.

    Raises:
        WorkerError: ``fn`` raised on some rank; the message names the rank that failed
            first and has its traceback. The other ranks are stopped.
        WorkerTimeoutError: Ranks were still running at the deadline (a subclass of
            ``WorkerError``); the message names them and shows where each one was.

    Example:
        >>> from trainopt.perf.distributed import launch
        >>> from trainopt.perf.distributed import rank_and_world_size
        >>> launch(rank_and_world_size, 2)
        [(0, 2), (1, 2)]
    """
    check_int("nprocs", nprocs, 1)
    backend = backend or default_backend(nprocs)
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None, got {backend=}")
    if backend == "nccl" and torch.cuda.device_count() < nprocs:
        raise ValueError(
            f"backend='nccl' needs one GPU per process: {nprocs=}, "
            f"{torch.cuda.device_count()} visible"
        )
    for name, value in (("timeout", timeout), ("collective_timeout", collective_timeout)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0
        ):
            raise ValueError(f"{name} must be a positive number of seconds, got {name}={value!r}")
    deadline = None if timeout is None else time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="trainopt-launch-") as out_dir:
        try:
            context = mp.start_processes(
                _run_rank,
                args=(
                    fn,
                    args,
                    nprocs,
                    free_port(),
                    backend,
                    out_dir,
                    float(collective_timeout),
                    dict(os.environ),
                ),
                nprocs=nprocs,
                join=False,
                start_method=_start_method(),
            )
            while not context.join(
                None if deadline is None else max(0.0, deadline - time.monotonic()),
                grace_period=5.0,
            ):
                if deadline is not None and time.monotonic() >= deadline:
                    raise _stop_late(context, out_dir, timeout)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            error = _first_error(out_dir)
            finished = all((Path(out_dir) / f"rank{r}.pt").exists() for r in range(nprocs))
            if error is not None or not finished:
                raise error or WorkerError(exc.error_index, str(exc)) from None
            warnings.warn(
                f"every rank returned its result, then: {exc}", RuntimeWarning, stacklevel=2
            )
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=True) for r in range(nprocs)]


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of the calling process: the smallest function to :func:`launch`.

    Example:
        >>> from trainopt.perf.distributed import rank_and_world_size
        >>> from trainopt.perf.distributed import single_process_group
        >>> with single_process_group():
        ...     rank_and_world_size()
        (0, 1)
    """
    return dist.get_rank(), dist.get_world_size()
