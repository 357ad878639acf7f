"""The site as a reader meets it: headless Chromium (Playwright) against the built site on
localhost.

- every page loads with no console error, no failed request and no broken image;
- the grid cards of the landing pages lead to the right pages; the Training Optimization grid has
  2 columns and no card breaks a word at 1280 px;
- every copy button puts exactly the code on the clipboard (no prompts, no output);
- copied blocks run where a reader runs them: each usage block's copy is the code the page's
  notebook runs in order in a fresh kernel in an empty directory (``tests/docs/test_notebooks.py``),
  and pasted line by line into ``code.InteractiveConsole`` it reads as the same statements; each
  implementation runs alone in a fresh interpreter in an empty directory, and every example of
  the API reference is its docstring's, which Sybil runs alone in a fresh namespace and an empty
  directory (counts in ``test-artifacts/copied-blocks.json``);
- pages under ``guides/``, ``advanced/`` and ``concepts/`` stay under 15,000 px at 1280 px with the
  implementations folded (heights in ``test-artifacts/page-heights.json``);
- nothing is clipped at 1280 px and 390 px: display maths, code outside dropdowns, wide tables, the
  page itself;
- every figure has a caption, opens its full-size PNG, and its smallest text is >= 9 px as
  displayed;
- no visible sidebar is empty;
- search finds the scheduling page for "cosine" and the stability page for "loss scaling";
- light and dark themes and a phone-width viewport render the grids without overflow
  (screenshots kept under ``test-artifacts/screenshots``).

Runs where a Chromium binary is found (``TRAINOPT_CHROMIUM`` or ``/usr/bin/chromium``); skips with
that reason elsewhere, except in CI (``CI`` set), where a missing browser is a failure.
"""

from __future__ import annotations

import code
import functools
import http.server
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from artifacts import record
from audit import blocks
from extras import in_ci, require

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ARTIFACTS = ROOT / "test-artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
BUDGETED = ("guides/", "advanced/", "concepts/")
HEIGHT_BUDGET_PX = 12_000
MIN_TEXT_PX = 9
MIN_TEXT_KEY = "trainopt_min_text_px"  # PNG tEXt: smallest text height in px at the natural size
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

if not CHROMIUM:
    if in_ci():
        pytest.fail(
            "CI must run the browser tests: install Debian's chromium (see .ci/run)", pytrace=False
        )
    pytest.skip("no Chromium binary found (set TRAINOPT_CHROMIUM)", allow_module_level=True)

playwright_api = require("playwright.sync_api", "test")

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


def _request_failed(request: object, problems: list[str]) -> None:
    """A failed request is a problem, unless the browser cancelled it (``net::ERR_ABORTED``).

    Chromium aborts a request still in flight when the test moves on to the next page (the
    favicon, most often); a missing file fails with an HTTP status, which the response hook
    records, or with another ``net::`` error.
    """
    if "ERR_ABORTED" not in str(request.failure):
        problems.append(f"request failed: {request.url} {request.failure}")


def _open(browser: object, url: str, **context_args: object) -> tuple[object, object, list[str]]:
    context = browser.new_context(permissions=["clipboard-read", "clipboard-write"], **context_args)
    page = context.new_page()
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: _request_failed(r, problems))
    page.on(
        "response",
        lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
    )
    page.goto(url, wait_until="networkidle")
    return context, page, problems


