"""Two gloo ranks agree when rank 0 alone sees a NaN batch: the Hugging Face Trainer, Lightning and
Accelerate.

One launch of 2 ranks runs every installed framework in turn (:func:`rank_runs`), instead of a
launch per framework: the processes, and their imports of torch, start once.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from trainopt.perf.distributed.processes import launch
from trainopt_site.stability.integrations.checks import rank_runs

# framework -> (the modules it needs, the extra that installs them)
FRAMEWORKS = {
    "hf": (("transformers", "accelerate"), "trainopt[hf]"),
    "lightning": (("lightning",), "trainopt[lightning]"),
    "accelerate": (("accelerate",), "trainopt[hf]"),
}
INSTALLED = [
    name
    for name, (modules, _) in FRAMEWORKS.items()
    if all(importlib.util.find_spec(m) is not None for m in modules)
]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    if not INSTALLED:
        pytest.skip("needs trainopt[hf] or trainopt[lightning]")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(
            "OMP_NUM_THREADS", "1"
        )  # the spawned ranks inherit it: 2 ranks share the cores
        return launch(
            rank_runs,
            2,
            INSTALLED,
            str(tmp_path_factory.mktemp("ranks")),
            backend="gloo",
            timeout=300,
            collective_timeout=30,
        )


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_two_gloo_ranks_agree_when_one_rank_sees_a_nan_batch(
    ranks: list[dict], framework: str
) -> None:
    if framework not in INSTALLED:
        pytest.skip(f"needs {FRAMEWORKS[framework][1]}")
    first, second = ranks[0][framework], ranks[1][framework]
    assert (
        torch.equal(first["weights"], second["weights"]) and torch.isfinite(first["weights"]).all()
    )
    assert first["skipped"] == second["skipped"] >= 1
