"""Many workers on one study: separate processes share a storage, run exactly the budget, survive a
dead worker.

Each test creates a study, then starts ``python -m trainopt.hpo CONFIG`` worker processes on the
same storage URL: SQLite, a journal file, and PostgreSQL where ``TRAINOPT_POSTGRES_URL`` names a
server (``.ci/run`` starts one; under ``CI`` a missing URL fails the PostgreSQL tests instead of
skipping them). The config names the workers' objective, a module in their folder, as a user's
own would be.
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path

import optuna
import pytest
import yaml
from extras import in_ci
from optuna.exceptions import ExperimentalWarning
from optuna.trial import TrialState

from trainopt.hpo import budget_trials, create_study, load_hpo_config, make_pruner, open_storage

POSTGRES_URL = os.environ.get("TRAINOPT_POSTGRES_URL", "")
STARTUP = inspect.signature(make_pruner).parameters["n_startup_trials"].default
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)

OBJECTIVE = '''
"""The workers' objective: later trials are worse, so each trial after the pruner's startup is
pruned."""
import os
import time
from pathlib import Path

from trainopt.hpo import TrialReporter

met = False


def objective(trial, params):
    hold = os.environ.get("TUNING_TEST_HOLD")
    if hold:  # the worker the test kills: say which trial it holds, then hang
        Path(hold).write_text(str(trial.number))
        time.sleep(600)
    runs = os.environ.get("TUNING_TEST_RUNS")
    if runs:
        Path(runs, f"{trial.number}-{os.getpid()}").touch()
    meet_the_other_workers()
    reporter = TrialReporter(trial, report_every=1)
    value = trial.number + params["x"]
    for step in range(params.get("steps", 3)):
        time.sleep(params.get("seconds_per_step", 0.05))
        reporter.report(value, step)
    return value


def meet_the_other_workers():
    """On its first trial, a worker waits until every worker holds one: each of them runs trials."""
    global met
    folder = os.environ.get("TUNING_TEST_BARRIER")
    if met or not folder:
        return
    met = True
    Path(folder, str(os.getpid())).touch()
    deadline = time.monotonic() + 120
    workers = int(os.environ["TUNING_TEST_WORKERS"])
    while len(os.listdir(folder)) < workers and time.monotonic() < deadline:
        time.sleep(0.05)
'''

# A heartbeat of 5 s: a live worker is taken for dead only if load starves it for 10 s (at 2 s,
# a 4 s stall added a trial); the killed worker's trial fails 10 s after its last beat.
CONFIG = {
    "objective": "tuning_objective:objective",
    "study": {
        "name": "workers",
        "sampler": "random",
        "pruner": "median",
        "prune_after": 0,
        "seed": 0,
        "heartbeat": 5,
    },
    "fixed": {"steps": 5, "seconds_per_step": 0.1},
    "search_space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
}


@pytest.fixture(params=["sqlite", "journal", "postgresql"])
def storage(request: pytest.FixtureRequest, tmp_path: Path):
    """A storage URL of each kind, and the study names a test used (deleted from PostgreSQL after
    it)."""
    names: list[str] = []
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'study.db'}", names
    elif request.param == "journal":
        yield f"journal:{tmp_path / 'study.log'}", names
    else:
        if not POSTGRES_URL:
            if in_ci():
                pytest.fail(
                    "CI is set but TRAINOPT_POSTGRES_URL is not: .ci/run must start PostgreSQL"
                )
            pytest.skip("no PostgreSQL server: set TRAINOPT_POSTGRES_URL (.ci/run starts one)")
        yield POSTGRES_URL, names
        for name in names:
            optuna.delete_study(study_name=name, storage=open_storage(POSTGRES_URL, heartbeat=None))


def _folder(tmp_path: Path) -> Path:
    """The workers' folder: their objective module and their config."""
    (tmp_path / "tuning_objective.py").write_text(OBJECTIVE)
    (tmp_path / "workers.yaml").write_text(yaml.safe_dump(CONFIG))
    (tmp_path / "barrier").mkdir()
    return tmp_path


