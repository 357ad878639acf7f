"""Fixtures shared by the test modules: the repository layout and one -W build of the site."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the whole site once with warnings as errors; return the HTML directory."""
    out = tmp_path_factory.mktemp("site") / "html"
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
         "-c", str(ROOT), str(DOCS), str(out)],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert result.returncode == 0, f"sphinx-build -W failed:\n{result.stdout}\n{result.stderr}"
    return out
