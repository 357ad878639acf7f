"""``python -m trainopt.perf.distributed``: see :mod:`trainopt.perf.distributed.cli`."""

from trainopt.perf.distributed.cli import main

main()
