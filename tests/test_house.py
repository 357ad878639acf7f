"""The house rules: the code's layout follows the site's grid (DESIGN.md, "The house").

- one package per section of the site, each exporting with ``__all__`` the names its page teaches;
- no line cap (DESIGN.md, revised 2026-12-01: one concern per module, kept by review and ruff);
- no import cycle, between modules or between packages, and the packages stack:
  ``data`` < ``models`` < ``schedules`` < ``config`` < ``stability`` < ``perf``, ``hpo``,
  ``concepts``, ``diagnostics``;
- ``schedules`` and ``stability`` import no optuna, matplotlib or sphinx when imported;
- nothing in ``src/`` imports ``docs/`` or ``tests/``;
- a page draws its includes and examples from its own package, the shared ones, and the few
  packages its entry in :data:`PAGES` names; its figures, renders and commands may also come
  from the site's workshop for those sections (``trainopt_site.<section>``, in ``docs/_lib/``,
  laid out like the library), its usage blocks never: they run from the wheel alone.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "trainopt"
DOCS = ROOT / "docs"
SITE = DOCS / "_lib" / "trainopt_site"

# Section packages (and the shared ones), bottom of the stack first; a package may import only
# from packages of a lower rank (or its own).
RANK = {
    "trainopt.validation": -2,  # the one check of a numeric argument: everything uses it
    "trainopt.data": -1,  # files the package ships: the very bottom (models loads the digits)
    "trainopt.models": 0,
    "trainopt.schedules": 1,
    "trainopt.config": 2,
    "trainopt.stability": 3,
    "trainopt.perf": 4,
    "trainopt.hpo": 4,
    "trainopt.concepts": 4,
    "trainopt.diagnostics": 4,
}
SECTIONS = [
    "trainopt.schedules",
    "trainopt.stability",
    "trainopt.hpo",
    "trainopt.perf",
    "trainopt.perf.distributed",
    "trainopt.perf.bench",
    "trainopt.concepts",
    "trainopt.diagnostics",
]
SHARED = ("trainopt.config", "trainopt.models", "trainopt.data")

# page (relative to docs/) -> the packages it may draw from besides the shared ones
PAGES = {
    "guides/training-optimization/learning-rate-scheduling.md": ("trainopt.schedules",),
    "guides/training-optimization/training-stability.md": (
        "trainopt.stability",
        "trainopt.schedules",  # the complete recipe warms up and decays
        "trainopt.perf.bench",  # "What it costs" is the benchmark harness's stability run
        "trainopt_site.perf.bench",
    ),  # ... rendered by the performance pages' renderer
    "guides/training-optimization/hyperparameter-optimization.md": (
        "trainopt.hpo",
        "trainopt.schedules",  # the LR range test seeds the search range
        "trainopt_site.hpo",
    ),  # the overhead table
    "guides/training-optimization/index.md": (),
    "guides/training-optimization/use-with-your-trainer.md": (
        "trainopt.stability",
        "trainopt.hpo",
    ),  # integrations; tuning a Trainer run
    "guides/troubleshooting.md": (  # the fixes point into every section
        "trainopt.diagnostics",
        "trainopt.schedules",
        "trainopt.stability",
        "trainopt.perf",
        "trainopt_site.diagnostics",
    ),  # the recorder of its runs, its figures and tables
    "concepts/optimization.md": ("trainopt.concepts", "trainopt_site.concepts"),  # the figures
    "advanced/performance/index.md": (),
    "advanced/scale/index.md": (),
    "advanced/scale/compile-at-scale.md": (),
    "advanced/scale/long-sequences-and-memory.md": ("trainopt.perf",),
    "advanced/scale/loss-spikes-and-optimizers.md": (),
    "advanced/scale/parallel-layouts-and-debugging.md": (),
    "advanced/scale/throughput-and-profiling.md": (),
    "advanced/scale/layout-planner.md": ("trainopt.perf", "trainopt_site.perf"),
    "advanced/performance/compilation.md": ("trainopt.perf", "trainopt_site.perf"),
    "advanced/performance/mixed-precision.md": (
        "trainopt.perf",
        "trainopt_site.perf",
        "trainopt.stability",
    ),  # fp16 uses the stability page's loss scaler
    "advanced/performance/memory-optimization.md": ("trainopt.perf", "trainopt_site.perf"),
    "advanced/performance/profiling.md": ("trainopt.perf", "trainopt_site.perf"),
    "advanced/performance/monitoring.md": ("trainopt.perf", "trainopt_site.perf"),
    "advanced/performance/benchmarking.md": (
        "trainopt.perf.bench",
        "trainopt.perf",
        "trainopt_site.perf",
    ),
    "advanced/performance/distributed-training.md": (
        "trainopt.perf.distributed",
        "trainopt.perf",
        "trainopt_site.perf",
    ),
    "index.md": (),
    "glossary.md": (),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _package_of(module: str) -> str:
    """The section or shared package a module belongs to (``trainopt.perf.bench.x`` ->
    ``trainopt.perf``)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not MODULES[importer].name == "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, top_level_only: bool) -> set[str]:
    """The trainopt modules ``module`` imports (a ``from pkg import submodule`` counts the
    submodule)."""
    tree = ast.parse(MODULES[module].read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("trainopt")}
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            if not target.startswith("trainopt"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
    return {m for m in found if m in MODULES}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_modules() -> None:
    graph = {m: _imports(m, top_level_only=False) - {m} for m in MODULES}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_no_import_cycle_between_packages() -> None:
    graph: dict[str, set[str]] = {}
    for module in MODULES:
        if module.endswith(".__main__"):
            continue  # a command's entry point is a leaf (nothing imports it)
        here = _package_of(module)
        graph.setdefault(here, set()).update(
            _package_of(m) for m in _imports(module, False) if _package_of(m) != here
        )
    assert _cycle(graph) is None, f"import cycle between packages: {' -> '.join(_cycle(graph))}"


def test_packages_import_only_from_below() -> None:
    wrong = []
    for module in MODULES:
        here = _package_of(module)
        if here not in RANK or module.endswith(".__main__"):
            # a command's entry point is a leaf: nothing imports it, so it may use any package
            continue
        for target in _imports(module, top_level_only=False):
            there = _package_of(target)
            if there != here and RANK.get(there, 99) >= RANK[here]:
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports up or across the stack:\n" + "\n".join(wrong)


def test_every_module_belongs_to_a_section_or_shared_package() -> None:
    stray = [m for m in MODULES if m != "trainopt" and _package_of(m) not in RANK]
    assert not stray, f"modules outside the house's packages: {stray}"


def test_schedules_and_stability_import_no_heavy_optional_dependency() -> None:
    modules = [
        m
        for m in MODULES
        if m.startswith(("trainopt.schedules", "trainopt.stability")) and not m.endswith("__main__")
    ]
    code = (
        f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))"
    )
    loaded = set(
        json.loads(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True
            ).stdout
        )
    )
    assert len(modules) > 20
    assert not loaded & {"optuna", "matplotlib", "sphinx"}, sorted(
        loaded & {"optuna", "matplotlib", "sphinx"}
    )


