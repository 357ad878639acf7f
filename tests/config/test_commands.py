"""Every command line of trainopt, every option, given a bad value: one line on stderr, status 2.

The commands are found, not listed: every module under ``src/trainopt`` (and the site's workshop,
``docs/_lib/trainopt_site``) with a ``main(argv)`` that builds a
:class:`trainopt.config.cli.ArgumentParser`. Their options are read from the parsers
themselves (sub-commands included), so a new option is tested the day it is added. A bad value
must be refused while the arguments are read or checked, before any work starts: the command
runs in-process, and a mistake found after training would show as a slow test and a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import trainopt
import trainopt_site
from trainopt.config import cli
from trainopt.config.cli import output_file, output_folder, run_command

ROOT = Path(__file__).resolve().parents[2]


class _Parser(Exception):
    """Raised instead of parsing, to hand the parser a command built back to the test."""


def _commands() -> dict[str, tuple[object, argparse.ArgumentParser]]:
    """``{module: (main, parser)}`` for every module of trainopt and trainopt_site with a main."""
    found = {}
    original = cli.ArgumentParser.parse_args

    def grab(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parser(self)

    cli.ArgumentParser.parse_args = grab
    try:
        for info in [
            *pkgutil.walk_packages(trainopt.__path__, prefix="trainopt."),
            *pkgutil.walk_packages(trainopt_site.__path__, prefix="trainopt_site."),
        ]:
            if info.name.endswith(".__main__") and info.name != "trainopt.data.__main__":
                continue  # the others only call the main of a module found here
            module = importlib.import_module(info.name)
            main = vars(module).get("main")
            if not callable(main) or getattr(main, "__module__", None) != info.name:
                continue
            try:
                main([])
            except _Parser as got:
                found[info.name] = (main, got.args[0])
    finally:
        cli.ArgumentParser.parse_args = original
    return found


COMMANDS = _commands()


def _options(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.Action]]:
    """``(sub-command path, action)`` of every option and positional, sub-commands included."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, prefix + (name,))
            continue
        found.append((prefix, action))
    return found


CASES = [
    (module, prefix, action)
    for module, (_, parser) in COMMANDS.items()
    for prefix, action in _options(parser)
]

NUMERIC_TYPES = {
    "int",
    "float",
    "positive_int",
    "non_negative_int",
    "at_least_two",
    "positive_float",
    "fraction",
    "peak_tflops",
    "positive_seconds",
}

# Options that take any value: nothing to refuse.
ANY_VALUE = {"--note": "free text, recorded with the results as given"}

# Values that satisfy a required option, so that the option under test is the only mistake.
GOOD_POSITIONALS = {
    ("trainopt.hpo.cli", "config"): lambda tmp: str(ROOT / "src/trainopt/data/hpo_digits.yaml"),
    ("trainopt.perf.bench.cli", "baseline"): lambda tmp: str(ROOT / "docs/_data/bench_cpu.json"),
    ("trainopt.perf.bench.cli", "candidate"): lambda tmp: str(ROOT / "docs/_data/bench_cpu.json"),
    ("trainopt.diagnostics.cli", "path"): lambda tmp: str(
        ROOT / "src/trainopt/data/runs/healthy.jsonl"
    ),
}

BAD_POSITIONALS = {
    "config": "missing.yaml",
    "baseline": "missing.json",
    "candidate": "missing.json",
    "name": "no-such-file.yaml",
    "path": "missing.jsonl",
}


def _name(action: argparse.Action) -> str:
    return action.option_strings[0] if action.option_strings else action.dest


def _good(module: str, action: argparse.Action, tmp: Path) -> list[str]:
    if (module, action.dest) in GOOD_POSITIONALS:
        return [GOOD_POSITIONALS[module, action.dest](tmp)]
    if action.type is output_file or action.type is Path:
        value = str(tmp / "new" / f"{action.dest}.out")
    elif action.type is output_folder:
        value = str(tmp / "new" / action.dest)
    elif action.choices:
        value = list(action.choices)[0]
    elif getattr(action.type, "__name__", "") in NUMERIC_TYPES:
        value = "2"
    else:
        raise AssertionError(f"{module}: no good value known for the required {_name(action)}")
    return ([action.option_strings[0]] if action.option_strings else []) + [value]


