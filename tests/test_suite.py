"""The suite's own helpers: optional dependencies fail in CI instead of skipping; records keep
every worker's keys."""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

import pytest
from artifacts import record
from extras import require

MISSING = "trainopt_no_such_module_3f9c"


def outcome(name: str, extra: str) -> BaseException:
    """What ``require`` raised: a skip or a failure (caught both ways, so that a skip where a
    failure is due fails this test instead of skipping it)."""
    try:
        require(name, extra)
    except (pytest.skip.Exception, pytest.fail.Exception) as raised:
        return raised
    raise AssertionError(f"require({name!r}) returned")


def failed(name: str, extra: str) -> str:
    raised = outcome(name, extra)
    assert isinstance(raised, pytest.fail.Exception), f"skipped instead of failing: {raised}"
    return str(raised)


def skipped(name: str, extra: str) -> str:
    raised = outcome(name, extra)
    assert isinstance(raised, pytest.skip.Exception), f"failed instead of skipping: {raised}"
    return str(raised)


@pytest.fixture
def broken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A package that is installed but whose import raises ImportError from inside it."""
    package = tmp_path / "trainopt_broken_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from trainopt_broken_dep import thing  # not installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "trainopt_broken_pkg", raising=False)
    return "trainopt_broken_pkg"


@pytest.mark.parametrize("ci", ["true", "1"])
def test_a_missing_dependency_fails_in_ci_naming_it_and_its_extra(
    ci: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", ci)
    assert f"{MISSING} is not installed (pip install 'trainopt[hf]')" in failed(MISSING, "hf")


def test_a_broken_dependency_fails_in_ci(broken: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert (
        f"{broken} is installed but its import failed: ModuleNotFoundError: "
        "No module named 'trainopt_broken_dep'"
    ) in failed(broken, "test")


def test_a_dependency_whose_import_raises_fails_in_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "trainopt_raising_mod.py").write_text("raise ImportError('cannot import name x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CI", "true")
    assert "installed but its import failed: ImportError: cannot import name x" in failed(
        "trainopt_raising_mod", "test"
    )


@pytest.mark.parametrize("ci", [None, "", "0", "false"])
def test_outside_ci_a_missing_or_broken_dependency_skips_with_the_reason(
    ci: str | None, broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    reason = skipped(MISSING, "lightning")
    assert f"{MISSING} is not installed (pip install 'trainopt[lightning]')" in reason
    assert f"{broken} is installed but its import failed" in skipped(broken, "test")


def test_an_installed_dependency_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert require("json", "test") is json


def _record_many(folder: str, worker: int, count: int) -> None:
    for n in range(count):
        record("records.json", f"{worker}-{n}", n, Path(folder))


def test_records_from_processes_at_once_keep_every_key(tmp_path: Path) -> None:
    """Four processes merge 40 keys each into one file at once: none is lost (without the lock,
    a read-modify-write of one worker overwrites the other's keys)."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(4)
    workers = [
        context.Process(target=_start_then_record, args=(start, str(tmp_path), w, 40))
        for w in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    data = json.loads((tmp_path / "records.json").read_text())
    assert sorted(data) == sorted(f"{w}-{n}" for w in range(4) for n in range(40))


def _start_then_record(start, folder: str, worker: int, count: int) -> None:
    start.wait(60)
    _record_many(folder, worker, count)
