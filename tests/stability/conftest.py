"""Shared helpers of the stability tests live beside them (``optimizer_configs``): make them
importable.

The suite runs with ``--import-mode=importlib``, which puts no test folder on ``sys.path``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