def _bad(action: argparse.Action, blocker: Path) -> list[str]:
    """The option with a value it must refuse."""
    flag = action.option_strings[0] if action.option_strings else None
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return [f"{flag}=yes"]
    if action.type is output_file:
        value = str(blocker / "below.json")
    elif action.type in (output_folder, Path):
        value = str(blocker)
    elif action.choices:
        value = "no-such-choice"
    elif getattr(action.type, "__name__", "") in NUMERIC_TYPES:
        value = "-5x"
    elif flag == "--device" or getattr(action.type, "__name__", "") == "device":
        value = "tpu"
    elif flag == "--storage":
        value = "nosuch://study"
    elif flag == "--postgres":
        value = "mysql://not-postgres"
    elif flag == "--study-name":
        value = ""
    elif flag == "--layout":
        value = "dp=two"
    elif flag is None:
        value = BAD_POSITIONALS[action.dest]
    else:
        raise AssertionError(
            f"no bad value known for {flag}: add one here, or to ANY_VALUE with a reason"
        )
    return ([flag] if flag else []) + [value]


def _run(main: object, argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out):
        status = run_command(main, argv, stderr=err)
    return status, out.getvalue(), err.getvalue()


def test_every_command_is_found() -> None:
    assert {
        "trainopt.data.__main__",
        "trainopt.hpo.cli",
        "trainopt_site.diagnostics.runs",
        "trainopt.stability.recipe",
        "trainopt.perf.bench.cli",
        "trainopt_site.perf.distributed.cli",
    } <= set(COMMANDS)


@pytest.mark.parametrize(
    "module, prefix, action", CASES, ids=[f"{m}:{' '.join(p + (_name(a),))}" for m, p, a in CASES]
)
def test_a_bad_value_of_each_option_is_one_line_and_status_2(
    module: str,
    prefix: tuple[str, ...],
    action: argparse.Action,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = _name(action)
    if name in ANY_VALUE:
        pytest.skip(f"{name}: {ANY_VALUE[name]}")
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    main, parser = COMMANDS[module]
    sub = parser
    for part in prefix:
        sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[
            part
        ]
    argv = list(prefix)
    for other in sub._actions:
        if (
            other is not action
            and other.required
            and not isinstance(other, argparse._SubParsersAction)
        ):
            argv += _good(module, other, tmp_path)
    argv += _bad(action, blocker)
    status, out, err = _run(main, argv)
    lines = err.splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), (
        argv,
        status,
        err,
        out[-500:],
    )
    assert not out, f"work started before the mistake was found: {out[-500:]}"


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_help_is_plain_text_and_every_option_has_help(module: str) -> None:
    _, parser = COMMANDS[module]
    parsers = [("", parser)] + [(" ".join(p), s) for p, s in _subparsers(parser)]
    problems = []
    for label, p in parsers:
        text = p.format_help()
        if "``" in text or re.search(r":[a-z]+:`", text):
            problems.append(f"{module} {label}: reST markup in --help: {text[:300]!r}")
        problems += [
            f"{module} {label}: {_name(a)} has no help"
            for a in p._actions
            if not a.help and not isinstance(a, argparse._SubParsersAction)
        ]
    assert not problems, "\n".join(problems)


def _subparsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((prefix + (name,), sub))
                found += _subparsers(sub, prefix + (name,))
    return found


# The five tracebacks of issue 23, as a reader types them: each is one line, status 2.
ISSUE_23 = [
    [
        "-m",
        "trainopt.stability.recipe",
        "--checkpoint-dir",
        "ckpt",
        "--steps",
        "5",
        "--out",
        "a-file/w.pt",
    ],
    ["-m", "trainopt_site.diagnostics.runs", "--out", "a-file"],
    [
        "-m",
        "trainopt.hpo",
        str(ROOT / "src/trainopt/data/hpo_digits.yaml"),
        "--n-trials",
        "1",
        "--device",
        "tpu",
    ],
    ["-m", "trainopt_site.diagnostics.runs", "--out", "runs", "--device", "tpu"],
]


@pytest.mark.parametrize("argv", ISSUE_23, ids=lambda argv: " ".join(argv[1:3] + argv[-2:]))
def test_the_commands_of_issue_23_print_one_line(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("in the way\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "docs" / "_lib")]),
    }
    result = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"], "something was written"


def test_hpo_device_cuda_without_cuda_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is valid here")
    main, _ = COMMANDS["trainopt.hpo.cli"]
    monkeypatch.chdir(tmp_path)
    status, out, err = _run(
        main,
        [str(ROOT / "src/trainopt/data/hpo_digits.yaml"), "--n-trials", "1", "--device", "cuda"],
    )
    assert status == 2 and err.startswith("error: --device: ") and err.count("\n") == 1, err
