"""The built site as a reader reads it (issues 12 and 15), checked on the HTML and the sources.

- implementations are folded: a closed dropdown titled with the object's path, no docstrings;
- every figure has a caption, opens full size, and its text is at least 9 px where it is shown;
- no empty "Section Navigation" sidebar; the grids have the seeds' columns;
- the visible text has no raw roles, no ``\\_``, no en-dash where ``--`` belongs, and its prose
  never says "seed"; docstring literal blocks of YAML or shell declare their language;
- every guide, advanced and concepts page ends with footnoted references, each one cited;
- a second ``sphinx-build`` with nothing changed reads no page and sees no changed setting.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from audit import blocks, source_includes
from PIL import Image
from trainopt_docs import MIN_TEXT_KEY, source_with_imports

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "trainopt"
PAGES = sorted(
    p for p in DOCS.rglob("*.md") if not any(s.startswith("_") for s in p.relative_to(DOCS).parts)
)
ARTICLES = [
    p
    for p in PAGES
    if p.relative_to(DOCS).parts[0] in ("guides", "advanced", "concepts") and p.name != "index.md"
]
COLUMN_PX = 800  # the widest a figure is shown at
MIN_TEXT_PX = 9


def _html_path(site: Path, page: Path) -> Path:
    return site / page.relative_to(DOCS).with_suffix(".html")


def _article(html: str) -> str:
    start = html.find('<article class="bd-article"')
    end = html.find("</article>", start)
    return html[start:end] if start >= 0 else html


# --------------------------------------------------------------------------------------------
# Implementations folded
# --------------------------------------------------------------------------------------------


def test_included_source_has_no_docstrings_but_keeps_its_imports() -> None:
    for where, name in source_includes(DOCS):
        code = source_with_imports(name)
        tree = ast.parse(code)
        documented = [
            node.name
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and ast.get_docstring(node) is not None
        ]
        assert not documented, f"{where}: {name} shows the docstrings of {documented}"


def test_implementations_are_closed_dropdowns_titled_with_their_path(built_site: Path) -> None:
    for page in PAGES:
        names = [b.info.split()[1] for b in blocks(page) if b.info.startswith("{trainopt-source}")]
        if not names:
            continue
        html = _article(_html_path(built_site, page).read_text())
        dropdowns = re.findall(
            r"<details([^>]*trainopt-source-dropdown[^>]*)>\s*<summary.*?</summary>", html, re.S
        )
        titles = [
            re.sub(r"<[^>]+>", "", m.group(0)).strip()
            for m in re.finditer(
                r"<details[^>]*trainopt-source-dropdown[^>]*>\s*<summary.*?</summary>", html, re.S
            )
        ]
        where = page.relative_to(DOCS)
        assert titles == names, f"{where}: dropdown titles {titles} != included objects {names}"
        assert not [d for d in dropdowns if re.search(r"\bopen\b", d)], (
            f"{where}: a dropdown is open"
        )
        assert html.count('class="trainopt-source highlight-python') == len(names), where


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------


def _figures(html: str) -> list[str]:
    return re.findall(r'<figure class="[^"]*trainopt-figure[^"]*".*?</figure>', html, re.S)


def test_every_figure_has_a_caption_and_opens_full_size(built_site: Path) -> None:
    count = 0
    for page in PAGES:
        path = _html_path(built_site, page)
        for figure in _figures(path.read_text()):
            count += 1
            where = f"{page.relative_to(DOCS)}"
            caption = re.search(r"<figcaption>(.*?)</figcaption>", figure, re.S)
            assert caption and re.sub(r"<[^>]+>", "", caption.group(1)).strip(), (
                f"{where}: no caption"
            )
            link = re.search(r'<a [^>]*href="([^"]+\.png)"[^>]*>\s*<img [^>]*src="([^"]+)"', figure)
            assert link, f"{where}: figure image is not a link"
            assert link.group(1) == link.group(2), (
                f"{where}: the link opens {link.group(1)}, not the image"
            )
            assert (path.parent / link.group(1)).is_file(), f"{where}: {link.group(1)} missing"
    assert count > 0


def test_figure_text_is_at_least_9px_where_it_is_shown(built_site: Path) -> None:
    too_small, count = [], 0
    for page in PAGES:
        path = _html_path(built_site, page)
        for figure in _figures(path.read_text()):
            img = re.search(r'<img [^>]*src="([^"]+)"[^>]*>', figure)
            width = re.search(r'style="width:\s*(\d+)px', img.group(0))
            png = Image.open(path.parent / img.group(1))
            count += 1
            recorded = png.info.get(MIN_TEXT_KEY)
            assert recorded, f"{page.relative_to(DOCS)}: {img.group(1)} has no {MIN_TEXT_KEY}"
            natural = png.size[0]
            shown = min(natural, COLUMN_PX, int(width.group(1)) if width else natural)
            at_display = float(recorded) * shown / natural
            if at_display < MIN_TEXT_PX:
                too_small.append(
                    f"{page.relative_to(DOCS)}: {Path(img.group(1)).name} {natural} px wide, "
                    f"smallest text {recorded} px, {at_display:.1f} px as shown"
                )
    assert count > 0
    assert not too_small, "figure text under 9 px:\n" + "\n".join(too_small)


def test_a_figure_without_a_caption_fails_the_build_naming_its_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(DOCS / '_ext')!r})\n"
        "extensions = ['myst_parser', 'sphinx_design', 'trainopt_docs']\n"
        "source_suffix = {'.md': 'markdown'}\n"
    )
    (src / "index.md").write_text(
        "# Title\n\n```{trainopt-figure} trainopt.schedules.plots.plot_wsd_decays\n"
        ":alt: Three curves.\n```\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert "index.md" in result.stderr and "needs a :caption: text" in result.stderr, result.stderr


# --------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------


def test_no_page_has_an_empty_section_navigation(built_site: Path) -> None:
    empty = []
    for path in sorted(built_site.rglob("*.html")):
        for nav in re.findall(r'<nav class="bd-docs-nav.*?</nav>', path.read_text(), re.S):
            if "<a " not in nav:
                empty.append(str(path.relative_to(built_site)))
    assert not empty, f"empty Section Navigation sidebar on: {empty}"


@pytest.mark.parametrize(
    "page, columns",
    [
        (
            "guides/training-optimization/index.md",
            "sd-row-cols-xs-1 sd-row-cols-sm-2 sd-row-cols-md-2 sd-row-cols-lg-2",
        ),
        (
            "advanced/performance/index.md",
            "sd-row-cols-xs-1 sd-row-cols-sm-1 sd-row-cols-md-1 sd-row-cols-lg-2",
        ),
    ],
)
def test_landing_grids_have_the_seeds_columns(built_site: Path, page: str, columns: str) -> None:
    html = _html_path(built_site, DOCS / page).read_text()
    assert columns in html, page


# --------------------------------------------------------------------------------------------
# Text for readers
# --------------------------------------------------------------------------------------------


class _Prose(HTMLParser):
    """Visible text of a page, without scripts, styles and code (``code``, ``pre``, literals)."""

    SKIP = {"script", "style", "code", "pre", "kbd", "samp", "tt", "math", "mjx-container"}
    VOID = {
        "br",
        "img",
        "hr",
        "meta",
        "link",
        "input",
        "wbr",
        "source",
        "col",
        "area",
        "base",
        "embed",
    }

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[bool] = []
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        classes = dict(attrs).get("class") or ""
        hidden = (
            tag in self.SKIP
            or "highlight" in classes.split()
            or "math" in classes.split()
            or (self.stack and self.stack[-1])
        )
        self.stack.append(bool(hidden))

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        if not (self.stack and self.stack[-1]):
            self.parts.append(data)


def prose(html: str) -> str:
    parser = _Prose()
    parser.feed(html)
    return re.sub(r"\s+", " ", " ".join(parser.parts))


RAW_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|const|ref|doc|math|term):`?"
)
SEED = re.compile(r"\bseed(?:s|ed|-style)?\b", re.IGNORECASE)
DASHED_FLAG = re.compile(r"(?:^|[\s(\[])[\u2013\u2014]{1,2}[a-z][\w-]*")


def _prose_problems(page_html: str) -> list[str]:
    text = prose(_article(page_html))
    found = [f"raw role {m.group(0)!r}" for m in RAW_ROLE.finditer(text)]
    found += ["escaped underscore '\\_'"] * ("\\_" in text)
    found += [f"dash before a flag {m.group(0).strip()!r}" for m in DASHED_FLAG.finditer(text)]
    return found


def test_prose_checks_catch_what_they_look_for() -> None:
    html = (
        '<article class="bd-article"><p>Use :class:`Foo` with \\_x and \u2013n-trials, '
        "then a seed-style stack.</p><pre>seed = 0 :func:</pre><code>--n-trials</code></article>"
    )
    assert len(_prose_problems(html)) == 3
    assert len(SEED.findall(prose(html))) == 1


def test_visible_text_has_no_raw_roles_escapes_or_dashed_flags(built_site: Path) -> None:
    problems = []
    for path in sorted(built_site.rglob("*.html")):
        if path.name in ("genindex.html", "search.html", "py-modindex.html"):
            continue
        problems += [
            f"{path.relative_to(built_site)}: {p}" for p in _prose_problems(path.read_text())
        ]
    assert not problems, "\n".join(problems)


SEED_DOCUMENTS = re.compile(
    r"\bseed(?:-style|\u2019s|'s| code| documents?| pages?| snippets?)\b", re.IGNORECASE
)


def test_page_prose_never_says_seed(built_site: Path) -> None:
    """Readers don't know the project's seed documents; the word stays out of the prose.

    Code is excluded (a ``seed=0`` argument is fine). In the API reference, where ``seed`` names
    the parameters of random generators, only the seed documents are looked for ("seed-style",
    "the seed's", "seed code"); parameter lists and signatures are left out.
    """
    problems = []
    for page in PAGES:
        html = _article(_html_path(built_site, page).read_text())
        pattern = SEED
        if page.relative_to(DOCS).parts[0] == "reference":
            html = re.sub(r'<dt class="sig.*?</dt>', "", html, flags=re.S)
            pattern = SEED_DOCUMENTS
        text = prose(html)
        problems += [
            f"{page.relative_to(DOCS)}: ...{text[max(0, m.start() - 50) : m.end() + 30]}..."
            for m in pattern.finditer(text)
        ]
    assert not problems, "\n".join(problems)


LITERAL_START = re.compile(r"(?:::\s*$|^\s*\.\.\s+code-block::\s*(?P<lang>\S*)\s*$)")
SHELL = re.compile(r"^\s*(\$ |python -m |torchrun |pip install |make |export \w+=)")
YAML = re.compile(r"^\s*[\w-]+:(\s+\S.*)?$")


def docstring_literal_problems(path: Path) -> list[str]:
    """Literal blocks in the docstrings of one file that hold YAML or shell without saying so."""
    problems = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        doc = ast.get_docstring(node, clean=True)
        if not doc:
            continue
        lines = doc.splitlines()
        for i, line in enumerate(lines):
            start = LITERAL_START.search(line)
            if not start or line.strip().startswith(">>>"):
                continue
            language = start.group("lang")
            if language and language not in ("", "text"):
                continue  # declared (``yaml``, ``console``, ``python``...)
            indent = len(line) - len(line.lstrip())
            body = []
            for following in lines[i + 1 :]:
                if following.strip() and len(following) - len(following.lstrip()) <= indent:
                    break
                body.append(following)
            content = [b for b in body if b.strip()]
            if not content or any(b.strip().startswith(">>>") for b in content):
                continue
            kind = (
                "shell"
                if any(SHELL.match(b) for b in content)
                else "YAML"
                if all(YAML.match(b) or b.strip().startswith(("- ", "#")) for b in content)
                else None
            )
            if kind:
                name = getattr(node, "name", "module")
                wanted = "console" if kind == "shell" else "yaml"
                shown = (
                    path.relative_to(SRC.parent) if path.is_relative_to(SRC.parent) else path.name
                )
                problems.append(
                    f"{shown}: {name}: a literal block of {kind} needs '.. code-block:: {wanted}'"
                )
    return problems


def test_docstring_literal_blocks_of_yaml_or_shell_declare_their_language() -> None:
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        problems += docstring_literal_problems(path)
    assert not problems, "\n".join(problems)


def test_docstring_literal_check_finds_undeclared_yaml_and_shell(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    module.write_text(
        'def f():\n    """Load a config.\n\n    Example config::\n\n'
        "        type: cosine\n        total_steps: 10\n\n"
        "    Run it::\n\n        $ python -m trainopt.hpo config.yaml\n\n"
        '    .. code-block:: yaml\n\n        type: cosine\n    """\n'
    )
    problems = docstring_literal_problems(module)
    assert len(problems) == 2 and "YAML" in problems[0] and "shell" in problems[1], problems


