"""``python -m trainopt.perf.distributed``: the command line of ``trainopt.perf.distributed.cli``."""

import sys

from trainopt.config.cli import run_command
from trainopt.perf.distributed.cli import main

sys.exit(run_command(main))
