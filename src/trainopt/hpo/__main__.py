"""``python -m trainopt.hpo CONFIG --n-trials N``: see :mod:`trainopt.hpo.cli`."""

import sys

from trainopt.hpo.cli import main

sys.exit(main())
