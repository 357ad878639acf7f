"""The API reference: one page per public ``trainopt`` module, generated from the package itself.

``python docs/_ext/reference.py`` (re)writes ``docs/reference/<module>.md`` for every public module
and the index's toctree; ``tests/test_reference.py`` fails when the committed pages differ from
what this writes, or when a public object has no docstring, no example, or no entry in the built
reference.

The page of each section package (``trainopt.schedules``, ``trainopt.stability``, ... in
``GROUPS``) opens with what a reader imports: every name of its ``__all__`` with a one-line
summary, linked to its entry on the page of the module that defines it. The sidebar follows the
sections: the index lists the section packages by title, and each section's page lists its
modules (and the sections below it, such as ``trainopt.perf.bench``).
"""

from __future__ import annotations

import functools
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
        name
        for name, obj in vars(module).items()
        if not name.startswith("_")
        and name in exported
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


def _one_line(obj: object) -> str:
    """The first sentence of an object's docstring, as MyST for a table cell."""
    doc = inspect.getdoc(obj) or ""
    line = doc.strip().split("\n\n")[0].replace("\n", " ").strip()
    line = ROLE.sub(lambda m: f"`{m.group(1).split('.')[-1]}`", line).replace(":math:`", "{math}`")
    return LITERAL.sub(lambda m: f"`{m.group(1)}`", line).replace("|", "\\|")


@functools.cache
def _public_modules() -> tuple[str, ...]:
    return tuple(public_modules())


def _defined_in(package: str, name: str, obj: object) -> str:
    """The module of ``package`` whose reference page documents ``obj``."""
    module = getattr(obj, "__module__", None)
    if (inspect.isfunction(obj) or inspect.isclass(obj)) and (
        module in _public_modules() or module == package
    ):
        return module  # documented where it is defined, even in another section (a re-export)
    for candidate in _public_modules():
        if (
            candidate.startswith(package + ".")
            and vars(importlib.import_module(candidate)).get(name) is obj
        ):
            return candidate
    return package


def exported_names(package: str) -> list[tuple[str, str, str]]:
    """``(name, dotted target, one-line summary)`` of each name in a package's ``__all__``.

    Functions and classes link to their entry on the page of the module that defines them;
    constants to that module's page, with their value as the summary.
    """
    module = importlib.import_module(package)
    rows = []
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        home = _defined_in(package, name, obj)
        if inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismodule(obj):
            summary = _one_line(obj)
        else:
            value = repr(obj)
            summary = "constant: `" + (value if len(value) <= 60 else value[:57] + "...") + "`"
        if inspect.ismodule(obj):
            target = obj.__name__
        elif inspect.isfunction(obj) or inspect.isclass(obj):
            target = f"{home}.{name}"
        else:
            target = home  # a constant links to the page of its module
        rows.append((name, target, summary))
    return rows


def _exports_table(package: str) -> str:
    rows = exported_names(package)
    if not rows:
        return ""
    lines = [
        f"`from {package} import ...` gives these names; each links to its full entry.",
        "",
        "| name | what it is |",
        "| --- | --- |",
    ]
    for name, target, summary in rows:
        role = "py:obj" if target.endswith("." + name) else "py:mod"
        lines.append(f"| {{{role}}}`{name} <{target}>` | {summary} |")
    return "## What the package exports\n\n" + "\n".join(lines) + "\n\n"


def _children(module_name: str, modules: list[str]) -> list[str]:
    """The pages listed under ``module_name`` in the sidebar: its members, and groups below it."""
    if module_name not in dict(GROUPS):
        return []
    members = [m for m in modules if group_of(m) == module_name and m != module_name]
    below = [
        g
        for g, _ in GROUPS
        if g != module_name
        and g.startswith(module_name + ".")
        and g in modules
        and group_of(g.rsplit(".", 1)[0]) == module_name
    ]
    return sorted(below) + members


def page_text(module_name: str, modules: list[str] | None = None) -> str:
    summary = _plain_summary(module_name)
    modules = public_modules() if modules is None else modules
    children = _children(module_name, modules)
    is_section = module_name in dict(GROUPS) and hasattr(
        importlib.import_module(module_name), "__path__"
    )
    exports = _exports_table(module_name) if is_section else ""
    titles = dict(GROUPS)
    # the sidebar names a module by its path below its section, in plain text: short, never clipped
    entries = [
        f"{titles[c]} <{c}>" if c in titles else f"{c.removeprefix(module_name + '.')} <{c}>"
        for c in children
    ]
    toctree = (
        ("```{toctree}\n:hidden:\n:maxdepth: 1\n\n" + "\n".join(entries) + "\n```\n")
        if children
        else ""
    )
    return (
        "---\n"
        f'description: "API reference of {module_name}: {summary}"\n'
        "---\n\n"
        f"# `{module_name}`\n\n"
        + exports
        + ("## The module\n\n" if exports else "")
        + "```{eval-rst}\n"
        f".. automodule:: {module_name}\n"
        "   :members:\n"
        "   :ignore-module-all:\n"
        "   :show-inheritance:\n"
        "```\n" + ("\n" + toctree if toctree else "")
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
    ("trainopt.validation", "Argument checks"),
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
    titles_by_group = dict(GROUPS)
    top = [g for g, _ in GROUPS if g in modules and group_of(g.rsplit(".", 1)[0]) == "trainopt"]
    loose = [m for m in modules if group_of(m) == "trainopt"]
    toctree = "\n".join([f"{titles_by_group[m]} <{m}>" for m in top] + loose)
    return (
        "---\n"
        'description: "API reference of the trainopt package, generated from its docstrings."\n'
        'summary: "Every public object of trainopt, from its docstrings."\n'
        "---\n\n"
        "# API Reference\n\n"
        "Every public module of `trainopt`, grouped by package and generated from the docstrings\n"
        "in `src/`. Each object's docstring example is executed by the test suite.\n\n"
        + "\n".join(sections)
        + "\n"
        "```{toctree}\n:hidden:\n:maxdepth: 1\n\n"
        f"{toctree}\n"
        "```\n"
    )


def expected_pages() -> dict[Path, str]:
    modules = public_modules()
    pages = {REFERENCE / f"{m}.md": page_text(m, modules) for m in modules}
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