def test_nothing_in_src_imports_docs_or_tests() -> None:
    bad = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                targets = [node.module or ""]
            else:
                continue
            bad += [
                f"{name}: {t}"
                for t in targets
                if t.split(".")[0]
                in {
                    "docs",
                    "tests",
                    "conftest",
                    "audit",
                    "trainopt_docs",
                    "reference",
                    "trainopt_site",
                }
            ]
        if re.search(r"sys\.path\.(insert|append)", path.read_text()):
            bad.append(f"{name}: changes sys.path")
    assert not bad, bad


@pytest.mark.parametrize("package", SECTIONS + list(SHARED))
def test_section_packages_export_their_names(package: str) -> None:
    module = importlib.import_module(package)
    exported = getattr(module, "__all__", None)
    assert exported, f"{package} has no __all__"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"{package}.__all__ names what it doesn't have: {missing}"
    assert len(set(exported)) == len(exported), f"{package}.__all__ repeats a name"


def _page_targets(text: str) -> list[str]:
    """Every trainopt module a page imports, includes, renders or runs."""
    found = re.findall(r"^\s*(?:>>> |\.\.\. )?from (trainopt[\w.]*) import", text, flags=re.M)
    found += re.findall(r"^\s*(?:>>> |\.\.\. )?import (trainopt[\w.]*)", text, flags=re.M)
    found += [
        name.rsplit(".", 1)[0]
        for name in re.findall(
            r"^```\{trainopt-(?:source|figure|render)\}\s+(trainopt[\w.]+)", text, flags=re.M
        )
    ]
    found += re.findall(r"python -m (trainopt[\w.]*)", text)
    return found


