"""``python -m trainopt_site.perf.planner --out FILE``: record the planner's checks on this
machine (:func:`trainopt_site.perf.planner.checks.record`)."""

import sys

from trainopt.config.cli import ArgumentParser, output_file, run_command
from trainopt_site.perf.planner.checks import record


def main(argv: list[str] | None = None) -> int:
    """Record the checks to ``--out``."""
    parser = ArgumentParser(prog="python -m trainopt_site.perf.planner")
    parser.add_argument("--out", type=output_file, required=True, help="the JSON file to write")
    record(parser.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main))
