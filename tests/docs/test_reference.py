"""The API reference lists every public object of trainopt, each documented with an example."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
from reference import GROUPS, expected_pages, exported_names, public_modules, public_objects


def test_committed_reference_pages_match_the_package() -> None:
    stale = [
        str(path.name)
        for path, text in expected_pages().items()
        if not path.exists() or path.read_text() != text
    ]
    assert not stale, f"reference pages out of date: {stale}; run python docs/_ext/reference.py"


@pytest.mark.parametrize("module_name", public_modules())
def test_every_public_object_has_a_docstring_with_an_example(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert inspect.getdoc(module), f"{module_name} has no module docstring"
    missing = []
    for name in public_objects(module_name):
        doc = inspect.getdoc(getattr(module, name)) or ""
        if not doc.strip():
            missing.append(f"{name}: no docstring")
        elif ">>>" not in doc:
            missing.append(f"{name}: no >>> example")
    assert not missing, f"{module_name}: " + "; ".join(missing)


def test_every_public_object_is_in_the_built_reference(built_site: Path) -> None:
    missing = []
    for module_name in public_modules():
        html = (built_site / "reference" / f"{module_name}.html").read_text()
        missing += [
            f"{module_name}.{name}"
            for name in public_objects(module_name)
            if f'id="{module_name}.{name}"' not in html
        ]
    assert not missing, f"not in the reference: {missing}"


SECTION_PACKAGES = [
    g
    for g, _ in GROUPS
    if getattr(importlib.import_module(g), "__all__", None)
    and hasattr(importlib.import_module(g), "__path__")
]


def test_section_packages_are_found() -> None:
    assert {"trainopt.schedules", "trainopt.stability", "trainopt.hpo", "trainopt.perf"} <= set(
        SECTION_PACKAGES
    )


@pytest.mark.parametrize("package", SECTION_PACKAGES)
def test_each_section_package_page_lists_its_exports_with_a_summary_and_a_link(
    package: str, built_site: Path
) -> None:
    html = (built_site / "reference" / f"{package}.html").read_text()
    table = html[html.index('id="what-the-package-exports"') :]
    table = table[: table.index("</table>")]
    missing = []
    for name, target, _ in exported_names(package):
        if target.endswith("." + name):  # a function or class: its entry on its module's page
            page, anchor = target.rpartition(".")[0], target
        else:  # a constant: the page of its module
            page, anchor = target, f"module-{target}"
        href = f'href="{page}.html#{anchor}"'
        # on the package's own page, the link is to the anchor alone
        link = (
            rf'href="(?:{re.escape(page)}\.html)?#{re.escape(anchor)}"'
            if page == package
            else re.escape(href)
        )
        row = re.search(
            rf'<tr[^>]*>\s*<td[^>]*><p><a class="reference internal" {link}[^>]*>'
            rf'<code[^>]*><span class="pre">{re.escape(name)}</span></code></a></p></td>\s*'
            rf"<td[^>]*><p>(.+?)</p></td>",
            table,
            flags=re.S,
        )
        if not row or not re.sub(r"<[^>]+>", "", row.group(1)).strip():
            missing.append(f"{name} (expected a link {href} and a summary)")
    assert not missing, f"{package}: " + "; ".join(missing)


def test_the_reference_sidebar_is_grouped_by_section(built_site: Path) -> None:
    html = (built_site / "reference" / "index.html").read_text()
    sidebar = html[html.index('<nav class="bd-docs-nav') :]
    sidebar = sidebar[: sidebar.index("</nav>")]
    top = re.findall(
        r'<li class="toctree-l1[^"]*"><a class="reference internal" href="([^"]+)">([^<]+)</a>',
        sidebar,
    )
    titles = dict(GROUPS)
    assert [title for _, title in top] == [titles[href.removesuffix(".html")] for href, _ in top]
    assert len(top) >= 8 and "<code" not in "".join(t for _, t in top)
    assert len(re.findall(r'class="toctree-l1', sidebar)) == len(top), (
        "a module outside its section"
    )
