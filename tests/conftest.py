"""Shared pytest fixtures for the whole test suite (one delimited section per owner)."""
from __future__ import annotations

# ===== PostgreSQL test database (owner: storage) ===================================================
# `pg_url` yields the SQLAlchemy URL of a fresh, empty database on the server named by
# TCPLAB_TEST_PG (an admin URL; default postgres@127.0.0.1:5432) and drops it afterwards, even when
# the test fails. With no server reachable, tests using it skip and say why.
import os
import secrets
from collections.abc import Iterator

import pytest

PG_ADMIN_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"


def _pg_admin_dsn() -> str:
    """The admin URL as libpq understands it (no SQLAlchemy driver suffix)."""
    from sqlalchemy.engine import make_url
    url = make_url(os.environ.get("TCPLAB_TEST_PG") or PG_ADMIN_DEFAULT)
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_admin_dsn() -> str:
    """libpq URL of the PostgreSQL admin database; skips (once per session) when unreachable."""
    import psycopg
    from sqlalchemy.engine import make_url
    dsn = _pg_admin_dsn()
    shown = make_url(dsn).render_as_string(hide_password=True)
    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL server not reachable at {shown} (set TCPLAB_TEST_PG to an admin URL): "
                    f"{str(exc).strip().splitlines()[0]}")
    return dsn


@pytest.fixture
def pg_url(pg_admin_dsn: str) -> Iterator[str]:
    """SQLAlchemy URL (postgresql+psycopg://...) of a throwaway database tcplab_test_<random>."""
    import psycopg
    from sqlalchemy.engine import make_url
    name = f"tcplab_test_{secrets.token_hex(6)}"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(pg_admin_dsn).set(drivername="postgresql+psycopg", database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        # FORCE ends sessions a failed test left open (engines not disposed, pooled connections).
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
# ===== end PostgreSQL test database ================================================================


# ===== fault-and-fuzz ledger (owner: security) =====================================================
# Tests that inject faults or fuzz inputs record into one session-wide ledger (tests/support/ledger.py);
# its summary line is printed at the end of every run, after the per-test lines.
from tests.support.ledger import Ledger  # noqa: E402

_LEDGER = Ledger()


@pytest.fixture(scope="session")
def ledger() -> Ledger:
    return _LEDGER


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _LEDGER.lines:
        return
    terminalreporter.section("fault and fuzz suite")
    for line in _LEDGER.lines:
        terminalreporter.write_line(line)
    terminalreporter.write_line(_LEDGER.summary())
# ===== end fault-and-fuzz ledger ===================================================================
