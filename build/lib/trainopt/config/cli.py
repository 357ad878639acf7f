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
from pathlib import Path
from typing import Any, NoReturn, TextIO

from trainopt.config.errors import ConfigError

__all__ = [
    "ArgumentParser",
    "UsageError",
    "device",
    "error_line",
    "output_file",
    "output_folder",
    "plain_text",
    "positive_int",
    "run_command",
]


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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("description"):
            kwargs["description"] = plain_text(kwargs["description"])
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if isinstance(kwargs.get("help"), str):
            kwargs["help"] = plain_text(kwargs["help"])
        return super().add_argument(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise _from_argparse(message)


ROLE = re.compile(r":(?:py:)?[a-z]+:`~?(?:[\w.]*\.)?([^`.]+)`")
LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """Help text as a terminal shows it: reST roles and double-backquoted literals become plain.

    Example:
        >>> from trainopt.config.cli import plain_text
        >>> plain_text("``python -m trainopt.data [NAME]``: see :func:`~trainopt.data.path`")
        'python -m trainopt.data [NAME]: see path'
    """
    return LITERAL.sub(r"\1", ROLE.sub(r"\1", text))


def output_file(text: str) -> Path:
    """An argparse ``type`` for a file a command writes: not a folder, and not below a file.

    Checked when the arguments are read, so the mistake is reported before any work starts.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from trainopt.config.cli import ArgumentParser, UsageError, output_file
        >>> parser = ArgumentParser(prog="demo")
        >>> _ = parser.add_argument("--out", type=output_file)
        >>> blocker = Path(tempfile.mkdtemp()) / "notes.txt"
        >>> _ = blocker.write_text("a file")
        >>> try:
        ...     parser.parse_args(["--out", str(blocker / "results.json")])
        ... except UsageError as error:
        ...     print(str(error).replace(str(blocker.parent), "..."))
        --out: .../notes.txt is a file, so .../notes.txt/results.json cannot be written below it
    """
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder: give a file name")
    _nothing_in_the_way(path)
    return path


def output_folder(text: str) -> Path:
    """An argparse ``type`` for a folder a command writes into (created if missing): not a file.

    Example:
        >>> import tempfile
        >>> from trainopt.config.cli import ArgumentParser, UsageError, output_folder
        >>> parser = ArgumentParser(prog="demo")
        >>> _ = parser.add_argument("--out", type=output_folder)
        >>> with tempfile.NamedTemporaryFile() as existing:
        ...     try:
        ...         parser.parse_args(["--out", existing.name])
        ...     except UsageError as error:
        ...         message = str(error)
        ...         print(message.endswith("is a file; give a folder (it is created if missing)"))
        True
    """
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{path} is a file; give a folder (it is created if missing)"
        )
    _nothing_in_the_way(path)
    return path


def _nothing_in_the_way(path: Path) -> None:
    blocked = next(
        (parent for parent in path.parents if parent.exists() and not parent.is_dir()), None
    )
    if blocked is not None:
        raise argparse.ArgumentTypeError(
            f"{blocked} is a file, so {path} cannot be written below it"
        )


def device(text: str) -> str:
    """An argparse ``type`` for ``--device``: ``cpu``, ``cuda`` or ``cuda:N``, checked against this
    machine.

    Example:
        >>> from trainopt.config.cli import ArgumentParser, UsageError, device
        >>> parser = ArgumentParser(prog="demo")
        >>> _ = parser.add_argument("--device", type=device, default="cpu")
        >>> parser.parse_args(["--device", "cpu"]).device
        'cpu'
        >>> try:
        ...     parser.parse_args(["--device", "tpu"])
        ... except UsageError as error:
        ...     print(error)
        --device: 'tpu' is not a device; give cpu, cuda or cuda:N
    """
    import torch

    allowed = "give cpu, cuda or cuda:N"
    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; {allowed}") from None
    if parsed.type == "cpu":
        return "cpu"
    if parsed.type != "cuda":
        raise argparse.ArgumentTypeError(f"{text!r} is not supported; {allowed}")
    count = torch.cuda.device_count()
    if count == 0:
        raise argparse.ArgumentTypeError(
            f"{text} is not available: this machine has no CUDA device; give cpu"
        )
    if parsed.index is not None and parsed.index >= count:
        raise argparse.ArgumentTypeError(
            f"{text} is not a device here: this machine has {count} CUDA device(s)"
        )
    return str(parsed)


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


def run_command(
    main: Callable[[Sequence[str] | None], int | None],
    argv: Sequence[str] | None = None,
    *,
    stderr: TextIO | None = None,
) -> int:
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
