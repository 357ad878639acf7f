"""A real cluster (issue 22, requirement 11): the parts that run on this machine.

The page's Slurm job array and Kubernetes indexed Job run here against SQLite (with a stand-in
``srun``); the environment each worker reads becomes its id and device; SIGTERM returns the
running trial to the queue, and a requeued worker runs it; ``--timeout`` stops the claims.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml

from trainopt.config.cli import run_command
from trainopt.data import path as data_path
from trainopt.hpo import budget_trials, open_storage
from trainopt.hpo.cli import build_parser, main
from trainopt.hpo.cluster import SIGTERM_STATUS, local_rank, resolve_device, worker_id

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "docs" / "guides" / "training-optimization" / "hpo-cluster"
SLURM, K8S = CLUSTER / "hpo-slurm.sh", CLUSTER / "hpo-indexed-job.yaml"
SLOW = '''
import time
from pathlib import Path


def objective(trial, params):
    """Marks its start, then holds while the file `hold` exists (at most 120 s)."""
    Path(f"started-{trial.number}").touch()
    end = time.monotonic() + 120
    while Path("hold").exists() and time.monotonic() < end:
        time.sleep(0.05)
    return params["x"]


def sleepy(trial, params):
    time.sleep(0.4)
    return params["x"]
'''
SLOW_CONFIG = {
    "objective": "slow:objective",
    "study": {"sampler": "random", "pruner": None, "heartbeat": 5},
    "search_space": {"x": {"type": "float", "low": 0.0, "high": 1.0}},
}


def _env(**extra: str) -> dict[str, str]:
    """This interpreter first on PATH and trainopt importable; no scheduler variables of the
    host."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "JOB_COMPLETION_INDEX", "LOCAL_RANK", "RANK"))
    }
    path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, "PATH": path, "PYTHONPATH": os.pathsep.join(sys.path), **extra}


def _study(folder: Path, name: str, database: str | None = None) -> optuna.Study:
    url = f"sqlite:///{folder / (database or name + '.db')}"
    return optuna.load_study(study_name=name, storage=open_storage(url))


def _digits_config(folder: Path) -> None:
    """The page's config as the scripts name it, with short trials."""
    data = yaml.safe_load(data_path("hpo_digits.yaml").read_text())
    data["training"] = {"steps": 20, "report_every": 10}
    (folder / "hpo_digits.yaml").write_text(yaml.safe_dump(data))


# --- the environment ------------------------------------------------------------------------


def test_worker_id_and_local_rank_come_from_the_scheduler() -> None:
    assert (
        worker_id({"SLURM_ARRAY_JOB_ID": "812", "SLURM_ARRAY_TASK_ID": "3"}) == "slurm-array:812_3"
    )
    assert worker_id({"JOB_COMPLETION_INDEX": "5", "RANK": "9"}) == "k8s-index:5"
    assert worker_id({"RANK": "9"}) == "rank:9" and worker_id({}) is None
    assert (
        local_rank({"LOCAL_RANK": "2", "SLURM_LOCALID": "1"}) == 2
        and local_rank({"SLURM_LOCALID": "1"}) == 1
    )
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        local_rank({"LOCAL_RANK": "two"})


@pytest.mark.parametrize(
    "text, env, count, device",
    [
        ("auto", {"LOCAL_RANK": "3"}, 4, "cuda:3"),
        ("auto", {"LOCAL_RANK": "5"}, 4, "cuda:1"),
        ("auto", {"SLURM_LOCALID": "1"}, 2, "cuda:1"),
        ("auto", {}, 1, "cuda:0"),
        ("auto", {"LOCAL_RANK": "3"}, 0, "cpu"),
        ("cuda:1", {}, 2, "cuda:1"),
        ("cuda", {}, 1, "cuda"),
        ("cpu", {}, 0, "cpu"),
    ],
)
def test_devices_are_pinned_by_name_or_by_local_rank(
    text: str, env: dict, count: int, device: str
) -> None:
    assert resolve_device(text, env, cuda_count=count) == device


