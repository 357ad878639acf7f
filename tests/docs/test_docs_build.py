"""The built site: -W build, rendered grids and maths, meta descriptions, badges, links, copy
button."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from internal_links import broken_links
from trainopt_docs import read_front_matter

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(
    p for p in DOCS.rglob("*.md") if not any(s.startswith("_") for s in p.relative_to(DOCS).parts)
)


def _html(site: Path, page: Path) -> str:
    return (site / page.relative_to(DOCS).with_suffix(".html")).read_text()


def test_every_page_has_description_and_it_becomes_the_meta_description(built_site: Path) -> None:
    for page in PAGES:
        meta, _ = read_front_matter(page)
        assert meta.get("description"), f"{page.relative_to(DOCS)} has no description"
        html = _html(built_site, page)
        content = re.search(r'<meta name="description" content="([^"]*)"', html)
        assert content, f"{page.relative_to(DOCS)}: no meta description in HTML"
        assert content.group(1).replace("&amp;", "&").replace("&quot;", '"') == meta["description"]


def test_landing_grids_render_as_cards_linking_to_their_pages(built_site: Path) -> None:
    expected = {
        "index.md": [
            "guides/training-optimization/index.html",
            "advanced/performance/index.html",
            "advanced/scale/index.html",
        ],
        "guides/training-optimization/index.md": [
            "learning-rate-scheduling.html",
            "training-stability.html",
            "hyperparameter-optimization.html",
            "use-with-your-trainer.html",
        ],
        "advanced/performance/index.md": [
            "memory-optimization.html",
            "distributed-training.html",
            "profiling.html",
            "monitoring.html",
            "benchmarking.html",
            "mixed-precision.html",
            "compilation.html",
        ],
    }
    for page, targets in expected.items():
        html = _html(built_site, DOCS / page)
        cards = re.findall(r'<div class="sd-card [^"]*".*?href="([^"#]+)"', html, flags=re.S)
        assert cards == targets, (page, cards)
        assert html.count("sd-card-footer") == len(targets)
        assert "octicon" in html


def test_card_badge_matches_the_difficulty_of_the_linked_page(built_site: Path) -> None:
    html = _html(built_site, DOCS / "guides/training-optimization/index.md")
    for name in ("learning-rate-scheduling", "training-stability", "hyperparameter-optimization"):
        meta, title = read_front_matter(DOCS / "guides/training-optimization" / f"{name}.md")
        card = re.search(
            rf'href="{name}.html".*?sd-card-footer.*?sd-badge[^>]*>([^<]+)<', html, flags=re.S
        )
        assert card and card.group(1) == meta["difficulty"].capitalize(), name
        page_html = _html(built_site, DOCS / "guides/training-optimization" / f"{name}.md")
        assert "trainopt-difficulty" in page_html


def test_math_renders_as_math_not_text(built_site: Path) -> None:
    pages_with_math = [p for p in PAGES if "$$" in p.read_text()]
    for page in pages_with_math:
        html = _html(built_site, page)
        assert 'class="math' in html, page
        assert "$$" not in re.sub(r"<script.*?</script>", "", html, flags=re.S), page


def test_no_sybil_directive_or_raw_fence_leaks_into_html(built_site: Path) -> None:
    for page in PAGES:
        html = _html(built_site, page)
        assert "skip: next" not in html, page
        assert ":::{" not in html and "```{" not in html, page


def test_no_broken_internal_link_or_image(built_site: Path) -> None:
    assert broken_links(built_site) == []


def test_link_checker_reports_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text(
        '<a href="b.html">b</a><a href="a.html#missing">x</a><img src="i.png">'
    )
    assert broken_links(tmp_path) == [
        "a.html: a.html#missing (no anchor #missing)",
        "a.html: b.html (no such file)",
        "a.html: i.png (no such file)",
    ]


def test_copybutton_copies_code_only_from_doctest_blocks(built_site: Path) -> None:
    js = (built_site / "_static" / "copybutton.js").read_text()
    # formatCopyText(text, prompt, isRegexp, onlyCopyPromptLines, removePrompts, ...)
    call = re.search(r"return formatCopyText\(text, '(.*?)', (\w+), (\w+), (\w+),", js)
    assert call, "copybutton.js has no formatCopyText call"
    assert call.group(1) == r">>> |\\.\\.\\. |\\$ "
    assert call.groups()[1:] == ("true", "true", "true")


def test_yaml_shown_on_pages_is_included_from_real_files() -> None:
    for page in PAGES:
        text = page.read_text()
        assert not re.search(r"^```ya?ml\s*$", text, flags=re.M), (
            f"{page.relative_to(DOCS)}: inline YAML; include a real file with literalinclude"
        )
        for include in re.findall(r"^```\{literalinclude\}\s+(\S+\.ya?ml)", text, flags=re.M):
            yaml.safe_load((page.parent / include).read_text())