def _create(folder: Path, url: str, names: list[str], n_trials: int) -> str:
    name = f"workers-{uuid.uuid4().hex[:8]}"
    names.append(name)
    sys.path.insert(0, str(folder))
    try:
        config = load_hpo_config(folder / "workers.yaml")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("tuning_objective", None)  # each test's workers have their own folder
    create_study(
        name,
        n_trials,
        url,
        directions=config.directions,
        sampler=config.sampler,
        pruner=config.make_pruner(),
        seed=config.seed,
        heartbeat=config.heartbeat,
    )
    return name


def _worker(folder: Path, url: str, name: str, workers: int = 2, **env: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "trainopt.hpo",
        "workers.yaml",
        "--storage",
        url,
        "--study-name",
        name,
        "--no-progress",
        "--no-plots",
    ]
    env = {
        **os.environ,
        "TUNING_TEST_BARRIER": str(folder / "barrier"),
        "TUNING_TEST_WORKERS": str(workers),
        **env,
    }
    return subprocess.Popen(
        command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        out, err = worker.communicate(timeout=240)
        assert worker.returncode == 0, err


def _check_the_budget(study: optuna.Study, n_trials: int) -> None:
    """Exactly ``n_trials`` trials fill the budget, each complete or pruned; nothing is left to
    run."""
    budget = budget_trials(study)
    assert len(budget) == n_trials and all(t.state in FINISHED for t in budget), [
        t.state for t in budget
    ]
    assert not study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))


def _pruned_on_others_results(study: optuna.Study) -> list[int]:
    """Pruned trials whose own worker had completed fewer trials than the pruner's startup count.

    The median pruner prunes nothing until the study holds ``STARTUP`` completed trials: for such
    a trial it must have counted, and compared with, another worker's trials.
    """
    trials = study.get_trials(deepcopy=False)
    found = []
    for pruned in (t for t in trials if t.state == TrialState.PRUNED):
        own = [
            t
            for t in trials
            if t.state == TrialState.COMPLETE
            and t.datetime_complete < pruned.datetime_complete
            and t.user_attrs["worker"] == pruned.user_attrs["worker"]
        ]
        if len(own) < STARTUP:
            found.append(pruned.number)
    return found


def test_two_workers_run_the_budget_and_prune_with_each_others_results(
    storage, tmp_path: Path
) -> None:
    url, names = storage
    folder = _folder(tmp_path)
    name = _create(folder, url, names, n_trials=10)
    _wait([_worker(folder, url, name) for _ in range(2)])
    study = optuna.load_study(study_name=name, storage=open_storage(url))
    _check_the_budget(study, 10)
    assert len(study.trials) == 10 and sorted(t.number for t in study.trials) == list(range(10))
    assert len({t.user_attrs["worker"] for t in study.trials}) == 2, "both workers ran trials"
    assert _pruned_on_others_results(study), "no trial was pruned on the other worker's results"


def test_a_killed_workers_trial_fails_and_its_slot_runs_again(storage, tmp_path: Path) -> None:
    url, names = storage
    folder = _folder(tmp_path)
    name = _create(folder, url, names, n_trials=6)
    hold = folder / "held"
    doomed = _worker(folder, url, name, TUNING_TEST_HOLD=str(hold))
    deadline = time.monotonic() + 120
    while not hold.exists() and time.monotonic() < deadline and doomed.poll() is None:
        time.sleep(0.05)
    assert hold.exists(), doomed.communicate()[1]
    doomed.send_signal(signal.SIGKILL)
    doomed.communicate()
    _wait([_worker(folder, url, name) for _ in range(2)])

    study = optuna.load_study(study_name=name, storage=open_storage(url))
    trials = study.get_trials(deepcopy=False)
    held = trials[int(hold.read_text())]
    assert held.state == TrialState.FAIL and held.user_attrs["worker"].endswith(f":{doomed.pid}")
    _check_the_budget(study, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        retries = [
            t
            for t in trials
            if optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t)
            == held.number
        ]
    assert len(retries) == 1 and retries[0].state in FINISHED and retries[0].params == held.params
    assert len(trials) == 7 and held not in budget_trials(study)
    survivors = {t.user_attrs["worker"] for t in budget_trials(study)}
    assert len(survivors) == 2 and held.user_attrs["worker"] not in survivors
    counts = {
        s.name: sum(t.state == s for t in trials)
        for s in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    }
    print(
        f"SIGKILL on {url.split(':')[0]}: {len(trials)} trials, {counts}, "
        f"killed #{held.number}, retried as "
        f"#{retries[0].number}"
    )


