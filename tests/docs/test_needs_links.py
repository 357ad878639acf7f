"""The "Run first" notes of the performance pages link to the blocks they name (issue 33).

A ``% needs: [the first block in “X”](#label)`` comment becomes a note whose words link to
``#label``; the ``(label)=`` target above that block gives the block the id (the rendering and
the check that each anchor is a python block are in ``tests/docs/test_reading_aids.py``). Here:
no note of these pages is left as plain words, and no link points at a later block.
"""

from __future__ import annotations

import re
from pathlib import Path

from audit import needs_of

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs" / "advanced" / "performance").glob("*.md"))
LINK = re.compile(r"\[[^\]]+\]\(#(?P<target>[\w-]+)\)")


def test_every_run_first_note_of_the_performance_pages_is_a_link():
    unlinked = [
        f"{page.name}:{line}: {what}"
        for page in PAGES
        for line, what in needs_of(page).items()
        if not LINK.search(what)
    ]
    assert not unlinked, "\n".join(unlinked)


def test_each_link_names_an_earlier_block_of_the_built_page(built_site: Path):
    for page in PAGES:
        html = (built_site / "advanced" / "performance" / f"{page.stem}.html").read_text()
        notes = re.findall(
            r'<p class="trainopt-block-note trainopt-needs(?![-\w])[^"]*">(.*?)</p>', html, re.S
        )
        hrefs = [re.findall(r'href="#([\w-]+)"', note) for note in notes]
        assert hrefs == [LINK.findall(what) for what in needs_of(page).values()], page.name
        for note, targets in zip(notes, hrefs):
            for target in targets:
                block = re.search(rf'highlight-python[^"]*" id="{target}"', html)
                assert block, f"{page.name}: #{target} is on no python block"
                assert block.start() < html.index(note), f"{page.name}: #{target} comes later"