def test_every_page_loads_without_errors_or_broken_images(survey: dict[str, dict]) -> None:
    """Every page, as the survey at 1280 px loaded it: no console error, no script error, no failed
    request or HTTP error, every image decoded."""
    failures = []
    for name in PAGES:
        failures += [f"{name}: {p}" for p in survey[name]["problems"]]
        failures += [f"{name}: broken image: {src}" for src in survey[name]["broken_images"]]
    assert len(survey) == len(PAGES) > 100
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "landing, expected",
    [
        (
            "index.html",
            ["guides/training-optimization/index.html", "advanced/performance/index.html"],
        ),
        (
            "guides/training-optimization/index.html",
            [
                "guides/training-optimization/learning-rate-scheduling.html",
                "guides/training-optimization/training-stability.html",
                "guides/training-optimization/hyperparameter-optimization.html",
                "guides/training-optimization/use-with-your-trainer.html",
            ],
        ),
        (
            "advanced/performance/index.html",
            [
                f"advanced/performance/{n}.html"
                for n in (
                    "memory-optimization",
                    "distributed-training",
                    "profiling",
                    "monitoring",
                    "benchmarking",
                    "mixed-precision",
                    "compilation",
                )
            ],
        ),
    ],
)
def test_grid_cards_lead_to_their_pages(
    browser: object, server: str, landing: str, expected: list[str]
) -> None:
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


# ---------------------------------------------------------------------------------------------
# One pass over every page at 1280 px (layout, figures, sidebars, then every copy button) and one
# at 390 px (layout only). The tests below read these surveys, so each page loads twice in all.
# ---------------------------------------------------------------------------------------------

LAYOUT_JS = r"""
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  await document.fonts.ready;
  const article = document.querySelector('article.bd-article') || document.querySelector('main')
    || document.body;
  const px = (x) => Math.round(x * 10) / 10;
  const scrollsX = (el) => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  // The nearest element from `el` up to (not including) the article that scrolls sideways.
  const scroller = (el) => {
    for (let a = el; a && a !== article; a = a.parentElement) if (scrollsX(a)) return a;
    return null;
  };
  const where = (el) => {
    const section = el.closest('section[id]');
    return section ? '#' + section.id : '(top)';
  };
  const visible = (el) => {
    if (!el) return false;
    const r = el.getBoundingClientRect(), s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && s.display !== 'none' && s.visibility !== 'hidden';
  };
  const articleStyle = getComputedStyle(article);
  const articleContent = article.clientWidth - parseFloat(articleStyle.paddingLeft)
    - parseFloat(articleStyle.paddingRight);
  const out = {
    height: document.documentElement.scrollHeight,
    overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth,
    article: px(articleContent),
    math: [], code: [], tables: [], figures: [], sidebars: [],
  };
  article.querySelectorAll('div.math').forEach((m, i) => {
    const formula = m.querySelector('mjx-math') || m;
    out.math.push({index: i, where: where(m), width: px(formula.getBoundingClientRect().width),
                   column: px(m.clientWidth), scrolls: !!scroller(formula.parentElement),
                   text: m.textContent.trim().replace(/\s+/g, ' ').slice(0, 50)});
  });
  article.querySelectorAll('pre').forEach((p, i) => {
    const lines = p.innerText.split('\n');
    out.code.push({index: i, where: where(p), inDropdown: !!p.closest('details'),
                   scrollWidth: p.scrollWidth, clientWidth: p.clientWidth,
                   longest: Math.max(...lines.map(l => l.length)), first: lines[0].slice(0, 60)});
  });
  article.querySelectorAll('table').forEach((t, i) => {
    out.tables.push({index: i, where: where(t), width: px(t.getBoundingClientRect().width),
                     scrolls: !!scroller(t),
                     head: (t.querySelector('th, td')?.textContent || '').trim().slice(0, 40)});
  });
  article.querySelectorAll('figure').forEach((f, i) => {
    const img = f.querySelector('img');
    const link = img && img.closest('a');
    const caption = f.querySelector('figcaption');
    out.figures.push({index: i, where: where(f), caption: caption ? caption.innerText.trim() : null,
                      href: link ? link.href : null, src: img ? img.src : null,
                      displayed: img ? img.getBoundingClientRect().width : null,
                      natural: img ? img.naturalWidth : null});
  });
  for (const selector of ['.bd-sidebar-primary', '.bd-sidebar-secondary']) {
    const bar = document.querySelector(selector);
    if (visible(bar)) out.sidebars.push({selector,
      links: Array.from(bar.querySelectorAll('a[href]')).filter(visible).length});
  }
  return out;
}
"""

