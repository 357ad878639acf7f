"""The integration runs are tiny: one CPU thread each, and no full garbage collection of the
imported frameworks (:mod:`tiny_runs`), set once per module after the frameworks are imported.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
from tiny_runs import one_thread


@pytest.fixture(autouse=True, scope="module")
def one_thread_and_a_frozen_heap() -> Iterator[None]:
    for module in ("transformers", "lightning", "accelerate"):
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
    if importlib.util.find_spec("transformers") is not None:
        from transformers import Trainer  # noqa: F401  (transformers imports it lazily: the bulk of its objects)
    with one_thread(freeze_heap=True):
        yield
