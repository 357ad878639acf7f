"""Every page offered as a notebook runs top to bottom in a fresh kernel in an empty directory.

The notebooks are the ones the site offers for download (``docs/_ext/notebooks.py``), executed by
nbclient with the test's interpreter as the kernel; cells that need CUDA print why they were
skipped on a machine without it. The count of notebooks run, and each one's time, is kept in
``test-artifacts/notebooks.json``.

What each block printed is kept too, in ``docs/_generated/outputs/<page>.json``: the next build
of the site shows it beneath the block (``docs/_ext/trainopt_reading.py``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from notebooks import NOTEBOOK_PAGES, notebook_for
from trainopt_reading import code_sha1

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ARTIFACTS = ROOT / "test-artifacts"
CELL_TIMEOUT_S = 300


def test_the_notebook_pages_are_the_sections_pages() -> None:
    pages = NOTEBOOK_PAGES(DOCS)
    assert "guides/training-optimization/learning-rate-scheduling" in pages
    assert "guides/troubleshooting" in pages and "concepts/optimization" in pages
    assert not [p for p in pages if p.endswith("index") or p.startswith("reference/")]


@pytest.mark.slow
@pytest.mark.parametrize("page", NOTEBOOK_PAGES(DOCS))
def test_the_notebook_runs_in_a_fresh_kernel_in_an_empty_directory(page: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = nbformat.from_dict(notebook_for(DOCS / f"{page}.md"))
    nbformat.validate(notebook)
    assert any(cell.cell_type == "code" for cell in notebook.cells), page
    # the kernel is this interpreter, started in an empty folder, with trainopt from src/
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("TRAINOPT_REQUIRE_CUDA", raising=False)
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    started = time.perf_counter()
    client.execute()
    seconds = round(time.perf_counter() - started, 1)
    skipped = sum("skipped: " in "".join(o.get("text", "") for o in cell.get("outputs", []))
                  for cell in notebook.cells if cell.cell_type == "code")
    _keep_outputs(page, notebook)
    _record(page, {"code_cells": sum(c.cell_type == "code" for c in notebook.cells), "seconds": seconds,
                   "cells_skipped_here": skipped})


def _keep_outputs(page: str, notebook: object) -> None:
    """What each block printed, for the site to show beneath it (``docs/_generated/outputs``)."""
    printed = {}
    for cell in notebook.cells:
        where = cell.get("metadata", {}).get("trainopt")
        if cell.cell_type != "code" or not where or where.get("skipped_if"):
            continue
        text = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
        if text.strip():
            printed[str(where["line"])] = {"code_sha1": code_sha1(cell.source), "stdout": text.rstrip("\n")}
    target = DOCS / "_generated" / "outputs" / f"{page}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(printed, indent=1, sort_keys=True) + "\n"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


def _record(page: str, value: dict) -> None:
    path = ARTIFACTS / "notebooks.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[page] = value
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
