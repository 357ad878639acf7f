"""``python -m trainopt.perf.planner``: see :mod:`trainopt.perf.planner.cli`."""

import sys

from trainopt.config.cli import run_command
from trainopt.perf.planner.cli import main

sys.exit(run_command(main))
