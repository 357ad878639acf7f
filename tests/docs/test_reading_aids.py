"""Reading aids in the built HTML: the version, "Run first" and "needs CUDA" notes next to the blocks
they describe, recorded output under printing blocks, the notebook button, 2x figures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import trainopt
from audit import blocks, needs_of
from notebooks import NOTEBOOK_PAGES
from trainopt_reading import code_sha1
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if not any(s.startswith("_") for s in p.relative_to(DOCS).parts))


def _html(site: Path, page: Path) -> str:
    return (site / page.relative_to(DOCS).with_suffix(".html")).read_text()


def test_the_site_shows_the_package_version(built_site: Path) -> None:
    html = (built_site / "index.html").read_text()
    assert f"trainopt {trainopt.__version__}" in html
    assert re.search(rf"documents <code[^>]*><span class=\"pre\">trainopt</span></code> {re.escape(trainopt.__version__)}",
                     html)


def test_each_marked_block_shows_what_to_run_first(built_site: Path) -> None:
    for page in PAGES:
        needs = needs_of(page)
        if not needs:
            continue
        shown = re.findall(r'<p class="trainopt-block-note trainopt-needs[^"]*"><span[^>]*>Run first</span> (.*?)</p>\s*'
                           r'<div class="[^"]*highlight-python', _html(built_site, page))
        assert [re.sub(r"<[^>]+>", "", s) for s in shown] == list(needs.values()), page


def test_each_gpu_only_block_carries_a_needs_cuda_badge(built_site: Path) -> None:
    checked = 0
    for page in PAGES:
        gpu = [b for b in blocks(page) if b.skipped_by and re.search(r"cuda", b.skipped_by, re.I)]
        badges = re.findall(r'<p class="trainopt-block-note trainopt-needs-cuda[^"]*"><span[^>]*>needs CUDA</span>[^<]*</p>'
                            r'\s*(?:<p class="trainopt-block-note[^"]*">.*?</p>\s*)*<div class="[^"]*highlight-python',
                            _html(built_site, page))
        assert len(badges) == len(gpu), f"{page.relative_to(DOCS)}: {len(gpu)} GPU-only blocks, {len(badges)} badges"
        checked += len(gpu)
    assert checked > 0


def test_recorded_output_is_shown_under_the_block_that_printed_it(built_site: Path) -> None:
    recorded = sorted((DOCS / "_generated" / "outputs").rglob("*.json"))
    shown = 0
    for path in recorded:
        page = DOCS / path.relative_to(DOCS / "_generated" / "outputs").with_suffix(".md")
        html = _html(built_site, page)
        for line, recorded in json.loads(path.read_text()).items():
            if not isinstance(recorded, dict):
                continue  # written by an older version of the notebook test
            block = next((b for b in blocks(page) if b.line == int(line)), None)
            if block and "print(" in block.body and recorded["code_sha1"] == code_sha1(block.body):
                first = recorded["stdout"].splitlines()[0].strip()
                assert "trainopt-output" in html and first.split()[0] in html, (page, line)
                shown += 1
    if recorded:
        assert shown > 0


def test_every_notebook_page_has_its_button_and_its_notebook(built_site: Path) -> None:
    pages = NOTEBOOK_PAGES(DOCS)
    assert len(pages) >= 10
    for name in pages:
        html = (built_site / f"{name}.html").read_text()
        button = re.search(r'<p class="trainopt-notebook"><a [^>]*href="([^"]+\.ipynb)"', html)
        assert button and button.group(1) == Path(name).name + ".ipynb", name
        assert html.index("trainopt-notebook") < html.index("<h2"), f"{name}: the button is not at the top"
        notebook = json.loads((built_site / f"{name}.ipynb").read_text())
        assert notebook["nbformat"] == 4 and notebook["cells"], name


def test_figures_are_2x_pngs_shown_at_half_their_pixel_width(built_site: Path) -> None:
    count = 0
    for page in PAGES:
        path = built_site / page.relative_to(DOCS).with_suffix(".html")
        for img in re.findall(r'<figure class="[^"]*trainopt-figure[^"]*".*?(<img [^>]*>)', path.read_text(), re.S):
            src = re.search(r'src="([^"]+)"', img).group(1)
            width = re.search(r'style="width:\s*(\d+)px', img)
            natural = Image.open(path.parent / src).size[0]
            if width:
                count += 1
                assert int(width.group(1)) * 2 <= natural + 1, f"{page.relative_to(DOCS)}: {src} is not 2x"
    assert count > 0
