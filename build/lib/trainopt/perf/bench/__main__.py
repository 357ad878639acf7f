"""``python -m trainopt.perf.bench``: see :mod:`trainopt.perf.bench.cli`."""

import sys

from trainopt.config.cli import run_command
from trainopt.perf.bench.cli import main

sys.exit(run_command(main))
