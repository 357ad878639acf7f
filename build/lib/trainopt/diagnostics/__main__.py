"""``python -m trainopt.diagnostics``: see :mod:`trainopt.diagnostics.cli`."""

import sys

from trainopt.config.cli import run_command
from trainopt.diagnostics.cli import main

sys.exit(run_command(main))
