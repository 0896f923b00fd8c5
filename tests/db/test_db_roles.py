"""`tcplab db init` roles on PostgreSQL (orchestrator/storage/roles.py): the reader can read everything, tables,
views and a run's partitions created after init, and can change nothing; the writer can ingest."""
from __future__ import annotations

import secrets
from collections.abc import Iterator

import psycopg
import pytest
from dbdata import make_run_ingest
from sqlalchemy.engine import make_url

from orchestrator.storage.db import open_db
from orchestrator.storage.roles import Roles, RolesError, grant_statements, init_roles
from orchestrator.storage.writer import write_run

pytestmark = pytest.mark.postgres


def _as(url: str, role: str, password: str) -> str:
    return make_url(url).set(username=role, password=password).render_as_string(hide_password=False)


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def roles(pg_url: str) -> Iterator[Roles]:
    tag = secrets.token_hex(4)
    env = {"TCPLAB_WRITER_PASSWORD": "w-" + tag, "TCPLAB_READER_PASSWORD": "r-" + tag}
    made = Roles.checked(f"tcplab_w_{tag}", f"tcplab_r_{tag}", env)
    open_db(pg_url).dispose()
    try:
        yield made
    finally:   # roles are per cluster: drop them while their database still exists
        with psycopg.connect(_libpq(pg_url), autocommit=True) as admin:
            for role in (made.writer, made.reader):
                if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                    admin.execute(f"REASSIGN OWNED BY {role} TO CURRENT_USER")
                    admin.execute(f"DROP OWNED BY {role}")
                    admin.execute(f"DROP ROLE {role}")


def test_reader_reads_everything_and_changes_nothing(pg_url, roles) -> None:
    first = init_roles(pg_url, roles)
    assert first.created == (roles.writer, roles.reader) and first.owned > 20
    again = init_roles(pg_url, roles)                          # idempotent
    assert again.created == () and again.owned == 0

    writer_url = _as(pg_url, roles.writer, roles.writer_password)
    eng = open_db(writer_url)                                   # the writer migrates (a no-op) and ingests
    try:
        counts = write_run(eng, make_run_ingest("ro-0001", n_packets=2_000))
    finally:
        eng.dispose()
    assert counts.packet == 2_000

    with psycopg.connect(_libpq(_as(pg_url, roles.reader, roles.reader_password)), autocommit=True) as reader:
        key = reader.execute("SELECT run_key FROM run").fetchone()[0]
        for sql in ("SELECT count(*) FROM run", "SELECT count(*) FROM packet", "SELECT count(*) FROM v_run",
                    "SELECT count(*) FROM v_run_qdelay", "SELECT count(*) FROM v_campaign_trend",
                    f"SELECT count(*) FROM tcplab_part.packet_block_{key}"):   # a partition made after init
            assert reader.execute(sql).fetchone()[0] >= 0, sql
        assert reader.execute("SELECT count(*) FROM packet").fetchone()[0] == 2_000
        # the session default is read-only; turned off, the missing grants still refuse every change
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            reader.execute("DELETE FROM run")
        reader.execute("SET default_transaction_read_only = off")
        for sql in ("INSERT INTO plan (plan_sha256, name, path, text, created_at) VALUES ('x', 'x', 'x', 'x', now())",
                    "UPDATE run SET status = 'failed'", "DELETE FROM run",
                    f"DELETE FROM tcplab_part.packet_block_{key}",
                    "CREATE TABLE mine (x int)", "CREATE TABLE tcplab_part.mine (x int)",
                    "CREATE VIEW v_mine AS SELECT 1", "DROP VIEW v_run", "TRUNCATE packet_block"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.execute(sql)
        assert reader.execute("SELECT status FROM run").fetchone()[0] == "complete"


def test_bad_role_names_and_sqlite_are_refused_clearly(tmp_path) -> None:
    with pytest.raises(RolesError, match="--writer 'Robert; DROP'"):
        Roles.checked("Robert; DROP", "r", {})
    with pytest.raises(RolesError, match="--writer and --reader are both"):
        Roles.checked("same", "same", {})
    with pytest.raises(RolesError, match="roles need PostgreSQL; a SQLite database has none"):
        init_roles(f"sqlite:///{tmp_path}/x.db", Roles())


def test_grants_name_both_schemas_and_default_privileges() -> None:
    text = "\n".join(s.as_string(None) for s in grant_statements("db", Roles("w", "r")))
    assert 'ALTER DEFAULT PRIVILEGES FOR ROLE "w" IN SCHEMA "public", "tcplab_part" GRANT SELECT ON TABLES TO "r"' \
        in text
    assert "INSERT" not in text and "UPDATE" not in text
