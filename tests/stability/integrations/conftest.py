"""The integration runs are tiny: one CPU thread each, and no full garbage collection of the
imported frameworks.

Two settings, restored after each module, make a run of the tiny models several times cheaper
without changing what a test compares (both runs of a comparison train under the same settings):

- one intra-op thread: a tiny matmul split over threads only waits for them (and ``make test``
  runs two workers on the cores);
- ``gc.freeze()`` once the frameworks are imported: the ``Trainer`` and Accelerate call
  ``gc.collect()`` at the end of each run, which otherwise walks every object of ``transformers``.
"""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread_and_a_frozen_heap() -> Iterator[None]:
    for module in ("transformers", "lightning", "accelerate"):
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module)
    if importlib.util.find_spec("transformers") is not None:
        from transformers import Trainer  # noqa: F401  (transformers imports it lazily: the bulk of its objects)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        torch.set_num_threads(threads)
