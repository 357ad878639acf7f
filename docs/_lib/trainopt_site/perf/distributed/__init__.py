"""The Distributed Training page's recorded evidence and its command line.

``python -m trainopt_site.perf.distributed`` (:mod:`~trainopt_site.perf.distributed.cli`) runs
every equivalence check of :mod:`trainopt.perf.distributed.checks` in one process group
(``--equivalence``), or measures the lossy communication hooks and writes
``docs/_data/distributed_compression.json`` (``--out FILE``), which
:func:`~trainopt_site.perf.distributed.compression.compression_table` renders on the page.
"""
