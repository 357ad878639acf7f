"""The storage URLs the multi-worker HPO tests run on: SQLite, the journal file and PostgreSQL."""

from __future__ import annotations

import os
from pathlib import Path

import optuna
import pytest
from extras import in_ci

from trainopt.hpo import open_storage

POSTGRES_URL = os.environ.get("TRAINOPT_POSTGRES_URL", "")


def storage_urls(stem: str):
    """A fixture giving a URL of each kind; its PostgreSQL studies (named ``<stem>-...``) are
    deleted after."""

    @pytest.fixture(params=["sqlite", "journal", "postgresql"])
    def url(request: pytest.FixtureRequest, tmp_path: Path):
        if request.param == "sqlite":
            yield f"sqlite:///{tmp_path / f'{stem}.db'}"
        elif request.param == "journal":
            yield f"journal:{tmp_path / f'{stem}.log'}"
        else:
            if not POSTGRES_URL:
                if in_ci():
                    pytest.fail(
                        "CI is set but TRAINOPT_POSTGRES_URL is not: .ci/run must start PostgreSQL"
                    )
                pytest.skip("no PostgreSQL server: set TRAINOPT_POSTGRES_URL (.ci/run starts one)")
            yield POSTGRES_URL
            storage = open_storage(POSTGRES_URL, heartbeat=None)
            for study in storage.get_all_studies():
                if study.study_name.startswith(f"{stem}-"):
                    optuna.delete_study(study_name=study.study_name, storage=storage)

    return url
