"""The docs audit: every Python block on every page is included from ``src/`` or executed.

A page may show Python in exactly two ways:

- ```` ```{trainopt-source} trainopt.module.object ```` — the object's source, pulled from
  ``src/`` with the imports it needs;
- ```` ```python ```` — plain code or a ``>>>`` doctest, executed by Sybil in page order.

A ``python`` block may be skipped only by ``% skip: next if(<condition>, reason="...")``, a
conditional skip with a reason (GPU-only or multi-process examples), whose condition is not a
constant (``if(True, ...)`` would skip on every machine). Everything else that looks
like Python (```` ```py ````, ```` ```{code-block} python ````, ``literalinclude`` of a ``.py``
file, an unconditional skip, an invisible code block, an HTML-comment directive) is reported
with its file and line.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,}|:{3,})\s*(?P<info>.*)$")
PY_LANGS = {"py", "python3", "py3", "pycon", "ipython", "ipython3", "pytb"}
SOURCE_DIRECTIVE = "{trainopt-source}"
SKIP = re.compile(r"^%\s*skip:\s*(?P<args>.*)$")
GOOD_SKIP = re.compile(r"^next\s+if\(.+,\s*reason\s*=\s*(['\"]).+\1\s*\)\s*$")


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: its info string and the line (1-based) of its opening fence."""

    path: Path
    line: int
    info: str
    body: str
    skipped_by: str | None = None


