"""How every command line of trainopt reports a user's mistake: one line on stderr, status 2.

A mistake in a config file or in an argument prints ``error: <field>: <what is allowed>`` on
stderr and exits with status 2, as argparse does; a missing or unreadable file is named. There
is no traceback: a traceback is for a bug in trainopt, not for a typo in a command.

Every ``python -m trainopt...`` command builds its parser with :class:`ArgumentParser` and runs
its ``main`` through :func:`run_command`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn, TextIO

from trainopt.config.errors import ConfigError

__all__ = ["ArgumentParser", "UsageError", "error_line", "positive_int", "run_command"]


class UsageError(Exception):
    """A user's mistake on a command line: the argument or field, and what it allows.

    Example:
        >>> from trainopt.config.cli import UsageError
        >>> error = UsageError("--n-trials", "must be a positive int, got 0")
        >>> error.field, str(error)
        ('--n-trials', '--n-trials: must be a positive int, got 0')
    """

    def __init__(self, field: str, allowed: str) -> None:
        super().__init__(f"{field}: {allowed}")
        self.field = field
        self.allowed = allowed


def _from_argparse(message: str) -> UsageError:
    """argparse's error message as a :class:`UsageError` naming the argument."""
    argument = re.match(r"^argument (?P<name>[^:]+): (?P<rest>.*)$", message, flags=re.S)
    if argument:
        return UsageError(argument["name"], argument["rest"])
    required = re.match(r"^the following arguments are required: (?P<names>.*)$", message)
    if required:
        first, *others = required["names"].split(", ")
        also = f" (also missing: {', '.join(others)})" if others else ""
        return UsageError(first, f"required{also}")
    unknown = re.match(r"^unrecognized arguments: (?P<args>.*)$", message)
    if unknown:
        return UsageError(unknown["args"].split()[0], "not an argument of this command; see --help")
    one_of = re.match(r"^one of the arguments (?P<names>.*) is required$", message)
    if one_of:
        return UsageError("/".join(one_of["names"].split()), "give one of them")
    return UsageError("arguments", message)


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors raise :class:`UsageError` instead of exiting.

    :func:`run_command` prints them as one line; ``--help`` works as usual.

    Example:
        >>> from trainopt.config.cli import ArgumentParser, UsageError
        >>> parser = ArgumentParser(prog="demo")
        >>> _ = parser.add_argument("--steps", type=int, required=True)
        >>> try:
        ...     parser.parse_args(["--steps", "ten"])
        ... except UsageError as error:
        ...     print(error)
        --steps: invalid int value: 'ten'
    """

    def error(self, message: str) -> NoReturn:
        raise _from_argparse(message)


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts: an int of at least 1.

    Example:
        >>> from trainopt.config.cli import ArgumentParser, UsageError, positive_int
        >>> parser = ArgumentParser(prog="demo")
        >>> _ = parser.add_argument("--steps", type=positive_int)
        >>> parser.parse_args(["--steps", "3"]).steps
        3
        >>> try:
        ...     parser.parse_args(["--steps", "0"])
        ... except UsageError as error:
        ...     print(error)
        --steps: must be an int >= 1, got '0'
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.strip().lstrip("+"):
        raise argparse.ArgumentTypeError(f"must be an int >= 1, got {text!r}")
    return value


def error_line(error: BaseException) -> str:
    """The one line a command prints for a user's mistake: ``error: <field>: <what is allowed>``.

    Example:
        >>> from trainopt.config import ConfigError
        >>> from trainopt.config.cli import error_line
        >>> error_line(ConfigError("study.sampler", "must be one of ['tpe', 'qmc'], got 'tpee'"))
        "error: study.sampler: must be one of ['tpe', 'qmc'], got 'tpee'"
        >>> error_line(FileNotFoundError(2, "No such file or directory", "tune.yaml"))
        'error: tune.yaml: no such file'
    """
    if isinstance(error, (UsageError, ConfigError)):
        return f"error: {error}"
    if isinstance(error, IsADirectoryError):
        return f"error: {error.filename}: is a folder, not a file"
    if isinstance(error, FileNotFoundError):
        return f"error: {error.filename}: no such file"
    if isinstance(error, PermissionError):
        return f"error: {error.filename}: cannot be read or written (permission denied)"
    return f"error: {error}"


USER_ERRORS = (UsageError, ConfigError, FileNotFoundError, IsADirectoryError, PermissionError)
"""The errors :func:`run_command` reports as a user's mistake; anything else is a bug."""


def run_command(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None,
                *, stderr: TextIO | None = None) -> int:
    """Run a command's ``main(argv)``; return its exit status, 2 for a user's mistake.

    The status is what ``main`` returns if that is an int, else 0.

    A :class:`UsageError`, a :class:`~trainopt.config.ConfigError` or a file that is missing or
    can't be read is printed as one line (:func:`error_line`) on ``stderr``; any other exception
    is a bug and propagates with its traceback.

    Example:
        >>> import io
        >>> from trainopt.config.cli import UsageError, run_command
        >>> def main(argv):
        ...     raise UsageError("--out", "give a file name")
        >>> err = io.StringIO()
        >>> run_command(main, [], stderr=err), err.getvalue()
        (2, 'error: --out: give a file name\\n')
    """
    stream = sys.stderr if stderr is None else stderr
    try:
        status = main(argv)
    except USER_ERRORS as error:
        print(error_line(error), file=stream)
        return 2
    return status if isinstance(status, int) else 0
