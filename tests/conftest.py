"""Fixtures shared by the test modules: the repository layout and one -W build of the site.

The site is built once per run, also under pytest-xdist (``make test`` runs two workers): the
first worker to ask builds it into a folder all workers share, under a file lock, and records the
outcome next to it; every other worker waits for the lock and reads the same outcome, so a failed
build fails each test that needs it with the same Sphinx output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(ROOT / "tests"))  # extras, artifacts: the suite's helpers (importlib mode)


def shared_tmp_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this run that every xdist worker sees (the session's base temp dir without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(request.config, "workerinput") else base


@pytest.fixture(scope="session")
def built_site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the whole site once per run with warnings as errors; return the HTML directory."""
    shared = shared_tmp_path(request, tmp_path_factory)
    out = shared / "site" / "html"
    outcome = shared / "site" / "outcome.json"
    with FileLock(str(shared / "site.lock")):
        if not outcome.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            result = subprocess.run(
                [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
                 "-c", str(ROOT), str(DOCS), str(out)],
                capture_output=True, text=True, cwd=ROOT,
            )
            outcome.write_text(json.dumps(
                {"returncode": result.returncode, "stdout": result.stdout, "stderr": result.stderr}))
        built = json.loads(outcome.read_text())
    assert built["returncode"] == 0, f"sphinx-build -W failed:\n{built['stdout']}\n{built['stderr']}"
    return out
