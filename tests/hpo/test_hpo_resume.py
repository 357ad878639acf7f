"""Workers in separate processes: killed before their first heartbeat, started all at once, resumed,
interrupted.

Issue 22 on SQLite, the journal file and PostgreSQL (``TRAINOPT_POSTGRES_URL``): a worker
SIGKILLed between its claim and its first heartbeat holds no slot forever; 4 processes that each
run ``--n-trials 10`` at once leave exactly 10 trials; a second run, a restart after SIGTERM, and
two workers that join with the same seed draw new points; Ctrl-C prints one line, exits 130 and
costs no slot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from storages import storage_urls

from trainopt.hpo import SearchSpace, budget_trials, create_study, open_storage, run_worker

optuna.logging.set_verbosity(optuna.logging.ERROR)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
X = SearchSpace.from_dict({"x": {"type": "float", "low": 0.0, "high": 1.0}})

OBJECTIVE = """
import os, time
from pathlib import Path


def objective(trial, params):
    started = os.environ.get("RESUME_TEST_STARTED")
    if started:  # say which trial runs, then take long enough to be stopped in it
        Path(started).write_text(str(trial.number))
        time.sleep(float(os.environ.get("RESUME_TEST_SLEEP", "60")))
    time.sleep(float(os.environ.get("RESUME_TEST_STEP", "0")))
    return params["x"]
"""


url = storage_urls("resume")


def _folder(tmp_path: Path, seed: int = 0) -> Path:
    """The workers' config. None of their trials is meant to go stale: a heartbeat of 30 s means a
    worker starved by load for a minute, not for 2 s, before another takes its trial for dead
    (which would add a trial and break the counts)."""
    (tmp_path / "resume_objective.py").write_text(OBJECTIVE)
    config = {
        "objective": "resume_objective:objective",
        "study": {
            "name": "resume",
            "sampler": "random",
            "pruner": None,
            "seed": seed,
            "heartbeat": 30,
        },
        "search_space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
    }
    (tmp_path / "resume.yaml").write_text(yaml.safe_dump(config))
    return tmp_path


def _cli(folder: Path, url: str, name: str, *args: str, **env: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "trainopt.hpo",
        "resume.yaml",
        "--storage",
        url,
        "--study-name",
        name,
        "--no-progress",
        "--no-plots",
        *args,
    ]
    return subprocess.Popen(
        command,
        cwd=folder,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _done(process: subprocess.Popen, status: int = 0) -> str:
    out, err = process.communicate(timeout=240)
    assert process.returncode == status, err
    return err


def _started(folder: Path, process: subprocess.Popen) -> int:
    """The number of the trial ``process`` runs, once it has started it."""
    started = folder / "started"
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert started.exists(), process.communicate()[1]
    time.sleep(0.2)
    return int(started.read_text())


def _study(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(url, heartbeat=1))


def _check_the_budget(study: optuna.Study, n_trials: int) -> None:
    budget = budget_trials(study)
    assert len(budget) == n_trials and all(t.state in FINISHED for t in budget), [
        t.state for t in budget
    ]
    assert not study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))


def test_a_worker_killed_between_its_claim_and_its_first_heartbeat_holds_no_slot(
    url: str, tmp_path: Path
) -> None:
    name = f"resume-{uuid.uuid4().hex[:8]}"
    create_study(name, 3, url, sampler="random", pruner=None, heartbeat=1)
    script = (
        "import os, signal, optuna\n"
        "import optuna.storages._heartbeat as beats\n"
        "from trainopt.hpo import SearchSpace, open_storage, run_worker\n"
        "beats.HeartbeatThread.start = lambda self: os.kill(os.getpid(), signal.SIGKILL)"
        "  # claimed, not beaten\n"
        f"study = optuna.load_study(study_name={name!r}, "
        f"storage=open_storage({url!r}, heartbeat=1))\n"
        "run_worker(study, "
        "SearchSpace.from_dict({'x': {'type': 'float', 'low': 0.0, 'high': 1.0}}),\n"
        "           lambda trial, params: params['x'])\n"
    )
    killed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=240
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    study = _study(url, name)
    assert [t.state for t in study.trials] == [TrialState.RUNNING], "the claim was not made"
    run_worker(study, X, lambda trial, params: params["x"], timeout=120)  # a fresh worker
    _check_the_budget(study, 3)
    assert study.trials[0].state == TrialState.FAIL


def test_four_processes_that_each_top_up_to_10_leave_10_trials(url: str, tmp_path: Path) -> None:
    folder, name = _folder(tmp_path), f"resume-{uuid.uuid4().hex[:8]}"
    if url.startswith("sqlite"):  # the database file and its tables exist before the race
        create_study(name, 1, url, sampler="random", pruner=None, heartbeat=1)
    workers = [
        _cli(folder, url, name, "--n-trials", "10", RESUME_TEST_STEP="0.05") for _ in range(4)
    ]
    for worker in workers:
        _done(worker)
    study = _study(url, name)
    assert len(study.trials) == 10
    _check_the_budget(study, 10)


def test_a_second_run_and_two_workers_that_join_with_one_seed_draw_new_points(
    tmp_path: Path,
) -> None:
    folder, url = _folder(tmp_path), f"sqlite:///{tmp_path / 'again.db'}"
    _done(_cli(folder, url, "again", "--n-trials", "4"))
    _done(_cli(folder, url, "again", "--n-trials", "8"))
    _done(_cli(folder, url, "again", "--n-trials", "12", "--create-only"))
    joined = [
        _cli(folder, url, "again", RESUME_TEST_STEP="0.3") for _ in range(2)
    ]  # same config, same seed
    for worker in joined:
        _done(worker)
    study = _study(url, "again")
    points = [t.params["x"] for t in study.trials]
    assert len(points) == 12 and len(set(points)) == 12, (
        "a run or a worker replayed another's points"
    )
    assert len({t.user_attrs["worker"] for t in study.trials[8:]}) == 2, (
        "both joined workers ran trials"
    )


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_worker_costs_no_slot_and_its_restart_draws_new_points(
    stop: int, tmp_path: Path
) -> None:
    folder, url = _folder(tmp_path), f"sqlite:///{tmp_path / 'stop.db'}"
    run_worker(
        create_study("stop", 2, url, sampler="random", pruner=None, heartbeat=1),
        X,
        lambda trial, params: params["x"],
    )  # as the config's seed 0 would
    create_study("stop", 4, url, sampler="random", pruner=None, heartbeat=1)
    worker = _cli(folder, url, "stop", RESUME_TEST_STARTED=str(folder / "started"))
    stopped = _started(folder, worker)
    worker.send_signal(stop)
    err = _done(worker, 130 if stop == signal.SIGINT else 128 + signal.SIGTERM)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    _done(_cli(folder, url, "stop"))  # the restart
    study = _study(url, "stop")
    _check_the_budget(study, 4)
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == stopped]
    assert len(retried) == 1 and retried[0].params == study.trials[stopped].params, (
        "not queued again"
    )
    fresh = [t.params["x"] for t in budget_trials(study) if "failed_trial" not in t.system_attrs]
    assert len(set(fresh)) == len(fresh) == 3, "the restart replayed earlier points"
