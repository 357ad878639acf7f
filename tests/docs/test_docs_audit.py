"""The one rule of the site: every Python block is included from src/ or executed by Sybil."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from artifacts import record
from audit import (
    alone_problems,
    audit,
    problems_in,
    run_alone,
    source_includes,
    unmarked_dependents,
)
from trainopt_docs import source_with_imports

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_every_python_block_is_included_or_executed() -> None:
    problems = audit(DOCS)
    assert not problems, "blocks that are neither executed nor included:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "snippet, message",
    [
        ("```py\nprint(1)\n```\n", "neither executed nor included"),
        ("```{code-block} python\nprint(1)\n```\n", "not executed by Sybil"),
        ("```{literalinclude} ../src/trainopt/models.py\n```\n", "literalinclude"),
        ("% skip: next\n\n```python\nprint(1)\n```\n", "skip must be"),
        ("<!-- skip: next -->\n```python\nprint(1)\n```\n", "HTML comment"),
        ("% invisible-code-block: python\n", "invisible code block"),
        ("```{trainopt-source} models.GPT\n```\n", "dotted trainopt name"),
        (
            "```python\n>>> 1/0\nTraceback (most recent call last):\nZeroDivisionError: x\n```\n",
            "traceback",
        ),
    ],
)
def test_audit_names_file_and_line_of_each_bad_block(
    tmp_path: Path, snippet: str, message: str
) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nText.\n\n" + snippet)
    problems = problems_in(page, tmp_path)
    assert len(problems) == 1 and problems[0].startswith("page.md:5:") and message in problems[0], (
        problems
    )


@pytest.mark.parametrize(
    "condition",
    [
        "True",
        "1",
        "not False",
        "1 > 0",
        "(True)",
        "True or False",
        "'yes'",
        "[0]",
    ],
)
def test_audit_rejects_an_always_true_skip_condition(tmp_path: Path, condition: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        f'# Title\n\nText.\n\n% skip: next if({condition}, reason="needs CUDA")\n\n'
        "```python\nprint(1)\n```\n"
    )
    problems = problems_in(page, tmp_path)
    assert (
        len(problems) == 1 and problems[0].startswith("page.md:5:") and "constant" in problems[0]
    ), problems


@pytest.mark.parametrize(
    "condition",
    [
        "not torch.cuda.is_available()",
        "torch.cuda.device_count() < 2",
        "sys.platform == 'win32'",
        "not HAS_CUDA",
    ],
)
def test_audit_accepts_a_skip_condition_that_reads_the_machine(
    tmp_path: Path, condition: str
) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        f'# T\n\n% skip: next if({condition}, reason="needs CUDA")\n\n```python\nx = 1\n```\n'
    )
    assert problems_in(page, tmp_path) == []


def test_audit_accepts_executed_skipped_with_reason_and_included_blocks(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# T\n\n```python\nimport torch\n```\n\n"
        '% skip: next if(not torch.cuda.is_available(), reason="needs CUDA")\n\n'
        "```python\nx = 1\n```\n\n```{trainopt-source} trainopt.models.GPT\n```\n"
    )
    assert problems_in(page, tmp_path) == []


def test_site_shows_implementations_by_include() -> None:
    assert len(source_includes(DOCS)) > 0


def _run_fresh(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT.parent,
        env=env,
        timeout=300,
    )


EACH_IN_A_FRESH_NAMESPACE = r"""
import json, sys, traceback
failed = []
for where, code in json.load(sys.stdin):
    try:
        exec(compile(code, where, "exec"), {"__name__": "__main__"})
    except BaseException:
        failed.append(where + ":\n" + traceback.format_exc()[-1500:])
