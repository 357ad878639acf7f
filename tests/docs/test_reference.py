"""The API reference lists every public object of trainopt, each documented with an example."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
from reference import expected_pages, public_modules, public_objects


def test_committed_reference_pages_match_the_package() -> None:
    stale = [str(path.name) for path, text in expected_pages().items()
             if not path.exists() or path.read_text() != text]
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
        missing += [f"{module_name}.{name}" for name in public_objects(module_name)
                    if f'id="{module_name}.{name}"' not in html]
    assert not missing, f"not in the reference: {missing}"
