"""``python -m trainopt_site.perf.distributed``: ``trainopt_site.perf.distributed.cli``."""

import sys

from trainopt.config.cli import run_command
from trainopt_site.perf.distributed.cli import main

sys.exit(run_command(main))
