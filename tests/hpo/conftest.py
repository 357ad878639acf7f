"""Make the helper modules of tests/hpo/ (``storages``) importable by the test modules.

The suite runs with ``--import-mode=importlib``, which puts no test folder on ``sys.path``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
