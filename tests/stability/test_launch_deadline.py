"""Multi-process tests fail, and never hang (issue 21, requirement 9).

Two ranks launched, one of which skips a collective (the broken rank agreement): ``launch``
raises within seconds, by the process group's timeout when a collective waits too long, or by
its own deadline, which stops the ranks still running, names them and shows where they were.
"""

from __future__ import annotations

import time

import pytest
from rank_faults import environment_variable, skip_a_collective

from trainopt.perf.distributed.processes import WorkerError, WorkerTimeoutError, launch

WITHIN = 30  # seconds from the call to the error, the start of two processes included


def test_a_collective_that_waits_too_long_raises_on_its_rank() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank \d failed") as info:
        launch(skip_a_collective, 2, 1, backend="gloo", timeout=WITHIN + 30, collective_timeout=5)
    assert time.monotonic() - start < WITHIN
    assert not isinstance(info.value, WorkerTimeoutError)
    assert "Timed out" in str(info.value)


def test_ranks_still_running_at_the_deadline_are_stopped_and_named() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match="did not finish within 15 s: stopped") as info:
        launch(skip_a_collective, 2, 1, backend="gloo", timeout=15, collective_timeout=600)
    assert time.monotonic() - start < WITHIN
    assert info.value.ranks == [0, 1]
    message = str(info.value)
    assert "rank 0 was in:" in message and "in all_reduce" in message  # where rank 0 waits


def test_each_launch_gives_its_ranks_the_callers_environment_as_it_is_then(monkeypatch) -> None:
    """Ranks started by a forkserver (which starts once) still see a variable set after the first
    launch, and no longer see one removed since."""
    monkeypatch.setenv("TRAINOPT_LAUNCH_CHECK", "first")
    assert launch(environment_variable, 2, "TRAINOPT_LAUNCH_CHECK", timeout=WITHIN) == [
        "first",
        "first",
    ]
    monkeypatch.setenv("TRAINOPT_LAUNCH_CHECK", "second")
    assert launch(environment_variable, 2, "TRAINOPT_LAUNCH_CHECK", timeout=WITHIN) == [
        "second",
        "second",
    ]
    monkeypatch.delenv("TRAINOPT_LAUNCH_CHECK")
    assert launch(environment_variable, 2, "TRAINOPT_LAUNCH_CHECK", timeout=WITHIN) == [None, None]


def test_the_first_failure_names_the_others_last_lines(tmp_path) -> None:
    """The first stamp is not always the cause (a peer that vanished fails its partners at once)."""
    from trainopt.perf.distributed.processes import _first_error

    (tmp_path / "rank1.error").write_text(
        "10.0\nTraceback...\nRuntimeError: Connection closed by peer\n"
    )
    (tmp_path / "rank0.error").write_text(
        "10.001\nTraceback...\nRuntimeError: Timed out waiting 5000ms\n"
    )
    error = _first_error(str(tmp_path))
    assert error.rank == 1
    assert str(error).splitlines()[-2:] == [
        "other ranks failed too:",
        "rank 0: RuntimeError: Timed out waiting 5000ms",
    ]
