"""The benchmark results as the performance pages show them (and the stability page's cost table).

:mod:`~trainopt_site.perf.bench.report` renders a results file
(:func:`trainopt.perf.bench.results.read_results`) as MyST Markdown tables, labelled with the
machine that measured them, for the pages' ``{trainopt-render}`` blocks;
:mod:`~trainopt_site.perf.bench.plots` draws the Benchmarking page's throughput chart. The
benchmark command prints a plain summary of its own (:mod:`trainopt.perf.bench.summary`).
"""
