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
    inner = args[len("next"):].strip()
    try:
        call = ast.parse(inner.replace("if(", "_skip(", 1), mode="eval").body
        condition = call.args[0]
    except (SyntaxError, AttributeError, IndexError):
        return True
    return not any(isinstance(node, (ast.Name, ast.Attribute, ast.Call))
                   for node in ast.walk(condition))


def problems_in(path: Path, root: Path | None = None) -> list[str]:
    """Every Python block of one page that is neither an include from src nor executed."""
    name = path.relative_to(root) if root else path
    issues: list[str] = []
    text = path.read_text()
    for n, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("<!--") and re.search(r"(skip|invisible-code|code-block):", stripped):
            issues.append(f"{name}:{n}: Sybil directive in an HTML comment (leaks into the page); use '% ...'")
        if re.match(r"^%\s*(invisible-code-block|invisible-code)", stripped):
            issues.append(f"{name}:{n}: invisible code block: examples may rely on nothing the reader can't see")
        skip = SKIP.match(stripped)
        if skip and not GOOD_SKIP.match(skip.group("args").strip()):
            issues.append(
                f"{name}:{n}: skip must be 'next if(<condition>, reason=\"...\")', got {skip.group('args')!r}"
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
                    "catch the error and show its message instead")
            continue
        if language == SOURCE_DIRECTIVE:
            if not re.match(r"^\{trainopt-source\}\s+trainopt(\.\w+)+$", info):
                issues.append(f"{where}: trainopt-source needs a dotted trainopt name, got {info!r}")
            continue
        if language in PY_LANGS:
            issues.append(f"{where}: ```{language} block is neither executed nor included; use ```python")
        elif re.match(r"^\{(code-block|code|sourcecode|code-cell)\}\s+(python|py|python3|pycon)\b", info):
            issues.append(f"{where}: {info!r} is not executed by Sybil; use a plain ```python block")
        elif re.match(r"^\{literalinclude\}\s+\S+\.py\b", info):
            issues.append(f"{where}: literalinclude of a .py file; use {{trainopt-source}} by object name")
        elif language == "{eval-rst}" and re.search(r"code-block::\s*(python|py)|literalinclude::", block.body):
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
