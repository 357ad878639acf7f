"""``import trainopt.stability`` needs none of the frameworks; the integrations import theirs lazily."""

from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = {"transformers", "lightning", "pytorch_lightning", "accelerate"}


def _loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{n.split('.')[0] for n in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_importing_stability_and_its_integrations_loads_no_framework() -> None:
    loaded = _loaded_after("import trainopt.stability, trainopt.stability.integrations.hf, "
                           "trainopt.stability.integrations.lightning, trainopt.stability.integrations.accelerate, "
                           "trainopt.stability.integrations.checks")
    assert not loaded & FRAMEWORKS, sorted(loaded & FRAMEWORKS)


def test_the_stability_package_does_not_import_its_integrations() -> None:
    code = "import trainopt.stability\nimport sys\nprint([m for m in sys.modules if 'integrations' in m])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().replace("'", '"')) == []
