"""Fixtures of the diagnostics tests: the generated runs, trained once per session."""

from __future__ import annotations

import pytest

from trainopt.diagnostics import generate_run
from trainopt_site.diagnostics.generate import RunSpec, run_grid


@pytest.fixture(scope="session")
def generated_runs() -> list[tuple[RunSpec, list[dict]]]:
    """Every cause of :func:`run_grid` on 3 seeds and 2 widths: 66 runs of 300 steps (~20 s of
    CPU)."""
    return [(spec, generate_run(*spec)) for spec in run_grid(seeds=(0, 1, 2), widths=(32, 128))]