print(json.dumps(failed))
"""


def test_every_included_implementation_runs_when_copied() -> None:
    """Copying an implementation block gives code that runs alone: each in a fresh namespace of
    one fresh interpreter (started outside the repository), so a missing import fails."""
    includes = source_includes(DOCS)
    payload = [[f"{where} ({name})", source_with_imports(name)] for where, name in includes]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", EACH_IN_A_FRESH_NAMESPACE],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        cwd=ROOT.parent,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    failures = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(payload) > 50 and not failures, "\n\n".join(failures)


def test_copied_implementation_fails_without_its_imports() -> None:
    """The check above can fail: the same source stripped of its imports does not run."""
    code = source_with_imports("trainopt.models.synthetic_batch")
    body = code[code.index("def synthetic_batch") :] + "\nsynthetic_batch(GPTConfig(), 2, 4)\n"
    result = _run_fresh(body)
    assert result.returncode != 0 and "NameError" in result.stderr


# Pages whose blocks each run when copied alone or say what to run first (``% needs: ...``).
# A page joins once it has its markers; ``python docs/_ext/audit.py --alone`` lists what is missing.
ALONE_ENFORCED = [
    "guides/training-optimization/learning-rate-scheduling.md",
    "guides/training-optimization/hyperparameter-optimization.md",
    "concepts/optimization.md",
    "advanced/performance/benchmarking.md",
]


READER_PAGES = sorted(
    p.relative_to(DOCS).as_posix()
    for p in DOCS.rglob("*.md")
    if not any(part.startswith("_") for part in p.relative_to(DOCS).parts)
    and p.relative_to(DOCS).parts[0] != "reference"
)


@pytest.mark.parametrize("page", READER_PAGES)
def test_each_block_that_reads_earlier_names_says_what_to_run_first(page: str) -> None:
    """Static, on every page: a block that reads a name it doesn't define (``digits_mlp``,
    ``torch``) carries a ``% needs:`` line. The pages below also run each block alone."""
    assert not unmarked_dependents(DOCS / page, DOCS), "\n".join(
        unmarked_dependents(DOCS / page, DOCS)
    )


def test_the_static_check_finds_a_block_that_reads_an_earlier_name(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# T\n\n```python\nimport torch\nx = torch.ones(2)\n```\n\n```python\n"
        "def f(a):\n    return a + x\n\nprint([f(i) for i in range(2)], len(x))\n```\n"
    )
    assert [p.split(": ", 1)[1] for p in unmarked_dependents(page)] == [
        "reads x from earlier blocks; put '% needs: <the block to run first>' above it"
    ]
    page.write_text(
        page.read_text().replace(
            "\n\n```python\ndef", "\n\n% needs: the first block\n```python\ndef"
        )
    )
    assert unmarked_dependents(page) == []


@pytest.mark.parametrize("page", ALONE_ENFORCED)
def test_each_block_runs_alone_or_says_what_to_run_first(page: str) -> None:
    results = run_alone(DOCS / page)
    counts = {k: sum(r.outcome == k for r in results) for k in ("runs", "fails", "skipped")}
    _record_alone(
        page, {**counts, "marked": sum(bool(r.marked) for r in results), "blocks": len(results)}
    )
    problems = alone_problems(DOCS / page, results, DOCS)
    assert results and not problems, "\n".join(problems)


def _record_alone(page: str, value: dict) -> None:
    record("blocks-alone.json", page, value)  # under a lock: see artifacts.py


def test_the_alone_check_finds_a_block_that_needs_an_earlier_one(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# T\n\n```python\nx = 1\n```\n\n```python\nassert x == 1\n```\n\n"
        "% needs: the first block\n\n```python\nassert x + 1 == 2\n```\n\n"
        "```python\nimport math\nassert math.pi > 3\n```\n"
    )
    results = run_alone(page)
    assert [(r.outcome, r.marked) for r in results] == [
        ("runs", None),
        ("fails", None),
        ("fails", "the first block"),
        ("runs", None),
    ]
    problems = alone_problems(page, results, tmp_path)
    assert (
        len(problems) == 1 and problems[0].startswith("page.md:7:") and "NameError" in problems[0]
    )
