"""Each page names the extras its examples need, and those are what its imports need.

The notebook tests run every page in one environment holding the wheel and every extra the
landing page names; this test makes each page's own note exact: a block that imports a module of
an extra the page does not name fails here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import tomllib
from audit import blocks
from notebooks import NOTEBOOK_PAGES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
BASE = {"torch", "numpy", "yaml"}
# the top-level modules each extra brings (any one of the extras listed will do)
PROVIDED_BY = {
    "matplotlib": {"plots", "hpo"},
    "optuna": {"hpo"},
    "transformers": {"hf"},
    "accelerate": {"hf"},
    "lightning": {"lightning"},
}


def _extras(page: str) -> list[str]:
    text = (DOCS / f"{page}.md").read_text()
    front = text[4 : text.index("\n---", 4)]
    match = re.search(r"^extras: \[(.*)\]$", front, re.M)
    assert match, f"{page}: the front matter has no extras: [...] line"
    return [e.strip().strip('"') for e in match.group(1).split(",") if e.strip()]


@pytest.mark.parametrize("page", NOTEBOOK_PAGES(DOCS))
def test_a_page_names_exactly_the_extras_its_blocks_import(page: str) -> None:
    named = _extras(page)
    assert set(named) <= set(EXTRAS), f"{page}: no such extra {sorted(set(named) - set(EXTRAS))}"
    imported = set()
    for block in blocks(DOCS / f"{page}.md"):
        if block.info.split()[:1] == ["python"]:
            imported |= {
                m.split(".")[0]
                for m in re.findall(
                    r"^\s*(?:>>> |\.\.\. )?(?:from|import)\s+([\w.]+)", block.body, re.M
                )
            }
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "trainopt"}
    unknown = third_party - BASE - set(PROVIDED_BY)
    assert not unknown, f"{page}: imports {sorted(unknown)}, which no extra provides"
    missing = {m for m in third_party - BASE if not PROVIDED_BY[m] & set(named)}
    assert not missing, f"{page}: imports {sorted(missing)} but names the extras {named}"
    needed = {e for m in third_party - BASE for e in PROVIDED_BY[m]}
    unneeded = [e for e in named if e not in needed and e != "plots"]
    assert not unneeded, f"{page}: names {unneeded}, which none of its blocks imports"


def test_the_plots_extra_is_named_where_a_block_draws() -> None:
    """``plot()`` of trainopt's monitors and finders imports matplotlib inside the call."""
    for page in NOTEBOOK_PAGES(DOCS):
        draws = any(
            re.search(r"\.plot\(", b.body)
            for b in blocks(DOCS / f"{page}.md")
            if b.info.split()[:1] == ["python"]
        )
        named = set(_extras(page))
        assert bool(named & {"plots", "hpo"}) if draws else "plots" not in named, (page, named)
