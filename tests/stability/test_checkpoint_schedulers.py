"""Every scheduler survives a restart (issue 21, requirement 3): each class of the installed
``torch.optim.lr_scheduler`` (found by enumerating the module) and each ``trainopt.schedules``
schedule is saved through ``CheckpointManager``, loaded into objects built from scratch, and run
on: rates and weights equal the uninterrupted run's bit for bit.

Then the same through the stabilizer (``TrainingStabilizer`` with a ``TrainingRecovery`` holding
the manager): every scheduler with objects rebuilt from the files on disk in this process, and a
few with a real SIGKILL of the process that trained them (one process for all of them: a
torch import per case would cost seconds each).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from restart_runs import (
    STEPS,
    build,
    stabilized,
    train_plain,
    train_stabilized,
)
from scheduler_configs import PROJECT, SCHEDULERS, TORCH
from tiny_runs import one_thread
from torch.optim import lr_scheduler as ls

import trainopt.schedules
from trainopt.schedules import SchedulerInterface
from trainopt.schedules.registry import registered_schedulers
from trainopt.stability.checkpointing.checkpoint import CheckpointManager

HERE = Path(__file__).resolve().parent
SHIPPED = frozenset(registered_schedulers())
TORCH_CLASSES = sorted(
    name
    for name, cls in vars(ls).items()
    if isinstance(cls, type)
    and cls.__module__ == ls.__name__
    and (issubclass(cls, ls.LRScheduler) or cls is ls.ReduceLROnPlateau)
    and cls not in (ls.LRScheduler, ls._LRScheduler)
)


def test_every_torch_scheduler_class_and_trainopt_schedule_is_a_case() -> None:
    assert len(TORCH_CLASSES) >= 15, TORCH_CLASSES  # torch 2.13 has 15; a new torch may add some
    assert set(TORCH) == set(TORCH_CLASSES)
    # trainopt's own registrations, as this module was imported (at collection, before any example
    # ran: a page's or a docstring's example in the same worker may register its own later)
    assert SHIPPED and {f"registry: {name}" for name in SHIPPED} <= set(PROJECT)
    exported = [getattr(trainopt.schedules, name) for name in trainopt.schedules.__all__]
    custom = {
        cls.__name__
        for cls in exported
        if isinstance(cls, type)
        and issubclass(cls, SchedulerInterface)
        and cls is not SchedulerInterface
    }
    stateful = {
        cls
        for cls in exported
        if isinstance(cls, type) and (issubclass(cls, ls.LRScheduler) or hasattr(cls, "update_lr"))
    }
    built = {type(make(build("StepLR", 0)[1])) for make in PROJECT.values()}
    assert custom <= set(PROJECT) and stateful <= built, (custom, stateful - built)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("k", [5, 17])
@pytest.mark.parametrize("name", SCHEDULERS)
def test_saved_loaded_into_fresh_objects_and_run_on_equals_the_uninterrupted_run(
    tmp_path, name, k
) -> None:
    straight = build(name, seed=0)
    expected = train_plain(straight, 0, STEPS)

    first = build(name, seed=0)
    train_plain(first, 0, k)
    model, opt, sched = first
    CheckpointManager(tmp_path).save_checkpoint(model, opt, k, 0.5, scheduler=sched)
    del first, model, opt, sched

    resumed = build(name, seed=7)  # other weights, other generator state: a fresh process
    assert CheckpointManager(tmp_path).load_latest(
        resumed[0], resumed[1], scheduler=resumed[2]
    ) == (k, 0.5)
    assert train_plain(resumed, k, STEPS) == expected[k:]
    assert _same_weights(resumed[0], straight[0])
    assert len({tuple(r) for r in expected}) > 1  # the schedule moved


# ------------------------------------------------------------------ through the stabilizer

KILLED_AT, RESUMED_AT = 27, 20  # killed after the step-20 checkpoint, before the step-30 one


def _case(name: str):
    return pytest.param(name, id=name)


def _resume_and_finish(folder: Path, name: str) -> tuple[dict, list[list[float]]]:
    run = stabilized(name, folder, seed=7)
    assert run["stabilizer"].resume() == RESUMED_AT
    return run, train_stabilized(run, RESUMED_AT, STEPS)


@pytest.mark.parametrize("name", [_case(name) for name in SCHEDULERS])
def test_a_stabilized_run_rebuilt_from_its_files_finishes_as_the_uninterrupted_run(
    tmp_path, name
) -> None:
    straight = stabilized(name, tmp_path / "straight", seed=0)
    expected = train_stabilized(straight, 0, STEPS)

    train_stabilized(
        stabilized(name, tmp_path / "run", seed=0), 0, KILLED_AT
    )  # then dropped, unsaved
    resumed, seen = _resume_and_finish(tmp_path / "run", name)
    assert seen == expected[RESUMED_AT:]
    assert _same_weights(resumed["model"], straight["model"])
    assert len({tuple(r) for r in expected}) > 1 and not _same_weights(
        straight["model"], build(name, 0)[0]
    )


KILLED = [
    "MultiStepLR",
    "OneCycleLR",
    "registry: wsd",
]  # a Counter in the state, cycled momentum, a trainopt schedule

CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[1])
    import torch
    torch.set_num_threads(1)
    from restart_runs import stabilized, train_stabilized
    for name, folder in zip(sys.argv[3::2], sys.argv[4::2]):
        train_stabilized(stabilized(name, folder, seed=0), 0, int(sys.argv[2]))
    print("trained", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_a_stabilized_run_sigkilled_after_a_checkpoint_resumes_in_another_process_bitwise(
    tmp_path,
) -> None:
    folders = {name: tmp_path / f"run{i}" for i, name in enumerate(KILLED)}
    args = [str(HERE), str(KILLED_AT)] + [x for name in KILLED for x in (name, str(folders[name]))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert child.stdout.split() == ["trained"]
    with one_thread():
        for name in KILLED:
            straight = stabilized(name, tmp_path / f"straight-{name}", seed=0)
            expected = train_stabilized(straight, 0, STEPS)
            resumed, seen = _resume_and_finish(folders[name], name)
            assert seen == expected[RESUMED_AT:], name
            assert _same_weights(resumed["model"], straight["model"]), name
