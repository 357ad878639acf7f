"""``python -m trainopt.hpo CONFIG --n-trials N``: see :mod:`trainopt.hpo.cli`."""

import sys

from trainopt.config.cli import run_command
from trainopt.hpo.cli import main

sys.exit(run_command(main))
