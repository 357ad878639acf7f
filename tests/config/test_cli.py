"""Every command line reports a user's mistake as one line on stderr with exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from trainopt.config import ConfigError
from trainopt.config.cli import ArgumentParser, UsageError, error_line, run_command

SRC = Path(__file__).resolve().parents[2] / "src" / "trainopt"
WORKSHOP = Path(__file__).resolve().parents[2] / "docs" / "_lib" / "trainopt_site"


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def _assert_one_line_error(result: subprocess.CompletedProcess[str], field: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"error: {field}: "), lines[0]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--steps", "ten"], "--steps"),
        (["--steps", "-3"], "--steps"),
        ([], "--out"),
        (["--out", "x", "--bogus"], "--bogus"),
    ],
)
def test_parser_errors_name_the_argument(argv: list[str], field: str) -> None:
    from trainopt.config.cli import positive_int

    parser = ArgumentParser(prog="demo")
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=positive_int)
    with pytest.raises(UsageError) as info:
        parser.parse_args(argv)
    assert info.value.field == field


def test_help_still_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    parser = ArgumentParser(prog="demo")
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--help"])
    assert info.value.code == 0 and "usage: demo" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            ConfigError("study.sampler", "must be one of ['tpe'], got 'x'"),
            "error: study.sampler: must be one of ['tpe'], got 'x'",
        ),
        (UsageError("--out", "give a file"), "error: --out: give a file"),
        (
            FileNotFoundError(2, "No such file or directory", "tune.yaml"),
            "error: tune.yaml: no such file",
        ),
        (IsADirectoryError(21, "Is a directory", "runs"), "error: runs: is a folder, not a file"),
        (
            PermissionError(13, "Permission denied", "/root/x"),
            "error: /root/x: cannot be read or written (permission denied)",
        ),
    ],
)
def test_error_line(error: Exception, line: str) -> None:
    assert error_line(error) == line


def test_a_bug_keeps_its_traceback() -> None:
    def main(argv):
        raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        run_command(main, [])


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["-m", "trainopt.data", "no-such.yaml"], "name"),
        (["-m", "trainopt.data", "a", "b"], "b"),
        (["-m", "trainopt_site.stability.faults"], "--out"),
        (["-m", "trainopt_site.stability.faults", "--out", "x.json", "--steps", "0"], "--steps"),
        (["-m", "trainopt_site.diagnostics.runs", "--out", "runs", "--faults", "nope"], "--faults"),
        (["-m", "trainopt_site.diagnostics.runs", "--out", "runs", "--steps", "x"], "--steps"),
        (["-m", "trainopt_site.perf.distributed"], "--out/--equivalence"),
        (["-m", "trainopt_site.perf.distributed", "--out", "x.json", "--nprocs", "0"], "--nprocs"),
    ],
)
def test_commands_report_a_mistake_in_one_line(args: list[str], field: str, tmp_path: Path) -> None:
    _assert_one_line_error(_run(*args, cwd=tmp_path), field)


def test_data_command_prints_a_shipped_file(tmp_path: Path) -> None:
    result = _run("-m", "trainopt.data", "hpo_digits.yaml", cwd=tmp_path)
    assert result.returncode == 0 and "search_space:" in result.stdout


def test_every_command_runs_through_run_command() -> None:
    """Each ``__main__`` block and ``__main__.py`` of the package goes through ``run_command``."""
    entry_points = [
        p
        for root in (SRC, WORKSHOP)
        for p in root.rglob("*.py")
        if p.name == "__main__.py" or 'if __name__ == "__main__":' in p.read_text()
    ]
    assert len(entry_points) >= 6
    missing = [
        str(p.relative_to(SRC.parents[1]))
        for p in entry_points
        if "run_command(" not in p.read_text()
        and "trainopt.config.cli import main" not in p.read_text()
    ]
    assert not missing, f"commands that do not report mistakes through run_command: {missing}"