def test_four_workers_on_a_plain_sqlite_url_are_refused(tmp_path: Path) -> None:
    """``optuna.load_study(storage="sqlite:///...")`` can't claim atomically; the same URL through
    open_storage can."""
    folder = _folder(tmp_path)
    url = f"sqlite:///{folder / 'plain.db'}"
    create_study("plain", 8, url, sampler="random", pruner=None)
    script = (
        "import sys, optuna\n"
        "from trainopt.hpo import SearchSpace, open_storage, run_worker\n"
        "from tuning_objective import objective\n"
        "space = SearchSpace.from_dict({'x': {'type': 'float', 'low': 0.0, 'high': 1.0}})\n"
        "try:\n"
        f"    run_worker(optuna.load_study(study_name='plain', storage={url!r}), "
        "space, objective)\n"
        "except ValueError as error:\n"
        "    print('refused:', error)\n"
        f"study = optuna.load_study(study_name='plain', storage=open_storage({url!r}))\n"
        "run_worker(study, space, objective, reseed=True)\n"
    )
    (folder / "runs").mkdir()
    env = {
        **os.environ,
        "TUNING_TEST_BARRIER": str(folder / "barrier"),
        "TUNING_TEST_WORKERS": "4",
        "TUNING_TEST_RUNS": str(folder / "runs"),
    }
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [w.communicate(timeout=240) for w in workers]
    assert all(w.returncode == 0 for w in workers), [err for _, err in outputs]
    assert all("refused:" in out and "open_storage" in out for out, _ in outputs)
    study = optuna.load_study(study_name="plain", storage=open_storage(url))
    assert len(study.trials) == 8 and all(t.state in FINISHED for t in study.trials)
    runs = sorted(p.name.split("-")[0] for p in (folder / "runs").iterdir())
    assert runs == sorted(str(n) for n in range(8)), "each trial ran exactly once"
    assert len({t.user_attrs["worker"] for t in study.trials}) == 4


def test_a_larger_n_trials_tops_the_study_up_and_workers_join_it(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    url = f"sqlite:///{folder / 'topup.db'}"

    def run(*args: str) -> str:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainopt.hpo",
                "workers.yaml",
                "--storage",
                url,
                "--no-progress",
                "--no-plots",
                *args,
            ],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    assert "study workers: 3 trials, 0 complete" in run("--n-trials", "3", "--create-only")
    assert "study workers: 3 trials, 3 complete" in run()  # a worker joins the study and runs it
    topped = run("--n-trials", "5")
    assert "study workers: 5 trials, " in topped and "0 fail" in topped
    assert "study workers: 5 trials, " in run()  # nothing left: the worker runs no trial
    study = optuna.load_study(study_name="workers", storage=open_storage(url))
    assert len(study.trials) == 5 and all(t.state in FINISHED for t in study.trials)


def test_a_worker_without_a_study_says_how_to_create_one(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainopt.hpo",
            "workers.yaml",
            "--storage",
            f"sqlite:///{folder / 'none.db'}",
            "--study-name",
            "missing",
        ],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=120,
    )
    assert result.returncode == 2 and result.stderr.startswith(
        "error: --study-name: no study 'missing'"
    )
    assert "create it with --n-trials" in result.stderr and result.stderr.count("\n") == 1
