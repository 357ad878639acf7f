"""``python -m trainopt.data [NAME]``: list the files shipped with trainopt, or print one.

Print one to copy it: ``python -m trainopt.data hpo_digits.yaml > hpo_digits.yaml``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from trainopt.config.cli import ArgumentParser, UsageError, run_command
from trainopt.data import names, path


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m trainopt.data", description=__doc__.splitlines()[0])
    parser.add_argument("name", nargs="?", help="a shipped file; without it, list them all")
    args = parser.parse_args(argv)
    if args.name is None:
        print("\n".join(names()))
        return 0
    if args.name not in names():
        raise UsageError("name", f"must be one of the shipped files {names()}, got {args.name!r}")
    sys.stdout.write(path(args.name).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
