"""A killed run restarts as the run it replaced: ``python -m trainopt.stability.recipe`` is
SIGKILLed at seeded random moments, before the first boundary, during checkpoint writes and just
after them, and restarted with the same command; its final weights are bit for bit those of a
run that was never interrupted.

The kills are deterministic: each process runs the recipe through ``recipe_kills.py``, which
sends the process ``SIGKILL`` itself at the ``N``-th loss, checkpoint write or save (``N`` drawn
from a seeded generator), so every kind of moment is hit on every run of the test.

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
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainopt.config.cli import run_command
from trainopt.stability import ResumableDataLoader, TrainingStabilizer
from trainopt.stability.recipe import main

STEPS, CHECK_EVERY = 200, 10
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
KILLER = Path(__file__).with_name("recipe_kills.py")


def _arguments(folder: Path) -> list[str]:
    return [
        "--checkpoint-dir",
        str(folder / "ckpt"),
        "--steps",
        str(STEPS),
        "--check-every",
        str(CHECK_EVERY),
        "--out",
        str(folder / "weights.pt"),
        "--faults",
    ]


def _temporaries(folder: Path) -> list[Path]:
    return sorted(folder.glob(".*.tmp")) if folder.is_dir() else []


def _plan(rng: random.Random) -> list[tuple[str, int]]:
    """The kills, in order: (moment, its count in the process that is killed)."""
    return [
        ("mid-write", 1),  # while the step-0 checkpoint is written: nothing to resume from
        ("loss", rng.randint(2, CHECK_EVERY - 1)),  # before the first boundary, step 0 on disk
        ("mid-write", rng.randint(1, 3)),  # half of a checkpoint in its temporary file
        ("saved", rng.randint(1, 3)),  # just after a save
        ("unrenamed", rng.randint(1, 3)),  # complete and verified, not yet renamed
    ]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_a_run_killed_at_random_moments_ends_bitwise_equal_to_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    straight = tmp_path / "straight"
    recipe = [sys.executable, "-m", "trainopt.stability.recipe"]
    uninterrupted = subprocess.Popen(
        [*recipe, *_arguments(straight)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )  # beside the kills

    killed, starts = tmp_path / "killed", []
    for moment, count in _plan(random.Random(0)):
        before = {p.name for p in _temporaries(killed / "ckpt")}
        run = subprocess.run(
            [sys.executable, str(KILLER), moment, str(count), "--", *_arguments(killed)],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=300,
        )
        assert run.returncode == -signal.SIGKILL, (moment, count, run.stdout, run.stderr)
        starts.append(run.stdout.splitlines()[0])
        left = [p for p in _temporaries(killed / "ckpt") if p.name not in before]
        if moment in ("mid-write", "unrenamed"):  # the kill landed inside the write
            assert len(left) == 1, (moment, count, left)
            if moment == "unrenamed":
                assert "model" in torch.load(left[0], weights_only=True)  # complete, not in place
            else:
                assert 0 < left[0].stat().st_size  # torn
        if moment == "loss" and count < CHECK_EVERY and len(starts) == 2:
            assert sorted(p.name for p in (killed / "ckpt").glob("*.pt")) == [
                "checkpoint_step_0.pt"
            ]
    finished = subprocess.run(
        [*recipe, *_arguments(killed)], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert finished.returncode == 0, finished.stderr
    out, err = uninterrupted.communicate(timeout=300)
    assert uninterrupted.returncode == 0, err
    assert "rolled back" in out  # the faults are real: the run rolls back once

    # the first restart found only a torn temporary file; the second resumed from step 0
    assert starts[:3] == ["started", "started", "resumed at step 0"], starts
    assert finished.stdout.startswith("resumed at step")
    expected = torch.load(straight / "weights.pt", weights_only=True)
    got = torch.load(killed / "weights.pt", weights_only=True)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


class _Noisy(torch.utils.data.Dataset):
    """Inputs with noise drawn in ``__getitem__`` from the global generator (``num_workers=0``)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(40, 6, generator=g), torch.randint(0, 3, (40,), generator=g)

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.5 * torch.rand(6), self.y[i]


def _stabilized_run(folder: Path, steps: int) -> tuple[int | None, torch.Tensor]:
    """A run with dropout on :class:`_Noisy`, resumed from ``folder`` if it holds a checkpoint."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 3)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    loader = ResumableDataLoader(_Noisy(), batch_size=4, seed=1)
    stabilizer = TrainingStabilizer(
        model, optimizer, checkpoint_dir=folder, check_every=5, data=loader
    )
    start = stabilizer.resume()
    while stabilizer.steps < steps:
        for x, y in loader:
            stabilizer.step(lambda: F.cross_entropy(model(x), y))  # noqa: B023 - called at once
            if stabilizer.steps >= steps:
                break
    return start, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_a_resume_from_the_checkpoint_written_before_the_first_step_is_the_same_run(
    tmp_path: Path,
) -> None:
    """That checkpoint is written by the first ``step()``, after the loop drew the first batch
    (and the data set drew its noise): it holds the generators and position from before."""
    _, straight = _stabilized_run(tmp_path / "straight", 12)
    _stabilized_run(tmp_path / "killed", 3)  # "killed" before the first boundary (step 5)
    assert [p.name for p in (tmp_path / "killed").glob("*.pt")] == ["checkpoint_step_0.pt"]
    torch.rand(100)  # a new process: the generator is elsewhere
    start, resumed = _stabilized_run(tmp_path / "killed", 12)
    assert start == 0
    assert torch.equal(straight, resumed), (straight - resumed).abs().max()


def test_the_same_command_run_again_continues_from_the_default_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ``--checkpoint-dir`` the checkpoints go to a folder that outlives the process
    (``checkpoints/recipe``, not a temporary folder): a second run resumes from the first."""
    monkeypatch.chdir(tmp_path)
    argv = ["--steps", "20", "--check-every", "10", "--out", "w.pt"]
    for expected in ("started", "resumed at step 20"):
        stdout = io.StringIO()
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(argv) == 0
        assert stdout.getvalue().splitlines()[0] == expected
    assert (tmp_path / "checkpoints" / "recipe" / "checkpoint_step_20.pt").is_file()


def test_command_line_mistakes_are_one_line_with_status_2(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainopt.stability.recipe", "--out", "w.pt"],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (2, "error: --steps: required\n")
    (tmp_path / "file").write_text("")
    cases = [
        (
            ["--checkpoint-dir", "c", "--steps", "0", "--out", "w.pt"],
            "error: --steps: must be an int >= 1, got '0'",
        ),
        (
            ["--checkpoint-dir", str(tmp_path / "file"), "--steps", "5", "--out", "w.pt"],
            f"error: --checkpoint-dir: {tmp_path / 'file'} is a file; give a folder "
            "(it is created if missing)",
        ),
        (
            ["--checkpoint-dir", "c", "--steps", "5", "--out", str(tmp_path)],
            f"error: --out: {tmp_path} is a folder: give a file name",
        ),
    ]
    for argv, line in cases:
        stderr = io.StringIO()
        assert run_command(main, argv, stderr=stderr) == 2
        assert stderr.getvalue() == line + "\n"
