"""The "In your framework" tables of the performance pages name real flags (issue 33).

Each table has a column for Hugging Face's ``TrainingArguments``, one for Lightning's ``Trainer``
and one for Accelerate. Every code span in those columns is checked against the installed
package's source, read with :mod:`ast` rather than imported (importing transformers and
Lightning takes longer than this whole file may): a keyword must be a field of
``TrainingArguments`` or a parameter of ``Trainer.__init__`` or ``Accelerator.__init__``, a class
must exist with the keywords given to it, a method must be a method of ``Accelerator``, and the
values that are names (``optim``, ``fsdp``, ``precision``, ``profiler``, ``strategy``,
``mixed_precision``, ``dynamo_backend``) must be ones the framework accepts. An upstream rename
fails here and names the page to correct.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs" / "advanced" / "performance").glob("*.md"))
SPAN = re.compile(r"`([^`]+)`")
FRAMEWORKS = {
    "TrainingArguments": "transformers",
    "Lightning": "lightning",
    "Accelerate": "accelerate",
}
# where each framework's root object is defined, and the name of its parameters
ROOTS = {
    "transformers": ("training_args.py", "TrainingArguments"),
    "lightning": ("pytorch/trainer/trainer.py", "Trainer"),
    "accelerate": ("accelerator.py", "Accelerator"),
}
INSTANCES = {"accelerator": "accelerate", "trainer": "lightning"}
# the modules and folders that hold the classes the tables name
SOURCES = {
    "transformers": (
        "training_args.py",
        "trainer_utils.py",
        "trainer_callback.py",
        "data/data_collator.py",
        "utils/quantization_config.py",
    ),
    "lightning": (
        "pytorch/trainer/trainer.py",
        "pytorch/core/module.py",
        "pytorch/core/hooks.py",
        "pytorch/strategies",
        "pytorch/profilers",
        "pytorch/callbacks",
    ),
    "accelerate": ("accelerator.py", "utils/dataclasses.py"),
}


@functools.cache
def package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds a top-level package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@functools.cache
def class_index(package: str) -> dict[str, Path]:
    """``{class name: file}`` over ``package``'s :data:`SOURCES`, from one text search."""
    index: dict[str, Path] = {}
    for source in SOURCES[package]:
        where = package_dir(package) / source
        for path in sorted(where.rglob("*.py")) if where.is_dir() else [where]:
            for name in re.findall(r"^class (\w+)", path.read_text(errors="replace"), re.M):
                index.setdefault(name, path)
    return index


@functools.cache
def find_class(package: str, name: str) -> ast.ClassDef | None:
    """The class ``name`` defined in ``package``'s :data:`SOURCES`."""
    path = class_index(package).get(name)
    if path is None:
        return None
    for node in ast.walk(module_tree(path)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def parameters(cls: ast.ClassDef) -> tuple[set[str], bool]:
    """The keywords ``cls(...)`` takes (``__init__``'s, or a dataclass's fields), and whether it
    takes ``**kwargs``."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = node.args
            names = {a.arg for a in args.args + args.kwonlyargs if a.arg != "self"}
            return names, args.kwarg is not None
    fields = {
        node.target.id
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    return fields, False


@functools.cache
def deprecated(package: str) -> set[str]:
    """The root's fields whose help calls them a deprecated alias (``TrainingArguments`` only)."""
    cls = find_class(package, ROOTS[package][1])
    return {
        node.target.id
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and "Deprecated alias" in ast.unparse(node.value or ast.Constant(""))
    }


def methods(package: str, cls: ast.ClassDef) -> set[str]:
    """The methods of ``cls``, and of its bases that ``package`` defines."""
    own = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    for base in cls.bases:
        found = find_class(package, base.id) if isinstance(base, ast.Name) else None
        own |= methods(package, found) if found is not None else set()
    return own


def enum_values(package: str, name: str) -> set[str]:
    cls = find_class(package, name)
    assert cls is not None, f"{package} has no class {name}"
    return {
        node.value.value
        for node in cls.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
    }


@functools.cache
def accepted_values(package: str, keyword: str) -> set[str] | None:
    """The strings a framework accepts for ``keyword``, or None where it takes any value."""
    if (package, keyword) == ("transformers", "optim"):
        return enum_values("transformers", "OptimizerNames")
    if (package, keyword) == ("transformers", "fsdp"):
        return enum_values("transformers", "FSDPOption")
    if (package, keyword) == ("accelerate", "mixed_precision"):
        return enum_values("accelerate", "PrecisionType")
    if (package, keyword) == ("accelerate", "dynamo_backend"):
        return {v.lower() for v in enum_values("accelerate", "DynamoBackend")}
    if (package, keyword) == ("lightning", "precision"):
        tree = module_tree(package_dir("lightning") / "fabric/plugins/precision/precision.py")
        return {
            n.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and any(
                isinstance(t, ast.Name) and t.id.startswith("_PRECISION_INPUT_STR")
                for t in node.targets
            )
            for n in ast.walk(node.value)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
    if (package, keyword) == ("lightning", "profiler"):
        tree = module_tree(package_dir("lightning") / "pytorch/trainer/setup.py")
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "PROFILERS" for t in node.targets
            ):
                return {k.value for k in node.value.keys}
        raise AssertionError("Lightning's profiler names moved")
    if (package, keyword) == ("lightning", "strategy"):
        names: set[str] = set()
        for path in (package_dir("lightning") / "pytorch/strategies").glob("*.py"):
            for node in ast.walk(module_tree(path)):
                if isinstance(node, ast.FunctionDef) and node.name == "register_strategies":
                    names |= {
                        n.value
                        for n in ast.walk(node)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)
                    }
        return names
    return None


