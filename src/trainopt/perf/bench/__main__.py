"""``python -m trainopt.perf.bench``: see :mod:`trainopt.perf.bench.cli`."""

import sys

from trainopt.perf.bench.cli import main

sys.exit(main())
