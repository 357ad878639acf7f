"""Each guide, performance, concepts and troubleshooting page as a Jupyter notebook.

:func:`notebook_for` turns a MyST page into an nbformat 4 notebook: the page's ```` ```python ````
blocks become code cells in page order (a ``>>>`` doctest becomes its statements, each expected
value checked with ``assert``), the prose between them markdown cells. A block that Sybil skips
on some machines (``% skip: next if(<condition>, reason="...")``) runs under ``if not
(<condition>):`` with a markdown note giving the reason, so the notebook runs top to bottom on a
CPU too. Implementations (``trainopt-source``) are shown as Python code in markdown, not run:
they are the library's own code, which the usage cells import.

The site writes ``<page>.ipynb`` next to ``<page>.html``; ``tests/docs/test_notebooks.py`` runs
every notebook in a fresh kernel in an empty directory with nbclient.
"""

from __future__ import annotations

import ast
import doctest
import re
import textwrap
from pathlib import Path
from typing import Any

from audit import SKIP, blocks

SECTIONS = ("guides/", "advanced/performance/", "advanced/scale/", "concepts/")


def NOTEBOOK_PAGES(docs: str | Path) -> list[str]:  # noqa: N802 - reads as the list it returns
    """Docnames of the pages that come as notebooks: every page of the sections, index pages
    aside."""
    docs = Path(docs)
    names = sorted(p.relative_to(docs).with_suffix("").as_posix() for p in docs.rglob("*.md"))
    return [n for n in names if n.startswith(SECTIONS) and Path(n).name != "index"]


def doctest_as_code(body: str) -> str:
    """A ``>>>`` block as plain statements; an expected output is checked, as the doctest does."""
    parts = []
    for example in doctest.DocTestParser().get_examples(body):
        source = example.source.rstrip("\n")
        want = example.want.rstrip("\n")
        if want and not example.exc_msg and _is_expression(source):
            shown = " ".join(want.split())
            if "..." in want:  # an ellipsis in the expected output: show the value, don't check it
                parts.append(f"print({source.strip()})")
            else:
                parts.append(
                    f"_value = {source.strip()}\n"
                    f"assert ' '.join(repr(_value).split()) == {shown!r} or "
                    f"' '.join(str(_value).split()) == {shown!r}, _value\n_value"
                )
        else:
            parts.append(source)
    return "\n".join(parts)


def _is_expression(source: str) -> bool:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return (
        len(tree.body) == 1
        and isinstance(tree.body[0], ast.Expr)
        and not (
            isinstance(tree.body[0].value, ast.Call)
            and getattr(tree.body[0].value.func, "id", "") == "print"
        )
    )


def _markdown(lines: list[str]) -> str:
    """MyST prose as notebook markdown: comments, directive fences and figure directives dropped."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("%") or re.match(r"^\(.+\)=$", stripped):
            i += 1
            continue
        fence = re.match(r"^(\s*)(`{3,}|~{3,})\s*\{([\w-]+)\}\s*(.*)$", line)
        if fence:
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(fence.group(2)):
                end += 1
            name, argument = fence.group(3), fence.group(4).strip()
            body = [b for b in lines[i + 1 : end] if not re.match(r"^\s*:[\w-]+:", b)]
            if name == "trainopt-source":
                from trainopt_docs import source_with_imports

                out += [
                    f"Implementation of `{argument}` (shown, not run):",
                    "",
                    "```python",
                    *source_with_imports(argument).rstrip("\n").splitlines(),
                    "```",
                ]
            elif name == "trainopt-figure":
                caption = next(
                    (
                        re.sub(r"^\s*:caption:\s*", "", b)
                        for b in lines[i + 1 : end]
                        if re.match(r"^\s*:caption:", b)
                    ),
                    "",
                )
                out.append(f"*Figure on the page: {caption}*")
            elif name in ("note", "tip", "warning", "important", "admonition", "dropdown"):
                out += body
            i = end + 1
            continue
        if re.match(r"^\s*:{3,}", line):
            i += 1
            while i < len(lines) and re.match(
                r"^\s*:[\w-]+:(\s|$)", lines[i]
            ):  # the directive's options
                i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(out).strip("\n")


def notebook_for(path: Path) -> dict[str, Any]:
    """The nbformat 4 notebook of a MyST page (see the module docstring)."""
    text = path.read_text()
    if text.startswith("---\n"):
        text = text[text.index("\n---", 4) + 4 :]
    offset = len(path.read_text().splitlines()) - len(text.splitlines())
    lines = text.splitlines()
    cells: list[dict[str, Any]] = []
    position = 0
    for block in blocks(path):
        if block.info.split()[:1] != ["python"]:
            continue
        start = block.line - 1 - offset  # the opening fence, 0-based, in ``lines``
        end = start + 1 + len(block.body.splitlines()) + 1 if block.body else start + 2
        prose = [line for line in lines[position:start] if not SKIP.match(line.strip())]
        markdown = _markdown(prose)
        code = (
            doctest_as_code(block.body) if re.search(r"^\s*>>> ", block.body, re.M) else block.body
        )
        condition = _skip_condition(block.skipped_by)
        if condition:
            reason = re.search(r"reason\s*=\s*(['\"])(.+)\1", block.skipped_by).group(2)
            markdown += (
                f"\n\n**{reason}**: the next cell runs only where `{condition}` is false; "
                "elsewhere it prints why it was skipped."
            )
            code = (
                f"if not ({condition}):\n"
                + textwrap.indent(code, "    ")
                + f"\nelse:\n    print({('skipped: ' + reason)!r})"
            )
        if markdown.strip():
            cells.append(_cell("markdown", markdown))
        cells.append(_cell("code", code))
        cells[-1]["metadata"]["trainopt"] = {"line": block.line, "skipped_if": condition}
        position = end
    rest = _markdown(lines[position:])
    if rest.strip():
        cells.append(_cell("markdown", rest))
    for number, cell in enumerate(cells):
        cell["id"] = f"cell-{number}"
    return {
        "cells": cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _skip_condition(skip: str | None) -> str | None:
    if not skip:
        return None
    call = ast.parse(
        "f" + skip.strip().removeprefix("next").strip().removeprefix("if"), mode="eval"
    ).body
    return ast.unparse(call.args[0])


def _cell(kind: str, source: str) -> dict[str, Any]:
    cell: dict[str, Any] = {"cell_type": kind, "id": "", "metadata": {}, "source": source}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    return cell
