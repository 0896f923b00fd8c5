"""Fixtures for the result-database tests: a migrated DB per backend and realistic RunIngest data.

`db_url` runs a test once on SQLite (a file under tmp_path) and once on PostgreSQL (marked
`postgres`, a throwaway database from the root conftest's pg_url).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from dbdata import make_run_ingest
from sqlalchemy import Engine

from orchestrator.storage.db import open_db
from orchestrator.storage.run_ingest import RunIngest


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/results/tcplab.db"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/results/tcplab.db"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = open_db(db_url)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def make_ingest() -> Callable[..., RunIngest]:
    return make_run_ingest
