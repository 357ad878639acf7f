"""Benchmarks: one harness, one results schema, one command line (the Benchmarking page).

``python -m trainopt.perf.bench {matrix,recipe,stability,experiments,all}`` runs them.
"""

from trainopt.perf.bench.configs import BenchConfig, build_matrix
from trainopt.perf.bench.harness import measure, recipe_pair, run_matrix

__all__ = ["BenchConfig", "build_matrix", "measure", "recipe_pair", "run_matrix"]