# --------------------------------------------------------------------------------------------
# References (issue 15)
# --------------------------------------------------------------------------------------------


FOOTNOTE_DEF = re.compile(r"^\[\^([^\]]+)\]:", re.M)
FOOTNOTE_REF = re.compile(r"\[\^([^\]]+)\]")


def _without_code(text: str) -> str:
    """A page's Markdown without its fenced blocks and inline code."""
    text = re.sub(r"^(`{3,}|~{3,}).*?^\1\s*$", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def reference_problems(page: Path) -> list[str]:
    text = _without_code(page.read_text())
    where = str(page.relative_to(DOCS)) if page.is_relative_to(DOCS) else page.name
    headings = list(re.finditer(r"^## (.+)$", text, re.M))
    if not headings or headings[-1].group(1).strip() != "References":
        return [f"{where}: the last section is not '## References'"]
    body, references = text[: headings[-1].start()], text[headings[-1].end() :]
    problems = []
    leftover = re.sub(
        r"^\[\^[^\]]+\]:.*(\n(?:[ \t]+\S.*|[ \t]*)$)*", "", references, flags=re.M
    ).strip()
    if leftover:
        problems.append(
            f"{where}: the References section holds more than footnotes: {leftover[:80]!r}"
        )
    defined = FOOTNOTE_DEF.findall(text)
    if not defined:
        problems.append(f"{where}: the References section has no footnote")
    outside = set(FOOTNOTE_DEF.findall(body))
    if outside:
        problems.append(f"{where}: footnotes defined outside References: {sorted(outside)}")
    cited = set(FOOTNOTE_REF.findall(FOOTNOTE_DEF.sub("", text)))
    problems += [
        f"{where}: footnote [^{key}] is never cited" for key in defined if key not in cited
    ]
    problems += [
        f"{where}: [^{key}] is cited but not defined" for key in sorted(cited - set(defined))
    ]
    return problems


def test_every_article_ends_with_cited_footnote_references() -> None:
    problems = []
    for page in ARTICLES:
        problems += reference_problems(page)
    assert not problems, "\n".join(problems)


def test_reference_check_finds_uncited_and_undefined_footnotes(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# T\n\nA claim[^a] and another[^b].\n\n`[^c]` in code.\n\n## References\n\n"
        "[^a]: Someone 2020.\n[^c]: Nobody cites this.\n"
    )
    assert reference_problems(page) == [
        "page.md: footnote [^c] is never cited",
        "page.md: [^b] is cited but not defined",
    ]
    page.write_text("# T\n\nA claim[^a].\n\n## References\n\n[^a]: Someone 2020.\n\n## After\n")
    assert reference_problems(page) == ["page.md: the last section is not '## References'"]


def test_footnotes_render_as_a_footnote_list(built_site: Path) -> None:
    for page in ARTICLES:
        defined = FOOTNOTE_DEF.findall(_without_code(page.read_text()))
        if not defined:
            continue
        html = _html_path(built_site, page).read_text()
        assert '<aside class="footnote-list' in html, page.relative_to(DOCS)
        assert len(re.findall(r'<aside class="footnote brackets"', html)) == len(set(defined)), page


# --------------------------------------------------------------------------------------------
# A no-op rebuild
# --------------------------------------------------------------------------------------------


def test_a_second_build_with_nothing_changed_reads_no_page(
    built_site: Path, tmp_path: Path
) -> None:
    """Build into a copy of the session's build (its environment included): nothing is re-read."""
    out = tmp_path / "html"
    shutil.copytree(built_site, out, symlinks=True)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-b",
            "html",
            "-W",
            "--keep-going",
            "-c",
            str(ROOT),
            str(DOCS),
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert "configuration has changed" not in log.lower(), log[:3000]
    assert "0 added, 0 changed, 0 removed" in log, log[:3000]
    assert "reading sources... [" not in log, log[:3000]
