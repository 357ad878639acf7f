"""trainopt installs as a wheel and runs a page's examples with nothing of the repository in sight.

The wheel is built with ``python -m build`` from a copy of the package's files (so the shared tree
gets no ``build/`` folder), installed into a fresh virtual environment, and the learning-rate
page's blocks run, in page order, as one script in an empty directory with that interpreter.
The new environment reaches the test environment's torch, numpy and PyYAML through a path entry
(no download), not its editable install of trainopt: ``trainopt`` must come from the wheel.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from audit import blocks
from extras import require
from notebooks import doctest_as_code

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs/guides/training-optimization/learning-rate-scheduling.md"

require("build", "test")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    dist = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist),
                             str(source)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (built,) = dist.glob("trainopt-*.whl")
    return built


def test_the_wheel_carries_every_data_file(wheel: Path) -> None:
    shipped = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src/trainopt/data").rglob("*")
               if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    names = set(zipfile.ZipFile(wheel).namelist())
    assert shipped and not shipped - names, f"not in the wheel: {sorted(shipped - names)}"


def _page_script(page: Path) -> str:
    """The page's python blocks in order, each skipped where its Sybil skip condition holds."""
    parts = []
    for block in blocks(page):
        if block.info.split()[:1] != ["python"]:
            continue
        code = doctest_as_code(block.body) if block.body.lstrip().startswith(">>>") else block.body
        if block.skipped_by:
            call = ast.parse("f" + block.skipped_by.strip().removeprefix("next").strip().removeprefix("if"),
                             mode="eval").body
            code = f"if not ({ast.unparse(call.args[0])}):\n" + "\n".join("    " + line for line in code.splitlines())
        parts.append(code)
    return "\n\n".join(parts) + "\n\nimport trainopt\nprint('trainopt from', trainopt.__file__)\n"


@pytest.mark.slow
def test_the_installed_wheel_runs_a_page_from_an_empty_directory(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # torch & co. from the test environment, by path: its .pth files (the editable trainopt) are not read
    (site / "test_environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    result = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                             "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRAINOPT_REQUIRE_CUDA")}
    env["MPLBACKEND"] = "Agg"
    run = subprocess.run([str(python), "-"], input=_page_script(PAGE), capture_output=True, text=True,
                         cwd=empty, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    where = run.stdout.strip().splitlines()[-1]
    assert where.startswith("trainopt from ") and str(venv) in where and str(ROOT) not in where, where