@pytest.mark.parametrize(
    "text, count, message",
    [
        ("cuda:2", 2, "this machine has 2 CUDA devices (cuda:0 to cuda:1)"),
        ("cuda", 0, "has no CUDA device"),
        ("cuda:0", 0, "has no CUDA device"),
        ("gpu", 1, "is not a device"),
        ("meta", 1, "is not supported"),
    ],
)
def test_a_device_this_machine_lacks_is_refused(text: str, count: int, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_device(text, cuda_count=count)


def test_each_trial_records_the_worker_and_its_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(SLOW_CONFIG))
    for variable in (
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_JOB_ID",
        "LOCAL_RANK",
        "SLURM_LOCALID",
        "RANK",
    ):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "4")
    monkeypatch.setenv("LOCAL_RANK", "0")
    try:
        assert (
            run_command(
                main,
                ["slow.yaml", "--n-trials", "2", "--device", "auto", "--no-plots", "--no-progress"],
            )
            == 0
        )
    finally:
        sys.modules.pop("slow", None)
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    attrs = [
        (t.user_attrs["worker_id"], t.user_attrs["device"]) for t in _study(tmp_path, "slow").trials
    ]
    assert attrs == [("k8s-index:4", expected)] * 2


# --- --timeout ------------------------------------------------------------------------------


def test_timeout_stops_claiming_and_leaves_the_rest_of_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump({**SLOW_CONFIG, "objective": "slow:sleepy"}))
    out = io.StringIO()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sys, "stdout", out)
            assert (
                run_command(
                    main,
                    [
                        "slow.yaml",
                        "--n-trials",
                        "40",
                        "--timeout",
                        "1",
                        "--no-plots",
                        "--no-progress",
                    ],
                )
                == 0
            )
    finally:
        sys.modules.pop("slow", None)
    # Each trial sleeps at least 0.4 s, so claims come at 0 s, >= 0.4 s, >= 0.8 s, >= 1.2 s after
    # the worker's start: within 1 s at most 3, however loaded the machine (load only makes fewer).
    # A --timeout ignored runs all 40; one counted late (2 s, 10 s) runs 5 or more.
    states = [t.state.name for t in _study(tmp_path, "slow").trials]
    assert 1 <= states.count("COMPLETE") <= 3 and "RUNNING" not in states, states
    assert "--timeout: this worker claimed no trial after 1 s" in out.getvalue()


# --- SIGTERM and requeue --------------------------------------------------------------------


def _wait_for(check, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, f"waited {seconds} s for {what}"
        time.sleep(0.1)


def test_sigterm_returns_the_trial_to_the_queue_and_a_requeued_worker_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(SLOW_CONFIG))
    (tmp_path / "hold").touch()
    command = [sys.executable, "-m", "trainopt.hpo", "slow.yaml", "--no-plots", "--no-progress"]
    worker = subprocess.Popen(
        [*command, "--n-trials", "2"],
        cwd=tmp_path,
        env=_env(PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path])),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(
            lambda: (tmp_path / "started-0").exists() or worker.poll() is not None, 120, "trial 0"
        )
        worker.send_signal(signal.SIGTERM)
        stdout, stderr = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == SIGTERM_STATUS, stderr
    assert stderr == "stopped by SIGTERM: trial 0 queued again\n"  # one line, no traceback
    study = _study(tmp_path, "slow")
    stopped = study.trials[0]
    assert stopped.state.name == "FAIL" and not [
        t for t in budget_trials(study) if t.state.is_finished()
    ]

    (tmp_path / "hold").unlink()  # the requeued job: a plain worker (here, in this process)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert run_command(main, command[3:]) == 0
    finally:
        sys.modules.pop("slow", None)
    study = _study(tmp_path, "slow")
    kept = budget_trials(study)
    assert len(kept) == 2 and all(t.state.name == "COMPLETE" for t in kept)
    assert stopped.params["x"] in [t.params["x"] for t in kept], (
        "the stopped trial ran again, same parameters"
    )


