"""``TRAINOPT_BUILT_SITE=<html dir>`` makes the browser tests reuse a site already built from this
tree (to iterate on them without a 2-minute build). Unset, they use the session's one ``-W`` build
of ``tests/conftest.py``, shared with the other docs tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PREBUILT = os.environ.get("TRAINOPT_BUILT_SITE")

if PREBUILT:

    @pytest.fixture(scope="session")
    def built_site() -> Path:
        path = Path(PREBUILT)
        assert (path / "index.html").is_file(), (
            f"TRAINOPT_BUILT_SITE={PREBUILT} holds no built site"
        )
        return path
