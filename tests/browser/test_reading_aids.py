"""Reading aids in the browser: the in-page contents at 1280 px and up, the "needs CUDA" badge, the
package pages of the API reference, the notebook button. Screenshots land in
``test-artifacts/screenshots``: the first screen of the stability page at 1280 px and the
``trainopt.stability`` reference page.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from extras import in_ci, require

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = (
    os.environ.get("TRAINOPT_CHROMIUM")
    or shutil.which("chromium")
    or shutil.which("chromium-browser")
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
STABILITY = "guides/training-optimization/training-stability.html"

if not CHROMIUM:
    if in_ci():
        pytest.fail(
            "CI must run the browser tests: install Debian's chromium (see .ci/run)", pytrace=False
        )
    pytest.skip("no Chromium binary found (set TRAINOPT_CHROMIUM)", allow_module_level=True)

playwright_api = require("playwright.sync_api", "test")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture(scope="module")
def server(built_site: Path) -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(built_site))
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _page(browser: object, url: str, width: int = 1280, height: int = 900) -> tuple[object, object]:
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.goto(url, wait_until="networkidle")
    return context, page


TOC_JS = r"""
() => {
  const bar = document.querySelector('.bd-sidebar-secondary');
  if (!bar) return null;
  const r = bar.getBoundingClientRect(), s = getComputedStyle(bar);
  const links = Array.from(
      bar.querySelectorAll('nav.page-toc a[href^="#"], .bd-toc-nav a[href^="#"]'))
    .filter(a => a.getBoundingClientRect().width > 0);
  return {visible: s.display !== 'none' && s.visibility !== 'hidden' && r.width > 0 && r.height > 0,
          left: r.left, right: r.right, links: links.length,
          article_right:
            document.querySelector('article.bd-article').getBoundingClientRect().right};
}
"""


@pytest.mark.parametrize("width", [1280, 1366, 1600])
def test_the_in_page_contents_are_visible_at_1280_px_and_wider(
    browser: object, server: str, width: int
) -> None:
    context, page = _page(browser, f"{server}/{STABILITY}", width=width)
    toc = page.evaluate(TOC_JS)
    if width == 1280:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "training-stability-first-screen-1280px.png"))
    overflow = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    context.close()
    assert toc and toc["visible"], f"no visible 'On this page' at {width} px: {toc}"
    assert toc["links"] >= 5, toc
    assert toc["right"] <= width + 1 and toc["left"] >= toc["article_right"] - 1, toc
    assert overflow <= 1


def test_gpu_only_blocks_carry_a_visible_needs_cuda_badge(browser: object, server: str) -> None:
    context, page = _page(browser, f"{server}/advanced/performance/memory-optimization.html")
    # the page folds its GPU-only checks: open the folds, as a reader who reads them does
    badges = page.evaluate(r"""() => { document.querySelectorAll('details').forEach(d => {
        d.open = true; }); return Array.from(
        document.querySelectorAll('p.trainopt-needs-cuda')).map(p => {
        const r = p.getBoundingClientRect();
        let next = p.nextElementSibling;
        while (next && next.matches('p.trainopt-block-note')) next = next.nextElementSibling;
        return {text: p.innerText.trim(), shown: r.width > 0 && r.height > 0,
                before_code: !!next && next.matches('div[class*=highlight-python]')};
    }); }""")
    context.close()
    assert badges, "no 'needs CUDA' badge on the memory page"
    assert all(
        b["shown"] and b["text"].startswith("needs CUDA") and b["before_code"] for b in badges
    ), badges


def test_a_package_reference_page_lists_its_exports_with_links(
    browser: object, server: str
) -> None:
    import trainopt.stability

    context, page = _page(browser, f"{server}/reference/trainopt.stability.html")
    rows = page.eval_on_selector_all(
        "#what-the-package-exports table tbody tr",
        "rows => rows.map(r => ({name: r.cells[0].innerText.trim(), "
        "href: r.querySelector('a')?.href || null,"
        " summary: r.cells[1].innerText.trim()}))",
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "reference-trainopt-stability-1280px.png"))
    first = next(r for r in rows if r["name"] == "TrainingStabilizer")
    page.goto(first["href"], wait_until="networkidle")
    target = page.evaluate("location.hash")
    landed = page.locator(f"[id='{target[1:]}']").count()
    sidebar = page.eval_on_selector_all(
        ".bd-sidebar-primary li.toctree-l1 > a", "as => as.map(a => a.innerText.trim())"
    )
    context.close()
    assert [r["name"] for r in rows] == list(trainopt.stability.__all__)
    assert all(r["href"] and r["summary"] for r in rows), [
        r for r in rows if not (r["href"] and r["summary"])
    ]
    assert target == "#trainopt.stability.stabilizer.TrainingStabilizer" and landed == 1
    assert "Training stability" in sidebar and len(sidebar) < 15, sidebar


def test_a_guide_page_offers_its_notebook(browser: object, server: str) -> None:
    context, page = _page(
        browser, f"{server}/guides/training-optimization/learning-rate-scheduling.html"
    )
    link = page.locator("p.trainopt-notebook a").first
    href = link.get_attribute("href")
    box = link.bounding_box()
    context.close()
    assert href == "learning-rate-scheduling.ipynb" and box and box["y"] < 900, (href, box)
    with urllib.request.urlopen(f"{server}/guides/training-optimization/{href}") as response:
        notebook = json.loads(response.read())
    assert notebook["nbformat"] == 4 and any(c["cell_type"] == "code" for c in notebook["cells"])
