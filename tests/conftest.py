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
sys.path.insert(0, str(DOCS / "_lib"))  # the site's workshop (trainopt_site)
sys.path.insert(0, str(ROOT / "tests"))  # extras, artifacts: the suite's helpers (importlib mode)


def shared_tmp_path(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A folder of this run that every xdist worker sees (the session's base temp dir without
    xdist)."""
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
                [
                    sys.executable,
                    "-m",
                    "sphinx",
                    "-b",
                    "html",
                    "-W",
                    "--keep-going",
                    "-q",
                    "-c",
                    str(ROOT),
                    str(DOCS),
                    str(out),
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            outcome.write_text(
                json.dumps(
                    {
                        "returncode": result.returncode,
                        "stdout": result.stdout,
                        "stderr": result.stderr,
                    }
                )
            )
        built = json.loads(outcome.read_text())
    assert built["returncode"] == 0, (
        f"sphinx-build -W failed:\n{built['stdout']}\n{built['stderr']}"
    )
    return out


def landing_page_extras() -> list[str]:
    """The extras the landing page's install section names (``pip install ".[hpo]"`` and so on)."""
    import re

    section = (DOCS / "index.md").read_text().split("## Use trainopt in your project", 1)[1]
    section = section.split("\n## ", 1)[0]
    names = set()
    for match in re.finditer(r"pip install \"?\.\[([\w,\-]+)\]", section):
        names.update(match.group(1).split(","))
    return sorted(names)


WHEEL_VENV_USERS = (
    "tests/docs/test_notebooks.py::test_the_notebook_runs",
    "tests/test_install.py::",
)
"""Node ids (prefixes) of the tests that use :func:`wheel_python`: where a run collects one, the
xdist controller builds the environment in the background from the start (see
:func:`pytest_xdist_node_collection_finished`)."""


def build_wheel_venv(shared: Path) -> dict:
    """Build :func:`wheel_python`'s environment under ``shared`` once (under a file lock, whoever
    asks first) and return the outcome: ``ok``, the build's ``log``, ``extras`` and ``wheel``."""
    import shutil

    import torch

    venv, outcome = shared / "wheel-venv", shared / "wheel-venv.json"
    with FileLock(str(shared / "wheel-venv.lock")):
        if not outcome.exists():
            log: list[str] = []

            def run(*args: str) -> bool:
                result = subprocess.run(list(args), capture_output=True, text=True, timeout=1200)
                log.append(f"$ {' '.join(args)}\n{result.stdout[-2000:]}{result.stderr[-4000:]}")
                return result.returncode == 0

            source, dist = shared / "wheel-source", shared / "wheel-dist"
            shutil.copytree(
                ROOT / "src",
                source / "src",
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
            )
            for name in ("pyproject.toml", "README.md"):
                shutil.copy(ROOT / name, source / name)
            python = venv / "bin" / "python"
            extras = ",".join(landing_page_extras())
            ok = (
                run(
                    sys.executable,
                    "-m",
                    "build",
                    "--wheel",
                    "--no-isolation",
                    "--outdir",
                    str(dist),
                    str(source),
                )
                and run(sys.executable, "-m", "venv", str(venv))
                and run(
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-compile",
                    f"torch=={torch.__version__.split('+')[0]}",
                )
            )
            wheels = sorted(dist.glob("trainopt-*.whl"))
            ok = (
                ok
                and bool(wheels)
                and run(
                    str(python),
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-compile",
                    f"{wheels[0]}[{extras}]" if extras else str(wheels[0]),
                    "ipykernel",
                )
            )
            ok = ok and run(
                str(python),
                "-m",
                "ipykernel",
                "install",
                "--prefix",
                str(venv),
                "--name",
                "trainopt-wheel",
            )
            outcome.write_text(
                json.dumps(
                    {
                        "ok": ok,
                        "log": "\n".join(log),
                        "extras": extras,
                        "wheel": str(wheels[0]) if wheels else None,
                    }
                )
            )
        return json.loads(outcome.read_text())


_BACKGROUND: list = []  # the controller's background build (a thread), joined at the session end


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """On the xdist controller: where the run holds a test that needs :func:`wheel_python`, start
    building its environment now, in a thread of this otherwise idle process.

    Built lazily instead, the first worker to need it would spend minutes in pip while the other
    worker, reaching a notebook test of its own, waits on the lock. The workers' fixture takes the
    lock and reads the same outcome.
    """
    if _BACKGROUND or not any(i.startswith(WHEEL_VENV_USERS) for i in ids):
        return
    import threading

    base = node.config._tmp_path_factory.getbasetemp()  # the workers' basetemp is below it
    thread = threading.Thread(target=build_wheel_venv, args=(base,), daemon=True)
    thread.start()
    _BACKGROUND.append(thread)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for thread in _BACKGROUND:
        thread.join()


@pytest.fixture(scope="session")
def wheel_python(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The interpreter of a fresh virtual environment holding trainopt's wheel and nothing of ours.

    Built once per run (shared by the xdist workers under a lock): the wheel from a copy of the
    package's files, a ``venv`` with no path to the test environment, the test environment's
    torch version (a CPU build from the local wheel store on the project's machines), then the
    wheel with exactly the extras the landing page's install section names, and ``ipykernel``
    (the notebook tests' kernel). ``--no-compile``: pip does not byte-compile the thousands of
    modules of torch and the extras (two thirds of the install's time); Python compiles those a
    kernel imports, once. Where the environment cannot be made (no package index in reach) the
    tests that need it skip, and fail under CI.
    """
    shared = shared_tmp_path(request, tmp_path_factory)
    built = build_wheel_venv(shared)
    if not built["ok"]:
        from extras import in_ci

        message = (
            f"no virtual environment with trainopt's wheel could be made:\n{built['log'][-6000:]}"
        )
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return shared / "wheel-venv" / "bin" / "python"


@pytest.fixture(scope="session")
def trainopt_wheel(wheel_python: Path) -> Path:
    """The wheel that :func:`wheel_python`'s environment holds."""
    return Path(json.loads((wheel_python.parents[2] / "wheel-venv.json").read_text())["wheel"])
