"""Opening the result database: URL defaults, driver mapping, SQLite connection setup, migrations.

Owns how an Engine is made. Every writer and reader goes through open_db(), so the schema is always at
Alembic head and SQLite connections always have foreign keys, WAL and real transactions.

There is no alembic.ini: alembic_config() builds the Config. A new revision after changing tables.py:
    TCPLAB_DB=sqlite:///scratch.db python -c "from alembic import command; \
      from orchestrator.storage.db import alembic_config, open_db; open_db(); \
      command.revision(alembic_config(), message='what changed', autogenerate=True)"
then review the generated file (tests/db/test_db_schema.py checks head == tables.metadata).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
DEFAULT_SQLITE_URL = "sqlite:///results/tcplab.db"

SQLITE_BEGIN_OPTION = "tcplab_sqlite_begin"
"""Execution option naming the BEGIN statement on SQLite; writers pass "BEGIN IMMEDIATE"."""

_MIGRATION_LOCK_KEY = 0x7463706C6162  # "tcplab": serialises concurrent open_db() on one PostgreSQL DB

# Every tcplab session on PostgreSQL runs without JIT. A query that prunes partitions only at run time (the
# run_key from a subquery) is planned, costed and JIT-compiled for every partition first: with 1,000 runs that
# compiled ~3,000 functions, 4.5 s (45 s with parallel workers), for a 3 ms scan
# (docs/ingest.md, "At campaign scale").
PG_SESSION_OPTIONS = "-c jit=off"


def default_db_url() -> str:
    """The database URL from env TCPLAB_DB, else a SQLite file results/tcplab.db under the CWD."""
    return os.environ.get("TCPLAB_DB") or DEFAULT_SQLITE_URL


def normalize_url(url: str | URL) -> URL:
    """Parse a URL and map driverless PostgreSQL URLs (postgresql://, postgres://) to psycopg 3."""
    if isinstance(url, str) and url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def sqlite_path(url: URL) -> Path | None:
    """The file behind a SQLite URL, or None for in-memory databases and non-SQLite URLs."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    return Path(database)


def alembic_config(connection: Any = None) -> Config:
    """An Alembic Config without an ini file; `connection` (if given) is the one migrations run on."""
    cfg = Config()
    # ConfigParser interpolation treats '%' specially; paths can contain it.
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    cfg.set_main_option("path_separator", "os")
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str | None:
    """The newest migration revision shipped with this code."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The migration revision the database is at (None if never migrated)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _install_sqlite_hooks(engine: Engine) -> None:
    """Let SQLAlchemy, not pysqlite, own transactions, and set per-connection pragmas.

    pysqlite's legacy mode neither wraps DDL in a transaction nor allows choosing BEGIN IMMEDIATE; the
    recipe from the SQLAlchemy SQLite docs turns its own handling off and emits BEGIN from the begin
    event. Writers ask for BEGIN IMMEDIATE so two ingesters queue on the busy timeout instead of
    failing with SQLITE_BUSY when a deferred read lock cannot be upgraded.
    """

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA foreign_keys = ON")
            cur.execute("PRAGMA journal_mode = WAL")
            # WAL with synchronous=NORMAL is durable against application crashes and much faster.
            cur.execute("PRAGMA synchronous = NORMAL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "BEGIN"))


def create_db_engine(url: str | URL | None = None) -> Engine:
    """An Engine for `url` (default: default_db_url()) with tcplab's connection setup, not migrated."""
    parsed = normalize_url(url if url is not None else default_db_url())
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(parsed)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"timeout": 30})
        _install_sqlite_hooks(engine)
        return engine
    return create_engine(parsed, pool_pre_ping=True, connect_args={"options": PG_SESSION_OPTIONS})


def writer(engine: Engine) -> Engine:
    """The engine with writer transactions: BEGIN IMMEDIATE on SQLite (see _install_sqlite_hooks)."""
    return engine.execution_options(**{SQLITE_BEGIN_OPTION: "BEGIN IMMEDIATE"})


def upgrade(engine: Engine) -> None:
    """Bring the database to Alembic head in one transaction (a no-op when already there)."""
    with writer(engine).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        command.upgrade(alembic_config(conn), "head")


class DatabaseMissing(ValueError):
    """A command that reads results was pointed at a SQLite file that does not exist (a typo would otherwise
    create an empty database and show an empty table)."""


def open_existing_db(url: str | URL | None = None) -> Engine:
    """open_db for the commands that only read: a SQLite file must exist already (DatabaseMissing)."""
    path = sqlite_path(normalize_url(url if url is not None else default_db_url()))
    if path is not None and not path.is_file():
        raise DatabaseMissing(f"no result database at {path} (give --db, or set TCPLAB_DB)")
    return open_db(url)


def open_db(url: str | URL | None = None) -> Engine:
    """Open (creating if needed) the result database at `url` and migrate it to head."""
    engine = create_db_engine(url)
    try:
        upgrade(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine
