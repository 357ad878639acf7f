"""The settings under which the suite's tiny CPU runs are cheap: one intra-op thread and, where
frameworks are imported, a frozen heap.

- One intra-op thread: a tiny matmul split over threads only waits for them, and ``make test``
  runs two workers on the machine's cores (60 times slower was seen on 2 cores).
- ``gc.freeze()`` once the frameworks are imported: the Hugging Face ``Trainer`` and Accelerate
  call ``gc.collect()`` at the end of each run, which otherwise walks every object of
  ``transformers``.

Neither changes what a test compares: both runs of a comparison train under the same settings.
Both are put back when the block ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def one_thread(*, freeze_heap: bool = False) -> Iterator[None]:
    """One intra-op thread (and, with ``freeze_heap``, ``gc.freeze()``) inside the block."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if freeze_heap:
        gc.freeze()
    try:
        yield
    finally:
        if freeze_heap:
            gc.unfreeze()
        torch.set_num_threads(threads)