def test_the_page_map_covers_every_page() -> None:
    pages = {
        str(p.relative_to(DOCS))
        for p in DOCS.rglob("*.md")
        if not p.relative_to(DOCS).parts[0].startswith(("_", "reference"))
    }
    assert pages == set(PAGES), (
        f"pages not in the map: {sorted(pages - set(PAGES))}; gone: {sorted(set(PAGES) - pages)}"
    )


def _workshop_of(packages: tuple[str, ...]) -> tuple[str, ...]:
    """The workshop's packages for library packages: ``trainopt.x`` -> ``trainopt_site.x``."""
    return tuple("trainopt_site" + p.removeprefix("trainopt") for p in packages)


def _usage_imports(text: str) -> list[str]:
    """The modules a page's usage blocks (```python, run by Sybil and copied by readers) import."""
    blocks = re.findall(r"^```python[^\n]*\n(.*?)^```", text, flags=re.M | re.S)
    return [
        m
        for block in blocks
        for m in re.findall(r"^\s*(?:from|import) ([\w.]+)", block, flags=re.M)
    ]


@pytest.mark.parametrize("page", sorted(PAGES))
def test_pages_draw_from_their_own_packages(page: str) -> None:
    allowed = PAGES[page] + SHARED + _workshop_of(PAGES[page])
    used = _page_targets((DOCS / page).read_text())
    wrong = sorted({m for m in used if not any(m == a or m.startswith(a + ".") for a in allowed)})
    assert not wrong, f"{page} uses {wrong}; its map entry allows {allowed}"


def test_page_map_rejects_an_import_it_does_not_list() -> None:
    text = "```python\nfrom trainopt.hpo import tune\n```\n"
    assert _page_targets(text) == ["trainopt.hpo"]
    assert not any("trainopt.hpo".startswith(a) for a in PAGES["concepts/optimization.md"] + SHARED)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_usage_blocks_import_only_the_wheel(page: str) -> None:
    used = _usage_imports((DOCS / page).read_text())
    site = [m for m in used if m.split(".")[0] == "trainopt_site"]
    assert not site, f"{page}: usage blocks import the workshop, which the wheel lacks: {site}"


def test_usage_block_rule_sees_a_workshop_import_but_not_a_figure() -> None:
    text = (
        "```{trainopt-figure} trainopt_site.stability.faults.fault_injection_figure\n```\n"
        "```python\nimport torch\nfrom trainopt_site.stability.faults import main\n```\n"
    )
    assert _usage_imports(text) == ["torch", "trainopt_site.stability.faults"]
    assert "trainopt_site.stability.faults" in _page_targets(text)


def test_the_workshop_is_laid_out_like_the_library() -> None:
    """``trainopt_site.<section>`` serves the page of ``trainopt.<section>``; a docstring each."""
    modules = [p.relative_to(SITE) for p in sorted(SITE.rglob("*.py"))]
    assert modules, f"no workshop at {SITE}"
    stray = [str(p) for p in modules if len(p.parts) > 1 and f"trainopt.{p.parts[0]}" not in RANK]
    assert not stray, f"workshop modules outside the library's sections: {stray}"

    def documented(folder: Path) -> bool:
        init = SITE / folder / "__init__.py"
        return init.is_file() and bool(ast.get_docstring(ast.parse(init.read_text())))

    bare = [str(folder) for folder in {p.parent for p in modules} if not documented(folder)]
    assert not bare, f"workshop packages without an __init__ docstring: {sorted(set(bare))}"
