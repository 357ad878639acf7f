"""trainopt installs as a wheel that holds the library and the files its pages load, nothing else.

The wheel and its environment are the ``wheel_python`` fixture's (``tests/conftest.py``): built
from a copy of the package's files, installed into a fresh virtual environment with no path to the
test environment. ``tests/docs/test_notebooks.py`` runs every page's blocks in that environment;
here, what the wheel holds.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from extras import require

ROOT = Path(__file__).resolve().parents[1]

require("build", "test")  # the wheel is built with it


def test_the_wheel_carries_every_data_file(trainopt_wheel: Path) -> None:
    shipped = {
        p.relative_to(ROOT / "src").as_posix()
        for p in (ROOT / "src/trainopt/data").rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    }
    names = set(zipfile.ZipFile(trainopt_wheel).namelist())
    assert shipped and not shipped - names, f"not in the wheel: {sorted(shipped - names)}"


def test_the_installed_wheel_is_what_its_environment_imports(
    wheel_python: Path, tmp_path: Path
) -> None:
    """No path to the repository or the test environment: trainopt, and the digits, from the
    wheel."""
    code = (
        "import sys, trainopt, torch\nfrom trainopt.models import digits_data\n"
        "print(trainopt.__file__)\nprint(digits_data()[0].shape[0])\nprint(sys.path)"
    )
    run = subprocess.run(
        [str(wheel_python), "-I", "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    where, rows, path = run.stdout.splitlines()
    assert str(wheel_python.parents[1]) in where and str(ROOT) not in where, where
    assert rows == "1438" and str(ROOT) not in path, (rows, path)
