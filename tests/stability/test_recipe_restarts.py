"""A killed run restarts as the run it replaced: ``python -m trainopt.stability.recipe`` is SIGKILLed
at random moments, during checkpoint writes too, and restarted with the same command; its final
weights are bit for bit those of a run that was never interrupted.

The run has faults injected (``--faults``): a skipped NaN step, a skipped loss spike and a
rollback with a halved learning rate all happen between kills, so the restarts carry the
stabilizer's counters and windows, the clipper's statistics, the recovery's learning-rate scale,
the random number generators and the position in the data.
"""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainopt.config.cli import run_command
from trainopt.stability.recipe import main

STEPS, CHECK_EVERY = 200, 10
KILLS = 10
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _command(folder: Path) -> list[str]:
    return [sys.executable, "-m", "trainopt.stability.recipe", "--checkpoint-dir", str(folder / "ckpt"),
            "--steps", str(STEPS), "--check-every", str(CHECK_EVERY), "--out", str(folder / "weights.pt"),
            "--faults"]


def _temporaries(folder: Path) -> list[str]:
    try:
        return [entry.name for entry in os.scandir(folder) if entry.name.endswith(".tmp")]
    except FileNotFoundError:
        return []


def _kill_once(folder: Path, rng: random.Random, during_save: bool) -> tuple[bool, bool]:
    """Start the command, kill it; return (it was killed, a checkpoint write was under way)."""
    process = subprocess.Popen(_command(folder), stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        first = process.stdout.readline()  # "started" / "resumed at step ...": training from here
        if not first or first.startswith("wrote"):
            return False, False
        if during_save:
            deadline = time.monotonic() + 5.0
            while not _temporaries(folder / "ckpt") and time.monotonic() < deadline:
                pass
        else:
            for _ in range(rng.randint(0, 1)):
                if process.stdout.readline().startswith("wrote"):
                    return False, False
            time.sleep(rng.uniform(0.0, 0.03))
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        mid_save = bool(_temporaries(folder / "ckpt"))
        return process.returncode == -signal.SIGKILL, mid_save
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_a_run_killed_at_random_moments_ends_bitwise_equal_to_an_uninterrupted_run(tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    done = subprocess.run(_command(straight), capture_output=True, text=True, env=ENV, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "rolled back" in done.stdout  # the faults are real: the run rolls back once

    killed = tmp_path / "killed"
    rng = random.Random(0)
    kills = mid_save = 0
    for round_ in range(KILLS + 8):
        if kills == KILLS:
            break
        was_killed, during = _kill_once(killed, rng, during_save=round_ % 3 == 2)
        kills += was_killed
        mid_save += during
    finished = subprocess.run(_command(killed), capture_output=True, text=True, env=ENV, timeout=600)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.startswith("resumed at step")
    assert kills == KILLS, "the run finished before it was killed often enough: make it longer"
    assert mid_save >= 1, "no kill landed during a checkpoint write"

    expected = torch.load(straight / "weights.pt", weights_only=True)
    got = torch.load(killed / "weights.pt", weights_only=True)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_command_line_mistakes_are_one_line_with_status_2(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "trainopt.stability.recipe", "--steps", "10", "--out", "w.pt"],
                            capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120)
    assert (result.returncode, result.stderr) == (2, "error: --checkpoint-dir: required\n")
    (tmp_path / "file").write_text("")
    cases = [
        (["--checkpoint-dir", "c", "--steps", "0", "--out", "w.pt"], "error: --steps: must be an int >= 1, got '0'"),
        (["--checkpoint-dir", str(tmp_path / "file"), "--steps", "5", "--out", "w.pt"],
         f"error: --checkpoint-dir: {tmp_path / 'file'} is a file; give a folder (it is created if missing)"),
        (["--checkpoint-dir", "c", "--steps", "5", "--out", str(tmp_path)],
         f"error: --out: {tmp_path} is a folder: give a file name"),
    ]
    for argv, line in cases:
        stderr = io.StringIO()
        assert run_command(main, argv, stderr=stderr) == 2
        assert stderr.getvalue() == line + "\n"
