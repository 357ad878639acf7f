"""``import trainopt.stability`` needs none of the frameworks; the integrations import theirs
lazily.

One fresh interpreter answers both questions (it imports ``trainopt.stability`` first, notes what
is loaded, then imports the integrations): an interpreter start with torch costs seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

FRAMEWORKS = {"transformers", "lightning", "pytorch_lightning", "accelerate"}
PROBE = """
import json, sys
import trainopt.stability
after_stability = [m for m in sys.modules if 'integrations' in m]
import trainopt.stability.integrations.hf, trainopt.stability.integrations.lightning
import trainopt.stability.integrations.accelerate, trainopt.stability.integrations.tiny
top_level = sorted({n.split('.')[0] for n in sys.modules})
print(json.dumps({"after_stability": after_stability, "top_level": top_level}))
"""


@pytest.fixture(scope="module")
def loaded() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.splitlines()[-1])


def test_importing_stability_and_its_integrations_loads_no_framework(loaded: dict) -> None:
    assert not set(loaded["top_level"]) & FRAMEWORKS, sorted(set(loaded["top_level"]) & FRAMEWORKS)


def test_the_stability_package_does_not_import_its_integrations(loaded: dict) -> None:
    assert loaded["after_stability"] == []
