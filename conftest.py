"""pytest set-up shared by the unit tests, the Sybil-run pages in docs/ and the docstrings in src/.

Sybil collects:
- every MyST page under ``docs/``: ```` ```python ```` blocks (plain code or ``>>>`` doctests) run in
  order in one namespace per page, exactly as a reader who pastes them into one interpreter;
  ``% skip: next if(<condition>, reason="...")`` skips the next block with a reason;
- every ``>>>`` example in the docstrings of ``src/trainopt``, each docstring in an empty
  namespace of its own (not the module's), so an example runs exactly as a reader who pastes it
  alone into a fresh interpreter: it imports what it uses; ``.. skip: start if(<condition>,
  reason="...")`` … ``.. skip: end`` skips CUDA-only examples on a CPU (the condition is
  evaluated in the docstring's namespace, so an earlier example imports torch).

Nothing is injected into a page's namespace: a page imports what it uses in plain sight.

``TRAINOPT_REQUIRE_CUDA=1`` (``make test-gpu``) makes every skip whose reason mentions CUDA or
a GPU a failure, and fails at once if no CUDA device is visible.
"""

from __future__ import annotations

import os
import re
from doctest import ELLIPSIS, NORMALIZE_WHITESPACE

import matplotlib
import pytest
from sybil import Sybil
from sybil.document import Document, PythonDocStringDocument
from sybil.example import NotEvaluated
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser
from sybil.parsers.rest import DocTestParser
from sybil.parsers.rest import SkipParser as RestSkipParser

matplotlib.use("Agg")

REQUIRE_CUDA = os.environ.get("TRAINOPT_REQUIRE_CUDA", "") not in ("", "0")
GPU_REASON = re.compile(r"\b(cuda|gpu)\b", re.IGNORECASE)
OPTIONFLAGS = ELLIPSIS | NORMALIZE_WHITESPACE

docs = Sybil(
    parsers=[PythonCodeBlockParser(doctest_optionflags=OPTIONFLAGS), SkipParser()],
    patterns=["*.md"],
    path="docs",
    excludes=["_build/*", "_generated/*"],
    name="docs",
)


class IsolatedDocStringDocument(PythonDocStringDocument):
    """Docstring examples of a module, each docstring in a fresh, empty namespace.

    Sybil's own ``PythonDocStringDocument`` runs every example in the module's namespace, which
    hides a missing import. Here nothing of the module is visible, and the namespace is emptied
    whenever the examples move on to the next docstring.
    """

    def __init__(self, text: str, path: str) -> None:
        Document.__init__(self, text, path)
        self.spans: list[tuple[int, int]] | None = None  # found when the first example runs
        self.current: tuple[int, int] | None = None
        self.push_evaluator(self.fresh_namespace_per_docstring)

    def fresh_namespace_per_docstring(self, example) -> None:
        if self.spans is None:
            self.spans = [(start, end) for start, end, _ in self.extract_docstrings(self.text)]
        span = next((s for s in self.spans if s[0] <= example.region.start < s[1]), None)
        if span != self.current:
            self.current = span
            example.namespace.clear()
            example.namespace["__name__"] = "__main__"
        raise NotEvaluated()


docstrings = Sybil(
    parsers=[DocTestParser(optionflags=OPTIONFLAGS), RestSkipParser()],
    patterns=["*.py"],
    path="src",
    name="docstrings",
    document_types={".py": IsolatedDocStringDocument},
)

pytest_collect_file = (docs + docstrings).pytest()


def pytest_configure(config: pytest.Config) -> None:
    if REQUIRE_CUDA:
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("TRAINOPT_REQUIRE_CUDA=1 but torch.cuda.is_available() is False")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_CUDA and report.skipped:
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if GPU_REASON.search(reason):
            report.outcome = "failed"
            report.longrepr = f"TRAINOPT_REQUIRE_CUDA=1 but this was skipped: {reason}"