# Clicks every copy button of the page and keeps what each click copies: sphinx-copybutton hands the
# text to ClipboardJS, which selects it in a hidden textarea and fires the document's copy event.
COPY_ALL_JS = r"""
async () => {
  let copied = null;
  document.addEventListener('copy', e => {
    copied = e.target && e.target.value !== undefined
      ? e.target.value : document.getSelection().toString();
  }, true);
  const out = [];
  const cells = Array.from(document.querySelectorAll('div.highlight'));
  for (const [index, cell] of cells.entries()) {
    const button = cell.querySelector('button.copybtn');
    if (!button) continue;
    const wrapper = cell.closest('.literal-block-wrapper, div[class*=highlight-]');
    const dd = cell.closest('dd');
    const dt = dd && dd.previousElementSibling;
    copied = null;
    button.click();
    await new Promise(resolve => setTimeout(resolve, 0));
    // textContent, not innerText: a block inside a closed dropdown is not rendered, and innerText
    // of what isn't rendered is not its text.
    out.push({index, copied, shown: cell.querySelector('pre').textContent,
              classes: cell.parentElement.className + ' ' + (wrapper ? wrapper.className : '')
                       + (cell.closest('.trainopt-source, .trainopt-source-dropdown')
                          ? ' trainopt-source' : ''),
              inDropdown: !!cell.closest('details'),
              docstring: dt && dt.id ? dt.id : '(module docstring)'});
  }
  return out;
}
"""


def _survey(browser: object, server: str, width: int, height: int, copies: bool) -> dict[str, dict]:
    context = browser.new_context(
        viewport={"width": width, "height": height},
        permissions=["clipboard-read", "clipboard-write"],
    )
    page = context.new_page()
    # What goes wrong while a page loads: console errors, script errors, failed requests, HTTP
    # errors.
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: _request_failed(r, problems))
    page.on(
        "response",
        lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None,
    )
    found = {}
    for name in PAGES:
        problems.clear()
        page.goto(f"{server}/{name}", wait_until="load")
        # Copy buttons come once ClipboardJS has loaded; LAYOUT_JS waits for MathJax and fonts.
        page.wait_for_function(
            "!document.querySelector('div.highlight pre') "
            "|| document.querySelector('button.copybtn')"
        )
        found[name] = page.evaluate(LAYOUT_JS)
        found[name]["broken_images"] = page.evaluate(
            "Array.from(document.images)"
            ".filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)"
        )
        found[name]["problems"] = list(problems)
        if copies:
            # Dropdowns are measured closed; their copy buttons are clicked open, as a reader does.
            page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })")
            found[name]["copies"] = page.evaluate(COPY_ALL_JS)
            # Figures as a reader sees them: one in a dropdown is measured opened.
            found[name]["figures"] = page.evaluate(LAYOUT_JS)["figures"]
    context.close()
    # Every measurement, for whoever reads a failure (copies left out: they are the pages' code).
    layout = {
        name: {k: v for k, v in page.items() if k != "copies"} for name, page in found.items()
    }
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"layout-{width}px.json").write_text(json.dumps(layout, indent=1) + "\n")
    return found


@pytest.fixture(scope="module")
def survey(browser: object, server: str) -> dict[str, dict]:
    """Every page at 1280 px: layout with dropdowns closed, figures, sidebars, every copy button."""
    return _survey(browser, server, 1280, 900, copies=True)


@pytest.fixture(scope="module")
def survey_phone(browser: object, server: str) -> dict[str, dict]:
    """Every page at 390 px: layout only."""
    return _survey(browser, server, 390, 844, copies=False)


