"""Benchmarks: one timer, one MFU definition, one results schema and summary, one command line.

``python -m trainopt.perf.bench {matrix,recipe,stability,experiments,all}`` runs them
(:mod:`trainopt.perf.bench.cli`), writes a results file and prints its summary
(:func:`~trainopt.perf.bench.summary.summary`); the Benchmarking page explains them.
"""

from trainopt.perf.bench.configs import BenchConfig, build_matrix
from trainopt.perf.bench.harness import measure, recipe_pair, run_matrix
from trainopt.perf.bench.summary import summary

__all__ = [
    "BenchConfig",
    "build_matrix",
    "measure",
    "recipe_pair",
    "run_matrix",
    "summary",
]
