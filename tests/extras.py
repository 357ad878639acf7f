"""Optional dependencies of the tests: a reason to skip on a reader's machine, a failure in CI.

``require(name, extra)`` imports ``name`` and returns the module. Where it is missing, or its
import raises (a broken install: an ``ImportError`` from inside the package, or any other error),
the test is skipped with the reason and the extra that installs it; under CI (``CI`` set, as on
every CI service and in ``.ci/run``) it fails instead, as a missing Chromium or PostgreSQL does:
``make test`` installs every extra below, so a skip there would hide a test that never ran.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to anything but empty, 0 or false)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(name: str, extra: str) -> ModuleType:
    """The module ``name``; else a skip naming ``pip install 'trainopt[<extra>]'``; in CI, fail.

    Works at module level (the whole file skips, or fails to collect under CI), in a fixture
    and in a test.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name is None or not (name == error.name or name.startswith(f"{error.name}.")):
            why = f"{name} is installed but its import failed: {type(error).__name__}: {error}"
        else:
            why = f"{name} is not installed"
    except Exception as error:  # noqa: BLE001 - any error in the import is a broken install
        why = f"{name} is installed but its import failed: {type(error).__name__}: {error}"
    why += f" (pip install 'trainopt[{extra}]')"
    if in_ci():
        pytest.fail(f"CI must run these tests, but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)