def _expected_copy(text: str) -> str:
    """What a reader must get: prompt lines without prompts if the block has prompts, else all."""
    lines = text.rstrip("\n").split("\n")
    if any(PROMPT.match(line) for line in lines):
        # Prompt lines lose their prompt, output lines go, empty lines stay (copybutton's
        # copy_empty_lines default).
        kept, continued = [], False
        for line in lines:
            if PROMPT.match(line) or not line.strip() or continued:
                kept.append(PROMPT.sub("", line))
            # copybutton_line_continuation_character: a line ending in a backslash goes on
            continued = line.endswith("\\") and (continued or bool(PROMPT.match(line)))
        return "\n".join(kept)
    return "\n".join(lines)


def _is_implementation(copy: dict) -> bool:
    return "trainopt-source" in copy["classes"]


def _usage_blocks(name: str, copies: list[dict]) -> tuple[list[dict], str | None]:
    """A page's usage blocks as copied, each with its index among them and its line on the page.

    Returns ``(blocks, problem)``: ``problem`` says why the copy buttons don't match the page's
    ```` ```python ```` blocks one to one.
    """
    python = [c for c in copies if "highlight-python" in c["classes"] and not _is_implementation(c)]
    fenced = [
        b for b in blocks(DOCS / name.replace(".html", ".md")) if b.info.split()[:1] == ["python"]
    ]
    if len(python) != len(fenced):
        return [], f"{name}: {len(python)} python copy buttons for {len(fenced)} ```python blocks"
    return [
        {"index": n, "line": block.line, "code": copy["copied"]}
        for n, (copy, block) in enumerate(zip(python, fenced), start=1)
    ], None


# The runner reads JSON on stdin and keeps its own names out of the reader's namespace: a block that
# forgets an import fails as it would for a reader.
# Each script alone, in a fresh namespace and a fresh empty directory; every failure is reported.
RUN_EACH_ALONE = r"""
def _run():
    import json, os, sys, tempfile, traceback
    scripts = json.load(sys.stdin)
    del globals()["_run"]
    base = os.getcwd()
    failed = 0
    for label, code in scripts:
        os.chdir(tempfile.mkdtemp(dir=base))
        try:
            exec(compile(code, f"<{label}>", "exec"), {"__name__": "__main__"})
        except BaseException:
            failed += 1
            print(f"FAILED: {label}\n{traceback.format_exc()[-1500:]}\n=====", file=sys.stderr)
        if "matplotlib.pyplot" in sys.modules:
            sys.modules["matplotlib.pyplot"].close("all")
    sys.exit(1 if failed else 0)
_run()
"""


