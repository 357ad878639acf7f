"""The site as a reader meets it: headless Chromium (Playwright) against the built site on localhost.

- every page loads with no console error, no failed request and no broken image;
- the grid cards of the landing pages lead to the right pages;
- every copy button puts exactly the code on the clipboard (no prompts, no output), and the copied
  Python of each page, pasted in order into a fresh interpreter, runs;
- search finds the scheduling page for "cosine" and the stability page for "loss scaling";
- light and dark themes and a phone-width viewport render the grids without overflow
  (screenshots kept under ``test-artifacts/screenshots``).

Runs where a Chromium binary is found (``TRAINOPT_CHROMIUM`` or ``/usr/bin/chromium``); skips with
that reason elsewhere, except in CI (``CI`` set), where a missing browser is a failure.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from audit import blocks

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ARTIFACTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = os.environ.get("TRAINOPT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]

if not CHROMIUM:
    if os.environ.get("CI"):
        pytest.fail("CI must run the browser tests: install Debian's chromium (see .ci/run)",
                    pytrace=False)
    pytest.skip("no Chromium binary found (set TRAINOPT_CHROMIUM)", allow_module_level=True)

playwright_api = pytest.importorskip("playwright.sync_api")

PAGES = sorted(
    p.relative_to(DOCS).with_suffix(".html").as_posix()
    for p in DOCS.rglob("*.md")
    if not any(s.startswith("_") for s in p.relative_to(DOCS).parts)
)
PROMPT = re.compile(r"^(>>> |\.\.\. |\$ )")


@pytest.fixture(scope="module")
def server(built_site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(built_site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _open(browser: object, url: str, **context_args: object) -> tuple[object, object, list[str]]:
    context = browser.new_context(permissions=["clipboard-read", "clipboard-write"], **context_args)
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.goto(url, wait_until="networkidle")
    return context, page, problems


def test_every_page_loads_without_errors_or_broken_images(browser: object, server: str) -> None:
    failures = []
    for name in PAGES:
        context, page, problems = _open(browser, f"{server}/{name}")
        broken = page.evaluate(
            "Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)")
        problems += [f"broken image: {src}" for src in broken]
        failures += [f"{name}: {p}" for p in problems]
        context.close()
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("landing, expected", [
    ("index.html", ["guides/training-optimization/index.html", "advanced/performance/index.html"]),
    ("guides/training-optimization/index.html", [
        "guides/training-optimization/learning-rate-scheduling.html",
        "guides/training-optimization/training-stability.html",
        "guides/training-optimization/hyperparameter-optimization.html"]),
    ("advanced/performance/index.html", [
        f"advanced/performance/{n}.html" for n in (
            "memory-optimization", "distributed-training", "profiling", "monitoring",
            "benchmarking", "mixed-precision")]),
])
def test_grid_cards_lead_to_their_pages(browser: object, server: str, landing: str, expected: list[str]) -> None:
    context, page, _ = _open(browser, f"{server}/{landing}")
    assert page.locator(".sd-card").count() == len(expected)
    for index, target in enumerate(expected):
        page.goto(f"{server}/{landing}", wait_until="networkidle")
        title = page.locator(".sd-card .sd-card-title").nth(index).inner_text().strip()
        page.locator(".sd-card").nth(index).click()
        page.wait_for_load_state("networkidle")
        assert page.url == f"{server}/{target}", (landing, index, page.url)
        assert page.locator("h1").first.inner_text().strip().rstrip("#").strip() == title
    context.close()


def _expected_copy(text: str) -> str:
    """What a reader must get: prompt lines without prompts if the block has prompts, else all."""
    lines = text.rstrip("\n").split("\n")
    if any(PROMPT.match(line) for line in lines):
        # Prompt lines lose their prompt, output lines go, empty lines stay (copybutton's
        # copy_empty_lines default).
        return "\n".join(PROMPT.sub("", line) for line in lines if PROMPT.match(line) or not line.strip())
    return "\n".join(lines)


def _copy_all(page: object) -> list[tuple[str, str, str]]:
    """Click every copy button of a page: ``(block classes, text shown, text copied)``."""
    results = []
    cells = page.locator("div.highlight")
    for i in range(cells.count()):
        cell = cells.nth(i)
        button = cell.locator("button.copybtn")
        if button.count() == 0:
            continue
        classes = cell.evaluate("e => (e.parentElement.className + ' ' + e.closest('.literal-block-wrapper, div[class*=highlight-]')?.className)")
        shown = cell.locator("pre").inner_text()
        page.evaluate("navigator.clipboard.writeText('')")
        cell.hover()
        button.click()
        copied = page.evaluate("navigator.clipboard.readText()")
        results.append((classes, shown, copied))
    return results


def _fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRAINOPT_REQUIRE_CUDA")}
    env["MPLBACKEND"] = "Agg"
    # Run as text pasted into an interpreter: __main__ has no file, as in the REPL, so examples
    # that start worker processes (spawn) behave as they do for a reader at the prompt.
    paste = "import sys; exec(compile(sys.stdin.read(), '<pasted>', 'exec'))"
    return subprocess.run([sys.executable, "-c", paste], input=code, capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)


def _runnable_blocks(md: Path) -> list[bool]:
    """For each ```python block of a page, whether a reader on this machine would run it."""
    import torch

    keep = []
    for block in blocks(md):
        if block.info.split()[:1] != ["python"]:
            continue
        skipped = block.skipped_by is not None and (
            "cuda" not in block.skipped_by.lower() or not torch.cuda.is_available())
        keep.append(not skipped)
    return keep


def test_copy_buttons_copy_exactly_the_code_and_it_runs(browser: object, server: str) -> None:
    checked = 0
    failures: list[str] = []
    scripts: list[tuple[str, str]] = []
    for name in PAGES:
        context, page, _ = _open(browser, f"{server}/{name}")
        copies = _copy_all(page)
        context.close()
        checked += len(copies)
        page_python: list[str] = []
        for classes, shown, copied in copies:
            if copied != _expected_copy(shown):
                failures.append(f"{name}: copied {copied[:200]!r}, expected {_expected_copy(shown)[:200]!r}")
            if any(PROMPT.match(line) for line in copied.split("\n")):
                failures.append(f"{name}: a prompt reached the clipboard: {copied[:120]!r}")
            if "trainopt-source" in classes:
                scripts.append((f"{name} (implementation block)", copied))
            elif "highlight-python" in classes and "reference/" not in name:
                page_python.append(copied)
        md = DOCS / name.replace(".html", ".md")
        keep = _runnable_blocks(md)
        if len(keep) != len(page_python):
            failures.append(f"{name}: {len(page_python)} python copy buttons for {len(keep)} python blocks")
        elif page_python:
            scripts.append((f"{name} (its examples, in order)",
                            "\n\n".join(code for code, run in zip(page_python, keep) if run)))
    assert checked > 0
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda item: _fresh_python(item[1]), scripts))
    for (label, _), result in zip(scripts, results):
        if result.returncode != 0:
            failures.append(f"{label} failed in a fresh interpreter:\n{result.stderr[-2000:]}")
    print(f"copy buttons checked: {checked}; scripts run in fresh interpreters: {len(scripts)}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("query, page_name", [
    ("cosine", "guides/training-optimization/learning-rate-scheduling.html"),
    ("loss scaling", "guides/training-optimization/training-stability.html"),
])
def test_search_finds_the_right_page(browser: object, server: str, query: str, page_name: str) -> None:
    context, page, problems = _open(browser, f"{server}/search.html?q={query.replace(' ', '+')}")
    # Sphinx adds results one by one, then writes its summary: wait for the summary.
    page.wait_for_function(
        "document.querySelector('#search-results p.search-summary')?.textContent.trim().length > 0",
        timeout=30_000)
    hrefs = page.eval_on_selector_all("#search-results ul.search li a", "els => els.map(e => e.href)")
    assert any(page_name in href for href in hrefs[:10]), "\n".join(hrefs[:10])
    assert not problems, problems
    context.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)])
def test_landing_pages_render_without_overflow(browser: object, server: str, theme: str,
                                                width: int, height: int) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for landing in ("index.html", "guides/training-optimization/index.html", "advanced/performance/index.html"):
        context = browser.new_context(viewport={"width": width, "height": height})
        context.add_init_script(f"localStorage.setItem('theme', '{theme}'); localStorage.setItem('mode', '{theme}');")
        page = context.new_page()
        page.goto(f"{server}/{landing}", wait_until="networkidle")
        assert page.evaluate("document.documentElement.dataset.theme") == theme
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{landing} overflows by {overflow}px at {width}px ({theme})"
        cards = page.eval_on_selector_all(
            ".sd-card", "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.right]; })")
        assert cards and all(left >= 0 and right <= width + 1 for left, right in cards), cards
        name = landing.replace("/", "_").replace(".html", "")
        page.screenshot(path=str(ARTIFACTS / f"{name}-{theme}-{width}px.png"), full_page=True)
        context.close()
