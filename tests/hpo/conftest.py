"""The helper modules of tests/hpo/ (``storages``) made importable by the test modules, and the
stale-trial tests' fixtures: a local time zone other than UTC, and a worker clock moved forward.

The suite runs with ``--import-mode=importlib``, which puts no test folder on ``sys.path``.
"""

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from trainopt.hpo import storage as _storage

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(params=["UTC", "Asia/Tokyo"])
def time_zone(request: pytest.FixtureRequest):
    """The test runs with this process's local time zone set to each (``TZ`` and ``time.tzset``):
    a mix-up of a UTC clock (SQLite's, a journal's) with local time passes in UTC only."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    try:
        yield request.param
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


class WorkerClock:
    """This process's clock as the storages read it (``trainopt.hpo.storage._now``), ``ahead``
    seconds in the future: a trial ages without a sleep, so no load can make it age more."""

    def __init__(self) -> None:
        self.ahead = 0.0
        self.real = _storage._now

    def __call__(self):
        return self.real() + timedelta(seconds=self.ahead)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> WorkerClock:
    worker_clock = WorkerClock()
    monkeypatch.setattr(_storage, "_now", worker_clock)
    return worker_clock
