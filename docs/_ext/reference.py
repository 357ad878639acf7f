"""The API reference: one page per public ``trainopt`` module, generated from the package itself.

``python docs/_ext/reference.py`` (re)writes ``docs/reference/<module>.md`` for every public module
and the index's toctree; ``tests/test_reference.py`` fails when the committed pages differ from
what this writes, or when a public object has no docstring, no example, or no entry in the built
reference.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
REFERENCE = DOCS / "reference"
SKIP_MODULES = {"trainopt.__main__"}


def public_modules() -> list[str]:
    """Every importable, public ``trainopt`` module, sorted (``trainopt`` itself excluded)."""
    import trainopt

    names = []
    for info in pkgutil.walk_packages(trainopt.__path__, prefix="trainopt."):
        if any(part.startswith("_") for part in info.name.split(".")) or info.name in SKIP_MODULES:
            continue
        names.append(info.name)
    return sorted(names)


def public_objects(module_name: str) -> list[str]:
    """Public functions and classes a module defines itself (restricted to ``__all__`` if set).

    Re-exports are documented where they are defined, once.
    """
    module = importlib.import_module(module_name)
    exported = set(getattr(module, "__all__", vars(module)))
    return sorted(
        name for name, obj in vars(module).items()
        if not name.startswith("_") and name in exported
        and (inspect.isfunction(obj) or inspect.isclass(obj))
        and getattr(obj, "__module__", None) == module_name
    )


ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`~?([^`]+)`")
LITERAL = re.compile(r"``([^`]+)``")
FLAG = re.compile(r"(?<![\w`-])(--[a-z][\w-]*)")


def _first_paragraph(module_name: str) -> str:
    doc = inspect.getdoc(importlib.import_module(module_name)) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ").strip()


def _summary(module_name: str) -> str:
    """The module's first paragraph as MyST: roles and RST literals become inline code.

    A command-line flag becomes inline code too, so that ``--n-trials`` is not typeset with an
    en-dash.
    """
    text = ROLE.sub(lambda m: f"`{m.group(1)}`", _first_paragraph(module_name))
    text = LITERAL.sub(lambda m: f"`{m.group(1)}`", text)
    parts = text.split("`")
    # outside inline code (even parts): flags become code, and a bar would end the table cell
    for i in range(0, len(parts), 2):
        parts[i] = FLAG.sub(r"`\1`", parts[i]).replace("|", "\\|")
    return "`".join(parts)


def _plain_summary(module_name: str) -> str:
    """The module's first paragraph as plain text, for the page's meta description."""
    text = ROLE.sub(lambda m: m.group(1), _first_paragraph(module_name))
    return LITERAL.sub(lambda m: m.group(1), text).replace("`", "").replace('"', "'")


def page_text(module_name: str) -> str:
    summary = _plain_summary(module_name)
    return (
        "---\n"
        f'description: "API reference of {module_name}: {summary}"\n'
        "---\n\n"
        f"# `{module_name}`\n\n"
        "```{eval-rst}\n"
        f".. automodule:: {module_name}\n"
        "   :members:\n"
        "   :ignore-module-all:\n"
        "   :show-inheritance:\n"
        "```\n"
    )


GROUPS = [
    ("trainopt.schedules", "Learning-rate schedules"),
    ("trainopt.stability", "Training stability"),
    ("trainopt.hpo", "Hyperparameter optimization"),
    ("trainopt.perf", "Performance"),
    ("trainopt.perf.distributed", "Distributed training"),
    ("trainopt.perf.bench", "Benchmarks"),
    ("trainopt.concepts", "Concepts"),
    ("trainopt.diagnostics", "Diagnostics"),
    ("trainopt.config", "Configuration"),
    ("trainopt.models", "Models"),
    ("trainopt.data", "Shipped data"),
]


def group_of(module_name: str) -> str:
    """The package of ``GROUPS`` a module belongs to: the longest prefix that matches."""
    matches = [g for g, _ in GROUPS if module_name == g or module_name.startswith(g + ".")]
    return max(matches, key=len) if matches else "trainopt"


def index_text(modules: list[str]) -> str:
    sections = []
    titles = dict(GROUPS)
    order = [g for g, _ in GROUPS] + ["trainopt"]
    for group in order:
        members = [m for m in modules if group_of(m) == group]
        if not members:
            continue
        rows = "\n".join(f"| [`{m}`]({m}.md) | {_summary(m)} |" for m in members)
        sections.append(
            f"## {titles.get(group, 'Other modules')}\n\n"
            "| module | what it holds |\n| --- | --- |\n"
            f"{rows}\n"
        )
    toctree = "\n".join(modules)
    return (
        "---\n"
        'description: "API reference of the trainopt package, generated from its docstrings."\n'
        'summary: "Every public object of trainopt, from its docstrings."\n'
        "---\n\n"
        "# API Reference\n\n"
        "Every public module of `trainopt`, grouped by package and generated from the docstrings\n"
        "in `src/`. Each object's docstring example is executed by the test suite.\n\n"
        + "\n".join(sections) + "\n"
        "```{toctree}\n:hidden:\n:maxdepth: 1\n\n"
        f"{toctree}\n"
        "```\n"
    )


def expected_pages() -> dict[Path, str]:
    modules = public_modules()
    pages = {REFERENCE / f"{m}.md": page_text(m) for m in modules}
    pages[REFERENCE / "index.md"] = index_text(modules)
    return pages


def main() -> int:
    expected = expected_pages()
    for stale in REFERENCE.glob("trainopt.*.md"):
        if stale not in expected:
            stale.unlink()
    for path, text in expected.items():
        path.write_text(text)
    print(f"wrote {len(expected)} reference pages")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(DOCS.parent / "src"))
    sys.exit(main())