def _fresh_python(
    runner: str, payload: object, timeout: int = 900
) -> subprocess.CompletedProcess[str]:
    """Run ``runner`` in a fresh interpreter started in an empty directory: the package comes from
    ``src/`` (PYTHONPATH, so a worktree tests its own copy), never from the repository root."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRAINOPT_REQUIRE_CUDA")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["MPLBACKEND"] = "Agg"
    # Run as text pasted into an interpreter: __main__ has no file, as in the REPL, so examples
    # that start worker processes (spawn) behave as they do for a reader at the prompt.
    with tempfile.TemporaryDirectory(prefix="trainopt-reader-") as empty:
        return subprocess.run(
            [sys.executable, "-c", runner],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            cwd=empty,
            env=env,
            timeout=timeout,
        )


def _record(artifact: str, key: str, value: object) -> None:
    """Merge ``{key: value}`` into ``test-artifacts/<artifact>`` (under a lock: see
    artifacts.py)."""
    record(artifact, key, value, ARTIFACTS)


def _reader_pages() -> list[str]:
    return [name for name in PAGES if not name.startswith("reference/")]


def test_copy_buttons_copy_exactly_the_code(
    survey: dict[str, dict], browser: object, server: str
) -> None:
    checked = 0
    failures = []
    # The survey reads each copy from the page's copy event; check that against the real clipboard
    # on the first block of the LR page.
    lr = "guides/training-optimization/learning-rate-scheduling.html"
    context, page, _ = _open(browser, f"{server}/{lr}")
    cell = page.locator("div.highlight").nth(survey[lr]["copies"][0]["index"])
    cell.hover()
    cell.locator("button.copybtn").click()
    clipboard = page.evaluate("navigator.clipboard.readText()")
    context.close()
    assert clipboard == survey[lr]["copies"][0]["copied"], (
        clipboard[:200],
        survey[lr]["copies"][0]["copied"][:200],
    )
    for name, found in survey.items():
        for copy in found["copies"]:
            checked += 1
            expected = _expected_copy(copy["shown"])
            # A block may end with a blank line (it ends an indented block in a REPL): compare
            # the code, not the number of newlines after it.
            if (copy["copied"] or "").rstrip("\n") != expected.rstrip("\n"):
                failures.append(
                    f"{name} block {copy['index']}: copied {copy['copied'][:200]!r}, "
                    f"expected {expected[:200]!r}"
                )
            if any(PROMPT.match(line) for line in copy["copied"].split("\n")):
                failures.append(
                    f"{name} block {copy['index']}: a prompt reached the clipboard: "
                    f"{copy['copied'][:120]!r}"
                )
    assert checked > 0
    assert not failures, "\n".join(failures)


def test_copied_usage_blocks_are_the_code_the_notebook_runs(survey: dict[str, dict]) -> None:
    """What a usage block's copy button copies is the block's code on the page, which is what the
    page's notebook runs, in page order, in a fresh kernel in an empty directory
    (``tests/docs/test_notebooks.py``): that run is the proof that the copied blocks run in order
    from an empty directory. A doctest block copies its statements; the notebook runs those and
    checks each shown value."""
    failures = []
    compared = 0
    for name in _reader_pages():
        usage, problem = _usage_blocks(name, survey[name]["copies"])
        if problem:
            failures.append(problem)
        fenced = {
            b.line: b
            for b in blocks(DOCS / name.replace(".html", ".md"))
            if b.info.split()[:1] == ["python"]
        }
        for block in usage:
            body = fenced[block["line"]].body
            expected = _expected_copy(body)
            compared += 1
            if block["code"].rstrip("\n") != expected.rstrip("\n"):
                failures.append(
                    f"{name}, line {block['line']}: copied {block['code'][:160]!r}, "
                    f"the page's code {expected[:160]!r}"
                )
    print(f"usage blocks whose copy is the notebook's code: {compared}")
    assert compared > 100
    assert not failures, "\n".join(failures)


def test_copied_implementations_run_alone_from_an_empty_directory(survey: dict[str, dict]) -> None:
    """Each implementation (folded or not), as copied, alone in a fresh namespace, in a fresh
    interpreter started in an empty directory."""
    implementations = [
        (f"{name}, implementation block {c['index']}", c["copied"])
        for name in _reader_pages()
        for c in survey[name]["copies"]
        if _is_implementation(c)
    ]
    result = _fresh_python(RUN_EACH_ALONE, implementations)
    failures = (
        [
            "the implementations, each alone, failed in a fresh interpreter in an empty "
            "directory:\n"
            f"{result.stderr[-3000:]}"
        ]
        if result.returncode != 0
        else []
    )
    _record("copied-blocks-failures.json", "empty_directory", failures)
    _record(
        "copied-blocks.json",
        "empty_directory",
        {"implementation_blocks": len(implementations), "failed_scripts": len(failures)},
    )
    print(f"implementations run alone: {len(implementations)}")
    assert len(implementations) > 10
    assert not failures, "\n\n".join(failures)


class _PasteReader(code.InteractiveConsole):
    """``python``'s prompt reading pasted lines: what it compiles it would run (the notebook test
    runs that code); a SyntaxError, or a block the prompt reads differently, is recorded."""

    error: str | None = None

    def runcode(self, compiled: object) -> None:  # read, don't run
        return None

    def showsyntaxerror(self, filename: str | None = None, **kwargs: object) -> None:
        self.error = traceback.format_exc(limit=0)


def test_copied_usage_blocks_paste_into_a_plain_repl(survey: dict[str, dict]) -> None:
    """Each page's usage blocks, as copied, fed line by line to ``code.InteractiveConsole`` (the
    reader pastes a block, then presses Enter): every line is accepted, and every statement the
    prompt compiles is one of the block's (an indented line after a loop without a blank line
    would be read as part of the loop, or refused). That the code runs, in page order from an
    empty directory, is the notebook test's (see the test above)."""
    failures = []
    counts = {}
    for name in _reader_pages():
        usage, problem = _usage_blocks(name, survey[name]["copies"])
        if problem:
            failures.append(problem)
        counts[name] = len(usage)
        for block in usage:
            console = _PasteReader()
            lines = block["code"].split("\n")
            for number, line in enumerate(lines + [""], start=1):
                console.push(line)
                if console.error:
                    shown = line if number <= len(lines) else "(Enter after the block)"
                    failures.append(
                        f"{name}, block {block['index']} (line {block['line']} of the page), line "
                        f"{number} of the block: {shown!r}\n{console.error}"
                    )
                    break
            if console.buffer:
                failures.append(
                    f"{name}, block {block['index']} (line {block['line']} of the page): "
                    "the prompt "
                    f"still waits for more after the block and an Enter"
                )
    _record("copied-blocks-failures.json", "repl", failures)
    _record(
        "copied-blocks.json",
        "repl",
        {
            "usage_blocks_per_page": counts,
            "usage_blocks": sum(counts.values()),
            "failed_blocks": len(failures),
        },
    )
    print(f"usage blocks pasted into a REPL: {sum(counts.values())} on {len(counts)} pages")
    assert sum(counts.values()) > 100
    assert not failures, "\n\n".join(failures)


