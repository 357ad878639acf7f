"""Reading aids in the built HTML: the version, "Run first" and "needs CUDA" notes next to the
blocks they describe, recorded output under printing blocks, the notebook button, 2x figures."""

from __future__ import annotations

import json
import re
from html import unescape as html_unescape
from pathlib import Path

from audit import blocks, needs_of
from notebooks import NOTEBOOK_PAGES
from PIL import Image
from trainopt_reading import code_sha1

import trainopt

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(
    p for p in DOCS.rglob("*.md") if not any(s.startswith("_") for s in p.relative_to(DOCS).parts)
)


def _html(site: Path, page: Path) -> str:
    return (site / page.relative_to(DOCS).with_suffix(".html")).read_text()


def test_the_site_shows_the_package_version(built_site: Path) -> None:
    html = (built_site / "index.html").read_text()
    assert f"trainopt {trainopt.__version__}" in html
    assert re.search(
        r"documents <code[^>]*><span class=\"pre\">trainopt</span></code> "
        rf"{re.escape(trainopt.__version__)}",
        html,
    )


def test_each_marked_block_shows_what_to_run_first(built_site: Path) -> None:
    """The "Run first" note above each marked block says what its comment says; a block it names
    with a link (``[the set-up block](#lr-setup)``) is a link to that block's own anchor."""
    linked = 0
    for page in PAGES:
        needs = needs_of(page)
        if not needs:
            continue
        html = _html(built_site, page)
        # the note sits right above its block; a "needs CUDA" note may come between
        # (inside a dropdown, sphinx-design adds its own class to the paragraph)
        shown = re.findall(
            r'<p class="trainopt-block-note trainopt-needs(?![-\w])[^"]*">'
            r"<span[^>]*>Run first</span> (.*?)</p>\s*"
            r'(?:<p class="trainopt-block-note trainopt-(?:needs-cuda|skips)[^"]*">.*?</p>\s*)?'
            r'<div class="[^"]*highlight-python',
            html,
        )
        said = [re.sub(r"\[([^\]]+)\]\(#[\w-]+\)", r"\1", what) for what in needs.values()]
        assert [re.sub(r"<[^>]+>", "", s) for s in shown] == said, page
        for note, what in zip(shown, needs.values()):
            hrefs = re.findall(r'<a class="reference internal" href="#([\w-]+)"', note)
            assert hrefs == re.findall(r"\]\(#([\w-]+)\)", what), (page, what)
            for anchor in hrefs:  # the anchor is on a python block of the same page
                assert re.search(
                    rf'<div class="[^"]*highlight-python[^"]*" id="{anchor}">', html
                ), f"{page.relative_to(DOCS)}: '#{anchor}' names no python block of the page"
            linked += len(hrefs)
    assert linked > 0


def test_each_gpu_only_block_carries_a_needs_cuda_badge(built_site: Path) -> None:
    checked = 0
    for page in PAGES:
        gpu = [b for b in blocks(page) if b.skipped_by and re.search(r"cuda", b.skipped_by, re.I)]
        badges = re.findall(
            r'<p class="trainopt-block-note trainopt-needs-cuda[^"]*">'
            r"<span[^>]*>needs CUDA</span>[^<]*</p>"
            r'\s*(?:<p class="trainopt-block-note[^"]*">.*?</p>\s*)*'
            r'<div class="[^"]*highlight-python',
            _html(built_site, page),
        )
        assert len(badges) == len(gpu), (
            f"{page.relative_to(DOCS)}: {len(gpu)} GPU-only blocks, {len(badges)} badges"
        )
        checked += len(gpu)
    assert checked > 0


def test_recorded_output_is_shown_under_the_block_that_printed_it(built_site: Path) -> None:
    """Every recorded output (``docs/_data/outputs``, checked against a run by test_notebooks) is
    shown under its block, and none is stale: each belongs to a block of the page as it is now."""
    recorded = sorted((DOCS / "_data" / "outputs").rglob("*.json"))
    assert len(recorded) == len(NOTEBOOK_PAGES(DOCS))
    shown = 0
    for path in recorded:
        page = DOCS / path.relative_to(DOCS / "_data" / "outputs").with_suffix(".md")
        html = _html(built_site, page)
        outputs = [
            html_unescape(re.sub(r"<[^>]+>", "", o))
            for o in re.findall(
                r'<div class="[^"]*trainopt-output[^"]*"><div class="highlight"><pre>(.*?)</pre>',
                html,
                re.S,
            )
        ]
        by_sha = {code_sha1(b.body): b for b in blocks(page)}
        for sha1, output in json.loads(path.read_text()).items():
            block = by_sha.get(sha1)
            assert block is not None and "print(" in block.body, (
                f"{page.relative_to(DOCS)}: an output recorded for a block no longer on the page "
                f"(code hash {sha1[:8]})"
            )
            assert output["stdout"].strip() in [o.strip() for o in outputs], (
                page.relative_to(DOCS),
                block.line,
            )
            shown += 1
    assert shown >= 10


def test_every_notebook_page_has_its_button_and_its_notebook(built_site: Path) -> None:
    pages = NOTEBOOK_PAGES(DOCS)
    assert len(pages) >= 10
    for name in pages:
        html = (built_site / f"{name}.html").read_text()
        button = re.search(r'<p class="trainopt-notebook"><a [^>]*href="([^"]+\.ipynb)"', html)
        assert button and button.group(1) == Path(name).name + ".ipynb", name
        assert html.index("trainopt-notebook") < html.index("<h2"), (
            f"{name}: the button is not at the top"
        )
        notebook = json.loads((built_site / f"{name}.ipynb").read_text())
        assert notebook["nbformat"] == 4 and notebook["cells"], name


def test_figures_are_2x_pngs_shown_at_half_their_pixel_width(built_site: Path) -> None:
    count = 0
    for page in PAGES:
        path = built_site / page.relative_to(DOCS).with_suffix(".html")
        for img in re.findall(
            r'<figure class="[^"]*trainopt-figure[^"]*".*?(<img [^>]*>)', path.read_text(), re.S
        ):
            src = re.search(r'src="([^"]+)"', img).group(1)
            width = re.search(r'style="width:\s*(\d+)px', img)
            natural = Image.open(path.parent / src).size[0]
            if width:
                count += 1
                assert int(width.group(1)) * 2 <= natural + 1, (
                    f"{page.relative_to(DOCS)}: {src} is not 2x"
                )
    assert count > 0
