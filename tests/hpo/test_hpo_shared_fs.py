"""The journal's budget lock on a shared file system, and fresh attributes on a re-queued trial.

Issue 32, requirement 2. On NFS and Lustre ``fcntl.flock`` may hold nothing across machines (or
nothing at all); the budget lock is a file created with ``open(O_CREAT | O_EXCL)``. The tests
stand in for such a mount by making ``fcntl.flock`` a no-op, in the test and in the worker
process it races.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import optuna
import pytest

import trainopt.hpo.storage as storage_module
from trainopt.hpo import SearchSpace, create_study, open_storage, run_worker
from trainopt.hpo.claims import FreshRetry
from trainopt.hpo.storage import BudgetSpent, waiting_trials_only

X = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})

# A worker that claims a trial and stays inside the claim (between counting the study's trials
# and creating one) for 3 s, on a mount where flock holds nothing.
CLAIMER = """
import fcntl, sys, time
fcntl.flock = lambda *args, **kwargs: None
import optuna
import trainopt.hpo.storage as storage
from trainopt.hpo import open_storage

count = storage._count_in_memory

def slow(*args):
    count(*args)
    print("counted", flush=True)
    time.sleep(3)

storage._count_in_memory = slow
study = optuna.load_study(study_name="lock", storage=open_storage(sys.argv[1], heartbeat=None))
with storage.waiting_trials_only():
    try:
        study.ask()
        print("claimed", flush=True)
    except storage.BudgetSpent:
        print("spent", flush=True)
"""


def _start_claimer(url: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    worker = subprocess.Popen(
        [sys.executable, "-c", CLAIMER, url], env=env, stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout.readline() == "counted\n"  # it is inside its claim, holding the lock
    return worker


def _claim(url: str) -> str:
    study = optuna.load_study(study_name="lock", storage=open_storage(url, heartbeat=None))
    with waiting_trials_only():
        try:
            study.ask()
        except BudgetSpent:
            return "spent"
    return "claimed"


@pytest.fixture
def url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(fcntl, "flock", lambda *args, **kwargs: None)
    url = f"journal:{tmp_path / 'lock.log'}"
    create_study("lock", 1, url, sampler="random", pruner=None, heartbeat=None)
    return url


def test_the_budget_lock_excludes_a_worker_in_another_process_without_flock(url: str) -> None:
    """Two workers claim the last slot at once: one trial, not two (with flock a no-op)."""
    worker = _start_claimer(url)
    start = time.monotonic()
    mine = _claim(url)
    waited = time.monotonic() - start
    theirs = worker.communicate(timeout=60)[0].strip()
    assert (theirs, mine) == ("claimed", "spent") and waited > 1.0, (theirs, mine, waited)
    study = optuna.load_study(study_name="lock", storage=open_storage(url, heartbeat=None))
    assert len(study.trials) == 1


def test_a_lock_left_by_a_killed_worker_is_removed_after_the_grace_period(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage_module, "CLAIM_LOCK_GRACE", 3)
    worker = _start_claimer(url)
    worker.send_signal(signal.SIGKILL)  # killed inside its claim: its lock file stays
    worker.wait(timeout=60)
    lock = Path(url.removeprefix("journal:") + ".budget.lock")
    assert lock.exists()
    result: list[str] = []
    start = time.monotonic()
    claimer = threading.Thread(target=lambda: result.append(_claim(url)), daemon=True)
    claimer.start()
    claimer.join(timeout=30)
    waited = time.monotonic() - start
    assert result == ["claimed"], f"no claim after {waited:.0f} s: the stale lock was kept"
    assert 2.5 < waited < 30 and not lock.exists()


def test_a_trial_queued_again_after_ctrl_c_completes_with_fresh_attributes(tmp_path: Path) -> None:
    """The issue: COMPLETE trials tagged ``KeyboardInterrupt:``."""
    study = create_study(
        "fresh", 2, f"sqlite:///{tmp_path / 'f.db'}", sampler="random", pruner=None
    )

    def interrupted(trial: optuna.Trial, params: dict) -> float:
        trial.set_user_attr("note", "from the stopped run")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_worker(study, X, interrupted)
    stopped, queued = study.trials
    assert stopped.user_attrs["reason"].startswith("KeyboardInterrupt")
    assert queued.state.name == "WAITING" and queued.user_attrs == {}
    run_worker(study, X, lambda trial, params: params["x"])
    stopped, rerun, other = study.trials
    assert rerun.state.name == "COMPLETE" and rerun.params == stopped.params
    assert "reason" not in rerun.user_attrs and "note" not in rerun.user_attrs, rerun.user_attrs
    assert rerun.system_attrs["failed_trial"] == 0, (
        "the budget still counts it in the stopped one's place"
    )
    assert [t.state.name for t in (stopped, other)] == ["FAIL", "COMPLETE"]


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_a_dead_workers_trial_is_queued_with_fresh_attributes(tmp_path: Path, kind: str) -> None:
    """The heartbeat's retry (a dead worker's trial) drops its attributes too, and its last beat."""
    url = f"sqlite:///{tmp_path / 'd.db'}" if kind == "sqlite" else f"journal:{tmp_path / 'd.log'}"
    storage = open_storage(url, heartbeat=1)
    assert isinstance(storage.get_heartbeat_stale_trial_callback(), FreshRetry)
    study = create_study("dead", 2, storage, sampler="random", pruner=None)
    with warnings.catch_warnings():  # "Heartbeat ... supposed to be used with Study.optimize"
        warnings.simplefilter("ignore", UserWarning)
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    trial.set_user_attr("reason", "from the dead worker")
    storage.record_heartbeat(trial._trial_id)
    time.sleep(3.5)  # past twice the heartbeat (SQLite's clock counts whole seconds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    dead, queued = study.trials
    assert dead.state.name == "FAIL" and queued.state.name == "WAITING"
    assert queued.user_attrs == {} and queued.params == dead.params
    assert "trainopt:heartbeat" not in queued.system_attrs
