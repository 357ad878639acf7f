"""The Advanced Performance pages' workshop: what renders and records their evidence.

:mod:`trainopt_site.perf.bench` renders the benchmark results files as the pages' tables and
draws the benchmarking page's chart; :mod:`trainopt_site.perf.distributed` runs the distributed
page's multi-process checks together and records what lossy gradient compression costs
(``python -m trainopt_site.perf.distributed --out FILE``). The benchmarks themselves, which a
reader runs on their own hardware, stay in the library (``python -m trainopt.perf.bench``).
"""
