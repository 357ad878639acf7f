"""pytest set-up shared by the unit tests, the Sybil-run pages in docs/ and the docstrings in src/.

Sybil collects:
- every MyST page under ``docs/``: ```` ```python ```` blocks (plain code or ``>>>`` doctests) run
  in order in one namespace per page, exactly as a reader who pastes them into one interpreter,
  started in an empty directory of its own (what a page writes by a relative path, such as the
  stability page's ``checkpoints/recipe``, lands there and is removed with it);
  ``% skip: next if(<condition>, reason="...")`` skips the next block with a reason;
- every ``>>>`` example in the docstrings of ``src/trainopt``, each docstring in an empty
  namespace of its own (not the module's) and in an empty directory of its own, so an example
  runs exactly as a reader who pastes it alone into a fresh interpreter anywhere: it imports
  what it uses and reads no file of the repository by a relative path;
  ``.. skip: start if(<condition>, reason="...")`` … ``.. skip: end`` skips CUDA-only examples on
  a CPU (the condition is
  evaluated in the docstring's namespace, so an earlier example imports torch).

Nothing is injected into a page's namespace: a page imports what it uses in plain sight.

``TRAINOPT_REQUIRE_CUDA=1`` (``make test-gpu``) makes every skip whose reason mentions CUDA or
a GPU a failure, and fails at once if no CUDA device is visible.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
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

# (the directory a page started from, its empty directory), innermost last
_PAGE_DIRS: list[tuple[str, str]] = []


def _page_setup(namespace: dict) -> None:
    _PAGE_DIRS.append((os.getcwd(), tempfile.mkdtemp(prefix="trainopt-page-")))
    os.chdir(_PAGE_DIRS[-1][1])


def _page_teardown(namespace: dict) -> None:
    started, folder = _PAGE_DIRS.pop()
    os.chdir(started)
    shutil.rmtree(folder, ignore_errors=True)


docs = Sybil(
    parsers=[PythonCodeBlockParser(doctest_optionflags=OPTIONFLAGS), SkipParser()],
    patterns=["*.md"],
    path="docs",
    excludes=["_build/*", "_generated/*"],
    name="docs",
    setup=_page_setup,
    teardown=_page_teardown,
)


class IsolatedDocStringDocument(PythonDocStringDocument):
    """Docstring examples of a module, each docstring in a fresh, empty namespace and directory.

    Sybil's own ``PythonDocStringDocument`` runs every example in the module's namespace, which
    hides a missing import. Here nothing of the module is visible, and the namespace is emptied
    whenever the examples move on to the next docstring; the working directory is then a new
    empty one (the module's examples share a temporary folder, removed with its last example).
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
            os.chdir(tempfile.mkdtemp(dir=_DOCSTRING_DIRS[-1][1]))
        raise NotEvaluated()


# (the directory a module's examples started from, their temporary folder), innermost last
_DOCSTRING_DIRS: list[tuple[str, str]] = []


def _docstrings_setup(namespace: dict) -> None:
    _DOCSTRING_DIRS.append((os.getcwd(), tempfile.mkdtemp(prefix="trainopt-docstrings-")))


def _docstrings_teardown(namespace: dict) -> None:
    started, folder = _DOCSTRING_DIRS.pop()
    os.chdir(started)
    shutil.rmtree(folder, ignore_errors=True)


docstrings = Sybil(
    parsers=[DocTestParser(optionflags=OPTIONFLAGS), RestSkipParser()],
    patterns=["*.py"],
    path="src",
    name="docstrings",
    document_types={".py": IsolatedDocStringDocument},
    setup=_docstrings_setup,
    teardown=_docstrings_teardown,
)

workshop_docstrings = Sybil(
    parsers=[DocTestParser(optionflags=OPTIONFLAGS), RestSkipParser()],
    patterns=["*.py"],
    path="docs/_lib",
    name="workshop-docstrings",
    document_types={".py": IsolatedDocStringDocument},
    setup=_docstrings_setup,
    teardown=_docstrings_teardown,
)

_collection = docs + docstrings  # a SybilCollection
_collection.append(workshop_docstrings)
pytest_collect_file = _collection.pytest()


# pytest-xdist (``make test`` runs ``-n 2``). Every file is one unit of work that one worker runs
# from its first test to its last, whatever ``--dist`` says (except ``each``): a page's Sybil
# examples share one namespace and run in order, and a module's module-scoped fixtures are set up
# once. The files below start several processes per test (gloo ranks, HPO workers, Chromium and
# fresh interpreters, a nested pytest) or assert wall-clock deadlines: together they are one unit,
# run one file after the other, so no two of them ever run at once; it goes out first, as the
# longest unit. A folder ends with "/".
ONE_AT_A_TIME = (
    "tests/browser/",
    "tests/perf/distributed/",
    "tests/perf/bench/test_scaling.py",
    "tests/stability/test_rank_agreement.py",
    "tests/stability/test_launch_deadline.py",
)


# Files whose tests share nothing (no module fixture, no namespace): each test is its own unit, so
# the two workers share them. Each notebook starts its own kernel.
EACH_TEST_ALONE = ("tests/docs/test_notebooks.py",)


def unit_of_work(nodeid: str) -> str:
    """The unit of work (xdist scope) of a test: its file, the test itself for EACH_TEST_ALONE, or
    "one-at-a-time" for ONE_AT_A_TIME."""
    path = nodeid.split("::", 1)[0]
    if any(path == p or (p.endswith("/") and path.startswith(p)) for p in ONE_AT_A_TIME):
        return "one-at-a-time"
    if path in EACH_TEST_ALONE:
        return nodeid
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") == "each":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        """``--dist loadfile`` with ONE_AT_A_TIME as one unit, the units in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

        def schedule(self) -> None:
            reorder, self.config.option.loadscopereorder = (
                self.config.option.loadscopereorder,
                False,
            )
            try:
                super().schedule()
            finally:
                self.config.option.loadscopereorder = reorder

    return FileScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, order the units: one-at-a-time first (its browser tests start the site
    build), the files that need the built site last (the other worker runs the rest meanwhile)."""
    if not hasattr(config, "workerinput"):
        return
    site = {
        unit_of_work(item.nodeid)
        for item in items
        if "built_site" in getattr(item, "fixturenames", ())
    }

    def rank(item: pytest.Item) -> int:
        unit = unit_of_work(item.nodeid)
        return 0 if unit == "one-at-a-time" else 2 if unit in site else 1

    items.sort(key=rank)  # stable: files keep their order, and a file's tests theirs


def pytest_configure(config: pytest.Config) -> None:
    if REQUIRE_CUDA:
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError(
                "TRAINOPT_REQUIRE_CUDA=1 but torch.cuda.is_available() is False"
            )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_CUDA and report.skipped:
        reason = (
            str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        )
        if GPU_REASON.search(reason):
            report.outcome = "failed"
            report.longrepr = f"TRAINOPT_REQUIRE_CUDA=1 but this was skipped: {reason}"
