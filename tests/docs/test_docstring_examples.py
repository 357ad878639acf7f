"""Docstring examples show a result: the last line of every example has expected output."""

from __future__ import annotations

import doctest
import importlib
import inspect
from collections.abc import Iterator

import pytest
from reference import public_modules, public_objects


def documented(module_name: str) -> Iterator[tuple[str, object]]:
    """Every public object of a module, and the methods and properties of its public classes."""
    module = importlib.import_module(module_name)
    for name in public_objects(module_name):
        obj = getattr(module, name)
        yield name, obj
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                inner = getattr(value, "__func__", None) or getattr(value, "fget", None) or value
                if inspect.isfunction(inner) and inner.__doc__:
                    yield f"{name}.{attr}", inner


def examples(obj: object) -> list[doctest.Example]:
    return doctest.DocTestParser().get_examples(inspect.getdoc(obj) or "")


@pytest.mark.parametrize("module_name", public_modules())
def test_every_docstring_example_ends_with_the_result_it_shows(module_name: str) -> None:
    silent = [
        name
        for name, obj in documented(module_name)
        if (found := examples(obj)) and not found[-1].want.strip()
    ]
    assert not silent, (
        f"{module_name}: the last >>> line of these examples shows no result "
        f"(end with a value, a shape or a comparison): {silent}"
    )


def test_a_statement_only_example_is_caught() -> None:
    def statements_only() -> None:
        """Example:
        >>> x = 1
        >>> y = x + 1
        """

    def with_result() -> None:
        """Example:
        >>> 1 + 1
        2
        """

    assert not examples(statements_only)[-1].want.strip()
    assert examples(with_result)[-1].want.strip() == "2"


def _docstrings() -> Iterator[tuple[str, str]]:
    import ast
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src"
    for path in sorted(src.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc:
                    yield f"{path.relative_to(src)}:{getattr(node, 'lineno', 1)}", doc


def test_docstring_blocks_that_are_not_python_declare_their_language() -> None:
    """A bare ``::`` block is highlighted and copied as Python: formulas and schemas are declared
    ``.. code-block:: text``; Python is a ``>>>`` example, which the test suite runs."""
    import re

    bare = [
        f"{where}: {line.strip()!r}"
        for where, doc in _docstrings()
        for line in doc.splitlines()
        if re.search(r"::\s*$", line) and not re.match(r"\s*\.\. [\w-]+::", line)
    ]
    assert not bare, "declare a language (.. code-block:: text) for:\n" + "\n".join(bare)