# --- the page's scripts ---------------------------------------------------------------------


def test_slurm_array_script_runs_a_worker_per_task(tmp_path: Path) -> None:
    text = SLURM.read_text()
    directives = dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?$", text, flags=re.M))
    assert (
        directives["array"] == "0-7"
        and "requeue" in directives
        and directives["signal"] == "TERM@120"
    )
    assert subprocess.run(["bash", "-n", str(SLURM)]).returncode == 0
    command = re.sub(r"\\\n\s*", "", text).split("srun ", 1)[1].splitlines()[0]
    args = build_parser().parse_args(shlex.split(command)[3:])
    assert args.device == "auto" and args.n_trials is None and args.no_plots
    limit = sum(int(x) * 60**i for i, x in enumerate(reversed(directives["time"].split(":"))))
    assert args.timeout < limit - 120, "no trial starts in the last minutes"

    _digits_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert (
        run_command(
            main,
            [
                str(tmp_path / "hpo_digits.yaml"),
                "--n-trials",
                "2",
                "--create-only",
                "--storage",
                url,
            ],
        )
        == 0
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nexec "$@"\n')  # the stand-in runs the one task
    (bin_dir / "srun").chmod(0o755)
    env = _env(HPO_STORAGE=url, SLURM_ARRAY_JOB_ID="42", SLURM_ARRAY_TASK_ID="3", SLURM_LOCALID="0")
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    result = subprocess.run(
        ["bash", str(SLURM)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr
    trials = _study(tmp_path, "digits", "hpo.db").trials
    assert [(t.state.name, t.user_attrs["worker_id"]) for t in trials] == [
        ("COMPLETE", "slurm-array:42_3")
    ] * 2
    missing = subprocess.run(
        ["bash", str(SLURM)],
        cwd=tmp_path,
        env={**env, "HPO_STORAGE": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0 and "export HPO_STORAGE" in missing.stderr


def test_kubernetes_indexed_job_runs_a_worker_per_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = yaml.safe_load(K8S.read_text())
    spec = job["spec"]
    assert job["kind"] == "Job" and spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 8
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # podFailurePolicy needs it
    rules = {rule["action"]: rule for rule in spec["podFailurePolicy"]["rules"]}
    assert rules["Ignore"]["onPodConditions"] == [{"type": "DisruptionTarget"}]
    assert rules["FailJob"]["onExitCodes"]["values"] == [2]  # a mistake: exit status 2
    (container,) = pod["containers"]
    assert rules["FailJob"]["onExitCodes"]["containerName"] == container["name"]
    assert (
        container["env"][0]["name"] == "HPO_STORAGE"
        and "secretKeyRef" in container["env"][0]["valueFrom"]
    )
    command = container["command"]
    args = build_parser().parse_args(command[3:])
    assert args.storage == "$(HPO_STORAGE)" and args.device == "auto" and args.n_trials is None

    _digits_config(tmp_path)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert (
        run_command(
            main,
            [
                str(tmp_path / "hpo_digits.yaml"),
                "--n-trials",
                "2",
                "--create-only",
                "--storage",
                url,
            ],
        )
        == 0
    )
    assert command[:3] == ["python", "-m", "trainopt.hpo"]  # main() in this process runs the same
    monkeypatch.chdir(tmp_path)
    for variable in ("SLURM_ARRAY_TASK_ID", "LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "6")
    assert (
        run_command(main, [url if part == "$(HPO_STORAGE)" else part for part in command[3:]]) == 0
    )
    trials = _study(tmp_path, "digits", "hpo.db").trials
    assert [(t.state.name, t.user_attrs["worker_id"]) for t in trials] == [
        ("COMPLETE", "k8s-index:6")
    ] * 2
