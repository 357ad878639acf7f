"""Every page offered as a notebook runs top to bottom in a fresh kernel in an empty directory.

The notebooks are the ones the site offers for download (``docs/_ext/notebooks.py``), executed by
nbclient in a kernel whose interpreter is a fresh virtual environment holding trainopt's wheel with
exactly the extras the landing page names (the ``wheel_python`` fixture): no path to the test
environment, so a page that needs a module the wheel or those extras lack fails here. Cells that
need CUDA print why they were skipped on a machine without it. The count of notebooks run, and
each one's time, is kept in ``test-artifacts/notebooks.json``.

What each block printed is the page's "Output" under the block (``docs/_ext/trainopt_reading.py``),
read from ``docs/_data/outputs/<page>.json``, which is committed. Each run checks it: a block that
prints must have a recorded output for its current code, and what it prints now must begin with the
same line, numbers masked (timings, losses and addresses differ from machine to machine).
``TRAINOPT_RECORD_OUTPUTS=1`` writes the file from this run instead (on CPU; cells that need CUDA
print only why they were skipped, and those are not recorded). On a machine with CUDA only the
set of printing blocks is compared, as the values are a CPU's.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from artifacts import record
from audit import blocks
from extras import require
from notebooks import NOTEBOOK_PAGES, notebook_for
from trainopt_reading import code_sha1

nbformat = require("nbformat", "test")
nbclient = require("nbclient", "test")

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ARTIFACTS = ROOT / "test-artifacts"
OUTPUTS = DOCS / "_data" / "outputs"
CELL_TIMEOUT_S = 300


def test_the_notebook_pages_are_the_sections_pages() -> None:
    pages = NOTEBOOK_PAGES(DOCS)
    assert "guides/training-optimization/learning-rate-scheduling" in pages
    assert "guides/troubleshooting" in pages and "concepts/optimization" in pages
    assert not [p for p in pages if p.endswith("index") or p.startswith("reference/")]


def test_the_notebooks_markdown_carries_no_myst_markup() -> None:
    """Folds, admonitions and figures become plain markdown: no ``:::`` fence, no directive option
    (``:icon: beaker``), no ``% skip:`` comment reaches a notebook cell."""
    found = []
    for page in NOTEBOOK_PAGES(DOCS):
        for cell in notebook_for(DOCS / f"{page}.md")["cells"]:
            if cell["cell_type"] == "markdown":
                found += [
                    f"{page}: {line!r}"
                    for line in cell["source"].splitlines()
                    if re.match(r"^\s*(:{3,}|:[\w-]+:(\s|$)|%\s*(skip|needs):|```\{)", line)
                ]
    assert not found, "\n".join(found)


@pytest.mark.slow
@pytest.mark.parametrize("page", NOTEBOOK_PAGES(DOCS))
def test_the_notebook_runs_in_a_fresh_kernel_in_an_empty_directory(
    page: str, tmp_path: Path, wheel_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notebook = nbformat.from_dict(notebook_for(DOCS / f"{page}.md"))
    nbformat.validate(notebook)
    assert any(cell.cell_type == "code" for cell in notebook.cells), page
    # the kernel: the wheel's environment, started in an empty folder, nothing of the repository
    notebook.cells.append(
        nbformat.v4.new_code_cell("import trainopt\nprint('trainopt from', trainopt.__file__)")
    )
    monkeypatch.setenv("JUPYTER_PATH", str(wheel_python.parents[1] / "share" / "jupyter"))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("PYTHONNOUSERSITE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.delenv("TRAINOPT_REQUIRE_CUDA", raising=False)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="trainopt-wheel",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    started = time.perf_counter()
    client.execute()
    where = "".join(o.get("text", "") for o in notebook.cells.pop().outputs).strip()
    assert where.startswith("trainopt from ") and str(wheel_python.parents[1]) in where, where
    seconds = round(time.perf_counter() - started, 1)
    skipped = sum(
        "skipped: " in "".join(o.get("text", "") for o in cell.get("outputs", []))
        for cell in notebook.cells
        if cell.cell_type == "code"
    )
    printed = _printed(notebook, page)
    target = OUTPUTS / f"{page}.json"
    if os.environ.get("TRAINOPT_RECORD_OUTPUTS") == "1":
        target.parent.mkdir(parents=True, exist_ok=True)
        stored = {sha1: {"stdout": value["stdout"]} for sha1, value in printed.items()}
        target.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(target.read_text()) if target.exists() else {}
    again = "record them again with TRAINOPT_RECORD_OUTPUTS=1 pytest tests/docs/test_notebooks.py"
    assert sorted(recorded) == sorted(printed), (
        f"{page}: the blocks that print (at lines {sorted(v['line'] for v in printed.values())}) "
        "are not the blocks with a recorded output "
        f"(by code hash {sorted(k[:8] for k in recorded)}, these blocks now: "
        f"{sorted(k[:8] for k in printed)}); {again}"
    )
    import torch

    # The outputs are recorded on a CPU; where CUDA runs the blocks, values (and words that depend
    # on them) may differ: there only the set of printing blocks is compared.
    for sha1, now in printed.items() if not torch.cuda.is_available() else ():
        # Timings and losses differ from machine to machine, and a profiler's rows swap places:
        # the first line, numbers masked, says whether it is the same output.
        assert _masked(recorded[sha1]["stdout"])[:1] == _masked(now["stdout"])[:1], (
            f"{page}, line {now['line']}: the page shows\n{recorded[sha1]['stdout']}\n"
            f"but the block prints\n{now['stdout']}"
        )
    _record(
        page,
        {
            "code_cells": sum(c.cell_type == "code" for c in notebook.cells),
            "seconds": seconds,
            "cells_skipped_here": skipped,
        },
    )


def _printed(notebook: object, page: str) -> dict[str, dict]:
    """What each block that runs here printed, by the hash of the page block's code (the key the
    site looks it up by; a doctest block's cell holds converted code) and its line."""
    on_page = {block.line: block for block in blocks(DOCS / f"{page}.md")}
    printed = {}
    for cell in notebook.cells:
        where = cell.get("metadata", {}).get("trainopt")
        if cell.cell_type != "code" or not where or where.get("skipped_if"):
            continue
        text = "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")
        if text.strip():
            printed[code_sha1(on_page[where["line"]].body)] = {
                "line": where["line"],
                "stdout": text.rstrip("\n"),
            }
    return printed


def _masked(text: str) -> list[str]:
    """The lines of ``text`` with numbers, addresses and runs of spaces masked."""
    text = re.sub(r"0x[0-9a-f]+", "ADDR", text)
    text = re.sub(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?", "N", text)
    return [" ".join(line.split()) for line in text.splitlines()]


def _record(page: str, value: dict) -> None:
    record("notebooks.json", page, value)  # both workers run notebooks: under a lock