def blocks(path: Path) -> list[Block]:
    """Fenced blocks of a MyST page, with the skip directive that precedes each, if any."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    pending_skip: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        skip = SKIP.match(line.strip())
        if skip:
            pending_skip = skip.group("args").strip()
            i += 1
            continue
        match = FENCE.match(line)
        if match and match.group("fence")[0] in "`~":
            fence = match.group("fence")
            body_start = i + 1
            j = body_start
            while j < len(lines) and not lines[j].strip().startswith(fence):
                j += 1
            body = "\n".join(lines[body_start:j])
            found.append(Block(path, i + 1, match.group("info").strip(), body, pending_skip))
            pending_skip = None
            i = j + 1
            continue
        if match and match.group("fence")[0] == ":":
            info = match.group("info").strip()
            if info:
                found.append(Block(path, i + 1, info, "", None))
        i += 1
    return found


def constant_condition(args: str) -> bool:
    """Whether the condition of ``next if(<condition>, reason=...)`` is a constant expression.

    ``if(True, ...)``, ``if(1, ...)``, ``if(not False, ...)`` or ``if(1 > 0, ...)`` skip on every
    machine: a condition must read something (a name, an attribute, a call). An unparsable
    condition counts as constant, so it is reported too.
    """
    inner = args[len("next") :].strip()
    try:
        call = ast.parse(inner.replace("if(", "_skip(", 1), mode="eval").body
        condition = call.args[0]
    except (SyntaxError, AttributeError, IndexError):
        return True
    return not any(
        isinstance(node, (ast.Name, ast.Attribute, ast.Call)) for node in ast.walk(condition)
    )


def problems_in(path: Path, root: Path | None = None) -> list[str]:
    """Every Python block of one page that is neither an include from src nor executed."""
    name = path.relative_to(root) if root else path
    issues: list[str] = []
    text = path.read_text()
    for n, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("<!--") and re.search(
            r"(skip|invisible-code|code-block):", stripped
        ):
            issues.append(
                f"{name}:{n}: Sybil directive in an HTML comment (leaks into the page); use '% ...'"
            )
        if re.match(r"^%\s*(invisible-code-block|invisible-code)", stripped):
            issues.append(
                f"{name}:{n}: invisible code block: "
                "examples may rely on nothing the reader can't see"
            )
        skip = SKIP.match(stripped)
        if skip and not GOOD_SKIP.match(skip.group("args").strip()):
            issues.append(
                f"{name}:{n}: skip must be 'next if(<condition>, reason=\"...\")', "
                f"got {skip.group('args')!r}"
            )
        elif skip and constant_condition(skip.group("args").strip()):
            issues.append(
                f"{name}:{n}: the skip condition is a constant, so the block never runs; "
                f"test something that can differ between machines, got {skip.group('args')!r}"
            )
    for block in blocks(path):
        info = block.info
        language = info.split()[0] if info else ""
        where = f"{name}:{block.line}"
        if language == "python":
            if re.search(r"^Traceback \(most recent call last\)", block.body, flags=re.M):
                issues.append(
                    f"{where}: a doctest that expects a traceback stops a reader's pasted script; "
                    "catch the error and show its message instead"
                )
            continue
        if language == SOURCE_DIRECTIVE:
            if not re.match(r"^\{trainopt-source\}\s+trainopt(\.\w+)+$", info):
                issues.append(
                    f"{where}: trainopt-source needs a dotted trainopt name, got {info!r}"
                )
            continue
        if language in PY_LANGS:
            issues.append(
                f"{where}: ```{language} block is neither executed nor included; use ```python"
            )
        elif re.match(
            r"^\{(code-block|code|sourcecode|code-cell)\}\s+(python|py|python3|pycon)\b", info
        ):
            issues.append(
                f"{where}: {info!r} is not executed by Sybil; use a plain ```python block"
            )
        elif re.match(r"^\{literalinclude\}\s+\S+\.py\b", info):
            issues.append(
                f"{where}: literalinclude of a .py file; use {{trainopt-source}} by object name"
            )
        elif language == "{eval-rst}" and re.search(
            r"code-block::\s*(python|py)|literalinclude::", block.body
        ):
            issues.append(f"{where}: Python inside eval-rst is not executed; use ```python")
    return issues


def audit(docs_dir: Path) -> list[str]:
    """Audit every page under ``docs_dir``; return the problems as ``file:line: message``."""
    docs_dir = Path(docs_dir)
    problems: list[str] = []
    for path in sorted(docs_dir.rglob("*.md")):
        if any(part.startswith("_") for part in path.relative_to(docs_dir).parts[:-1]):
            continue
        problems += problems_in(path, docs_dir)
    return problems


def source_includes(docs_dir: Path) -> list[tuple[str, str]]:
    """``(file:line, dotted name)`` of every ``trainopt-source`` block under ``docs_dir``."""
    found = []
    for path in sorted(Path(docs_dir).rglob("*.md")):
        for block in blocks(path):
            if block.info.startswith(SOURCE_DIRECTIVE):
                found.append((f"{path.relative_to(docs_dir)}:{block.line}", block.info.split()[1]))
    return found


# --------------------------------------------------------------------------------------------
# Each block alone: does a block run when a reader copies only it? If not, the page says what
# to run first, with a ``% needs: <what>`` comment above the block (shown on the page by
# ``trainopt_reading``).
# --------------------------------------------------------------------------------------------

NEEDS = re.compile(r"^%\s*needs:\s*(?P<what>.+?)\s*$")
LABEL = re.compile(r"^\([\w-]+\)=$")  # a MyST target, ``(lr-setup)=``, that names the next block


def needs_of(path: Path) -> dict[int, str]:
    """``{line of a block's opening fence: what to run first}``, from ``% needs:`` comments.

    The comment sits above the block; a skip comment, the block's own label (``(name)=``) and
    blank lines may come between.
    """
    found: dict[int, str] = {}
    pending: str | None = None
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        match = NEEDS.match(stripped)
        if match:
            pending = match.group("what")
        elif FENCE.match(line) and stripped.startswith("```python") and pending:
            found[number] = pending
            pending = None
        elif stripped and not stripped.startswith("%") and not LABEL.match(stripped):
            pending = None
    return found


@dataclass(frozen=True)
class Alone:
    """How one ``python`` block of a page fared when run alone."""

    line: int
    outcome: str  # "runs", "fails" or "skipped" (its skip condition holds on this machine)
    error: str = ""
    marked: str | None = None


def _code_of(block: Block) -> str:
    if re.search(r"^\s*>>> ", block.body, flags=re.M):
        from notebooks import doctest_as_code

        return doctest_as_code(block.body)
    return block.body


def run_alone(path: Path, timeout: float = 600) -> list[Alone]:
    """Run each ``python`` block of a page alone, as a reader who copies only that block.

    Each block runs in its own process, forked from one that has imported torch and nothing
    else of the page, in a fresh empty directory and an empty namespace. A block whose skip
    condition holds here (a GPU-only block on a CPU) is ``skipped``.
    """
    import json
    import os
    import subprocess
    import sys
    import tempfile

    page = [b for b in blocks(path) if b.info.split()[:1] == ["python"]]
    payload = [
        {"line": b.line, "code": _code_of(b), "skip": _skip_condition(b.skipped_by)} for b in page
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINOPT_REQUIRE_CUDA",)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    env["MPLBACKEND"] = "Agg"
    with tempfile.TemporaryDirectory(prefix="trainopt-alone-") as base:
        result = subprocess.run(
            [sys.executable, "-c", _FORK_EACH],
            input=json.dumps(payload),
            cwd=base,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
    if result.returncode != 0:
        raise RuntimeError(f"{path}: the block runner failed:\n{result.stderr[-3000:]}")
    outcomes = json.loads(result.stdout.strip().splitlines()[-1])
    needs = needs_of(path)
    return [Alone(o["line"], o["outcome"], o["error"], needs.get(o["line"])) for o in outcomes]


def _skip_condition(skip: str | None) -> str | None:
    if not skip:
        return None
    call = ast.parse(
        "f" + skip.strip().removeprefix("next").strip().removeprefix("if"), mode="eval"
    ).body
    return ast.unparse(call.args[0])


_FORK_EACH = r"""
import json, os, sys, tempfile, traceback
import torch  # imported once; each block runs in a process forked from here
blocks = json.load(sys.stdin)
base = os.getcwd()
results = []
for block in blocks:
    if block["skip"]:
        import importlib
        space = {"torch": torch}
        for name in ("sys", "os"):
            space[name] = importlib.import_module(name)
        try:
            skipped = bool(eval(block["skip"], space))
        except NameError:
            from trainopt.perf.distributed import fsdp2_available
            space["fsdp2_available"] = fsdp2_available
            skipped = bool(eval(block["skip"], space))
        if skipped:
            results.append({"line": block["line"], "outcome": "skipped", "error": ""})
            continue
    report = tempfile.NamedTemporaryFile(dir=base, delete=False, suffix=".txt").name
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            os.chdir(tempfile.mkdtemp(dir=base))
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            code = compile(block["code"], f"<block at line {block['line']}>", "exec")
            exec(code, {"__name__": "__main__"})
        except BaseException as error:
            with open(report, "w") as out:
                out.write(f"{type(error).__name__}: {error}"[:300])
            status = 1
        finally:
            sys.stdout.flush()
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    if os.path.getsize(report):
        error = open(report).read()
    else:
        error = "" if status == 0 else f"exit status {status}"
    outcome = "runs" if status == 0 else "fails"
    results.append({"line": block["line"], "outcome": outcome, "error": error})
print(json.dumps(results))
"""


def free_names(code: str) -> set[str]:
    """Names a block reads that it neither assigns, imports, defines nor gets from builtins: what
    it takes from the blocks above it. (Static, so it over-counts nothing a block defines itself
    and misses only what a block reads indirectly, such as a file an earlier block wrote.)"""
    import builtins

    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    defined, used = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            defined.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            defined.update(node.names)
    return used - defined - set(dir(builtins)) - {"__file__"}


def unmarked_dependents(path: Path, root: Path | None = None) -> list[str]:
    """Blocks that read names from the blocks above them and don't say what to run first."""
    name = path.relative_to(root) if root else path
    needs = needs_of(path)
    problems = []
    for block in blocks(path):
        if block.info.split()[:1] != ["python"] or block.line in needs:
            continue
        free = sorted(free_names(_code_of(block)))
        if free:
            problems.append(
                f"{name}:{block.line}: reads "
                f"{', '.join(free[:5])}{' ...' if len(free) > 5 else ''} "
                "from earlier blocks; put '% needs: <the block to run first>' above it"
            )
    return problems


def alone_problems(path: Path, results: list[Alone], root: Path | None = None) -> list[str]:
    """Blocks that fail alone and don't say what to run first."""
    name = path.relative_to(root) if root else path
    return [
        f"{name}:{r.line}: fails when copied alone ({r.error}); "
        "put '% needs: <the block to run first>' "
        "above it"
        for r in results
        if r.outcome == "fails" and not r.marked
    ]


def main(argv: list[str] | None = None) -> int:
    """``python docs/_ext/audit.py --alone [PAGE.md ...]``: each page's blocks run alone,
    counted."""
    import argparse

    parser = argparse.ArgumentParser(prog="python docs/_ext/audit.py")
    parser.add_argument(
        "--alone", action="store_true", help="run each python block alone and count"
    )
    parser.add_argument(
        "pages", nargs="*", type=Path, help="pages (default: every page under docs/)"
    )
    args = parser.parse_args(argv)
    docs = Path(__file__).resolve().parents[1]
    if not args.alone:
        problems = audit(docs)
        print("\n".join(problems) or "every python block is included or executed")
        return 1 if problems else 0
    pages = args.pages or [
        p
        for p in sorted(docs.rglob("*.md"))
        if not any(s.startswith("_") for s in p.relative_to(docs).parts)
    ]
    missing_total = 0
    for page in pages:
        page = page.resolve()
        results = run_alone(page)
        if not results:
            continue
        count = {k: sum(r.outcome == k for r in results) for k in ("runs", "fails", "skipped")}
        marked = sum(bool(r.marked) for r in results)
        missing = alone_problems(page, results, docs)
        missing_total += len(missing)
        print(
            f"{page.relative_to(docs)}: {len(results)} blocks; {count['runs']} run alone, "
            f"{count['fails']} "
            f"fail alone, {count['skipped']} skipped here; {marked} marked '% needs:'; "
            f"{len(missing)} need a marker"
        )
        for problem in missing:
            print("    " + problem)
    return 1 if missing_total else 0


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