def _docstring_of(dotted: str) -> str | None:
    """The docstring of ``package.module.Class.method``: the longest importable prefix, then
    attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part, None)
        return inspect.getdoc(obj) if obj is not None else None
    return None


def test_api_reference_examples_are_the_docstrings_that_run_alone(survey: dict[str, dict]) -> None:
    """Each example on the API reference, as shown (and so as copied: see the copy-button test),
    is in the docstring of the object it documents; the docstrings' Sybil runs every docstring's
    examples together in an empty namespace and an empty directory of their own (conftest.py),
    which is where a reader who copies them alone runs them."""
    failures = []
    checked = 0
    for name in PAGES:
        if not name.startswith("reference/"):
            continue
        for copy in survey[name]["copies"]:
            if "doctest" not in copy["classes"]:
                continue
            checked += 1
            doc = _docstring_of(copy["docstring"])
            shown = " ".join(copy["shown"].split())
            # the page drops doctest flags (Sphinx's trim_doctest_flags), as the reader sees them
            doc = re.sub(r"\s*#\s*doctest:[^\n]*", "", doc or "")
            if not doc or shown not in " ".join(doc.replace("<BLANKLINE>", "").split()):
                failures.append(
                    f"{name}: {copy['docstring']}: the example {copy['shown'][:120]!r} is not "
                    "in its docstring"
                )
    _record(
        "copied-blocks.json",
        "api_reference",
        {"example_blocks": checked, "not_in_docstring": len(failures)},
    )
    print(f"API reference: {checked} example blocks, each in the docstring Sybil runs alone")
    assert checked > 50
    assert not failures, "\n".join(failures)


def test_pages_fit_the_height_budget(survey: dict[str, dict]) -> None:
    heights = {name: found["height"] for name, found in survey.items()}
    _record("page-heights.json", "1280px_dropdowns_closed", heights)
    over = [
        f"{name}: {height} px tall at 1280 px (budget {HEIGHT_BUDGET_PX} px)"
        for name, height in heights.items()
        if name.startswith(BUDGETED) and height > HEIGHT_BUDGET_PX
    ]
    assert not over, "\n".join(over)


@pytest.mark.parametrize("width", [1280, 390])
def test_nothing_is_clipped(request: pytest.FixtureRequest, width: int) -> None:
    found = request.getfixturevalue("survey" if width == 1280 else "survey_phone")
    failures = []
    for name, page in found.items():
        if page["overflow"] > 1:
            failures.append(
                f"{name}: the page scrolls sideways by {page['overflow']} px at {width} px"
            )
        for m in page["math"]:
            if m["width"] > m["column"] + 1 and not m["scrolls"]:
                failures.append(
                    f"{name} {m['where']}: display formula {m['index']} ({m['text']!r}) "
                    f"is {m['width']} px wide in a {m['column']} px column, with no scroll box"
                )
        for t in page["tables"]:
            if t["width"] > page["article"] + 1 and not t["scrolls"]:
                failures.append(
                    f"{name} {t['where']}: table {t['index']} ({t['head']!r}) is {t['width']} px "
                    f"wide in a {page['article']} px article, with no scroll box of its own"
                )
        if width == 1280:
            for c in page["code"]:
                if not c["inDropdown"] and c["scrollWidth"] > c["clientWidth"] + 1:
                    failures.append(
                        f"{name} {c['where']}: code block {c['index']} ({c['first']!r}) scrolls "
                        f"sideways: {c['scrollWidth']} px of code in {c['clientWidth']} px, "
                        f"longest line {c['longest']} characters"
                    )
    assert not failures, f"{len(failures)} clipped at {width} px:\n" + "\n".join(failures)


def test_figures_have_captions_open_full_size_and_readable_text(
    survey: dict[str, dict], server: str, built_site: Path
) -> None:
    from PIL import Image

    failures = []
    checked = 0
    for name, page in survey.items():
        for f in page["figures"]:
            checked += 1
            label = f"{name} {f['where']} figure {f['index']}"
            if not f["caption"]:
                failures.append(f"{label}: no caption")
            if not f["src"]:
                failures.append(f"{label}: no image")
                continue
            if not f["href"] or not urllib.parse.urlsplit(f["href"]).path.endswith(".png"):
                failures.append(f"{label}: the image is not a link to its PNG (link: {f['href']})")
            else:
                with urllib.request.urlopen(f["href"]) as response:
                    body = response.read(8)
                    kind = response.headers.get("Content-Type")
                if kind != "image/png" or body != b"\x89PNG\r\n\x1a\n":
                    failures.append(f"{label}: {f['href']} gives {kind}, not a PNG")
            png = built_site / urllib.parse.unquote(urllib.parse.urlsplit(f["src"]).path).lstrip(
                "/"
            )
            smallest = Image.open(png).text.get(MIN_TEXT_KEY)
            if smallest is None:
                failures.append(f"{label}: {png.name} has no {MIN_TEXT_KEY} text chunk")
                continue
            shown = float(smallest) * f["displayed"] / f["natural"]
            if shown < MIN_TEXT_PX:
                failures.append(
                    f"{label}: {png.name}'s smallest text is {float(smallest):.1f} px at "
                    f"{f['natural']} px wide, shown {f['displayed']:.0f} px wide: "
                    f"{shown:.1f} px < {MIN_TEXT_PX} px"
                )
    assert checked > 0
    assert not failures, "\n".join(failures)


def test_no_visible_sidebar_is_empty(survey: dict[str, dict]) -> None:
    empty = [
        f"{name}: {bar['selector']} is shown at 1280 px with no link"
        for name, page in survey.items()
        for bar in page["sidebars"]
        if bar["links"] == 0
    ]
    assert not empty, "\n".join(empty)


BROKEN_WORDS_JS = r"""
() => {
  const broken = [];
  document.querySelectorAll('.sd-card').forEach((card, index) => {
    const walker = document.createTreeWalker(card, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const match of node.textContent.matchAll(/\S+/g)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const lines = new Set(Array.from(range.getClientRects()).filter(r => r.width > 0)
                                   .map(r => Math.round(r.top)));
        if (lines.size > 1) broken.push([index, match[0], lines.size]);
      }
    }
  });
  return broken;
}
"""


@pytest.mark.parametrize(
    "landing, columns",
    [
        ("guides/training-optimization/index.html", 2),
        ("advanced/performance/index.html", None),
        ("index.html", None),
    ],
)
def test_grid_columns_and_no_word_broken_in_a_card(
    browser: object, server: str, landing: str, columns: int | None
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{server}/{landing}", wait_until="networkidle")
    lefts = page.eval_on_selector_all(
        ".sd-card", "els => els.map(e => Math.round(e.getBoundingClientRect().left))"
    )
    broken = page.evaluate(BROKEN_WORDS_JS)
    context.close()
    failures = []
    if columns is not None and len(set(lefts)) != columns:
        failures.append(
            f"{landing}: {len(set(lefts))} columns at 1280 px (card left edges {lefts}), "
            f"expected {columns}"
        )
    failures += [
        f"{landing}: card {card} breaks {word!r} over {lines} lines at 1280 px"
        for card, word, lines in broken
    ]
    assert not failures, "\n".join(failures)


def test_screenshots_of_the_grids_and_the_lr_page(browser: object, server: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    shots = {
        "grid-training-optimization-1280px.png": ("guides/training-optimization/index.html", True),
        "grid-advanced-performance-1280px.png": ("advanced/performance/index.html", True),
        "learning-rate-scheduling-first-screen-1280px.png": (
            "guides/training-optimization/learning-rate-scheduling.html",
            False,
        ),
    }
    for file, (name, full) in shots.items():
        page.goto(f"{server}/{name}", wait_until="networkidle")
        page.evaluate(
            "async () => { if (window.MathJax?.startup?.promise) await MathJax.startup.promise; }"
        )
        page.screenshot(path=str(SCREENSHOTS / file), full_page=full)
        assert (SCREENSHOTS / file).stat().st_size > 0
    context.close()


@pytest.mark.parametrize(
    "query, page_name",
    [
        ("cosine", "guides/training-optimization/learning-rate-scheduling.html"),
        ("loss scaling", "guides/training-optimization/training-stability.html"),
    ],
)
def test_search_finds_the_right_page(
    browser: object, server: str, query: str, page_name: str
) -> None:
    context, page, problems = _open(browser, f"{server}/search.html?q={query.replace(' ', '+')}")
    # Sphinx adds results one by one, then writes its summary: wait for the summary.
    page.wait_for_function(
        "document.querySelector('#search-results p.search-summary')?.textContent.trim().length > 0",
        timeout=30_000,
    )
    hrefs = page.eval_on_selector_all(
        "#search-results ul.search li a", "els => els.map(e => e.href)"
    )
    assert any(page_name in href for href in hrefs[:10]), "\n".join(hrefs[:10])
    assert not problems, problems
    context.close()


@pytest.mark.parametrize("theme", ["light", "dark"])
@pytest.mark.parametrize("width, height", [(1280, 900), (390, 844)])
def test_landing_pages_render_without_overflow(
    browser: object, server: str, theme: str, width: int, height: int
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for landing in (
        "index.html",
        "guides/training-optimization/index.html",
        "advanced/performance/index.html",
    ):
        context = browser.new_context(viewport={"width": width, "height": height})
        context.add_init_script(
            f"localStorage.setItem('theme', '{theme}'); localStorage.setItem('mode', '{theme}');"
        )
        page = context.new_page()
        page.goto(f"{server}/{landing}", wait_until="networkidle")
        assert page.evaluate("document.documentElement.dataset.theme") == theme
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{landing} overflows by {overflow}px at {width}px ({theme})"
        cards = page.eval_on_selector_all(
            ".sd-card",
            "els => els.map(e => { const r = e.getBoundingClientRect(); "
            "return [r.left, r.right]; })",
        )
        assert cards and all(left >= 0 and right <= width + 1 for left, right in cards), cards
        name = landing.replace("/", "_").replace(".html", "")
        page.screenshot(path=str(SCREENSHOTS / f"{name}-{theme}-{width}px.png"), full_page=True)
        context.close()