def check_call(package: str, cls_name: str, keywords: list[ast.keyword]) -> list[str]:
    cls = find_class(package, cls_name)
    if cls is None:
        return [f"{package} has no class {cls_name}"]
    accepted, any_keyword = parameters(cls)
    problems = []
    is_root = cls_name == ROOTS[package][1]
    for kw in keywords:
        if kw.arg not in accepted and not any_keyword:
            problems.append(f"{cls_name} takes no {kw.arg}=")
        elif is_root and kw.arg in deprecated(package):
            problems.append(f"{cls_name}'s {kw.arg}= is a deprecated alias: name the new one")
        allowed = accepted_values(package, kw.arg) if is_root else None
        if isinstance(kw.value, ast.Call) and isinstance(kw.value.func, ast.Name):
            problems += check_call(package, kw.value.func.id, kw.value.keywords)
        if allowed is not None and isinstance(kw.value, ast.Constant):
            words = str(kw.value.value).split() if kw.arg == "fsdp" else [str(kw.value.value)]
            problems += [
                f"{kw.arg}={w!r} is not one of {sorted(allowed)}" for w in words if w not in allowed
            ]
    return problems


def check_span(package: str, span: str) -> list[str]:
    """What is wrong with one code span of a framework's column (an empty list: nothing)."""
    root = ROOTS[package][1]
    text = f"{root}({span})" if re.match(r"^\w+\s*=", span) else span
    try:
        expr = ast.parse(text, mode="eval").body
    except SyntaxError:
        return [f"`{span}` is not a Python expression"]
    if isinstance(expr, ast.Name):  # a class, or the name of one of the root's keywords
        if expr.id in parameters(find_class(package, root))[0] or find_class(package, expr.id):
            return []
        return [f"{package} has no class or {root} keyword {expr.id}"]
    call = isinstance(expr, ast.Call)
    if call and isinstance(expr.func, ast.Name):
        return check_call(package, expr.func.id, expr.keywords)
    target = expr.func if call else expr
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
        owner = target.value.id  # Class.method, or accelerator.method for an instance
        cls = find_class(package, root if INSTANCES.get(owner) == package else owner)
        if cls is not None and target.attr in methods(package, cls):
            return []
        return [f"{package} has no {owner}.{target.attr}"]
    return [f"`{span}`: not a keyword, class, call or method this test can check"]


def framework_cells(page: Path) -> list[tuple[str, str, int]]:
    """``(framework package, cell text, line)`` for each cell of an "In your framework" table."""
    cells = []
    lines = page.read_text().splitlines()
    columns: dict[int, str] | None = None
    for number, line in enumerate(lines, start=1):
        if not line.startswith("|"):
            columns = None
            continue
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        if columns is None:
            columns = {
                i: package
                for i, header in enumerate(row)
                for key, package in FRAMEWORKS.items()
                if key in header
            }
            continue
        if set("".join(row)) <= set("-: "):
            continue
        cells += [(columns[i], row[i], number) for i in columns if i < len(row)]
    return cells


TABLED = [p for p in PAGES if framework_cells(p)]


def test_every_performance_page_but_the_landing_page_has_a_framework_table():
    assert {p.stem for p in TABLED} == {p.stem for p in PAGES} - {"index"}


@pytest.mark.parametrize("page", TABLED, ids=lambda p: p.stem)
def test_the_framework_tables_name_flags_that_exist(page: Path):
    problems = [
        f"{page.name}:{line}: {problem}"
        for package, cell, line in framework_cells(page)
        for span in SPAN.findall(cell)
        for problem in check_span(package, span)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("package", "span"),
    [
        ("transformers", "bf16_mixed=True"),  # no such field
        ("transformers", "gradient_checkpointing=True"),  # activation_checkpointing's old name
        ("transformers", 'optim="adamw_fused"'),  # not an OptimizerNames value
        ("lightning", 'precision="bfloat16"'),  # Lightning spells it "bf16-mixed" (or "bf16")
        ("lightning", "accumulate_grad=4"),  # the Trainer's is accumulate_grad_batches
        ("lightning", "ThroughputMonitors"),
        ("accelerate", "accelerator.accumulate_grad(model)"),
        ("accelerate", 'Accelerator(mixed_precision="bfloat16")'),
    ],
)
def test_the_check_rejects_a_wrong_name(package: str, span: str):
    assert check_span(package, span)
