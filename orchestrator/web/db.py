"""Opening the result database read-only for `tcplab serve`.

SQLite: the file is opened with a `mode=ro` URI (the driver refuses every write; no migration, no pragma that
writes). PostgreSQL: every session starts with `default_transaction_read_only = on`, so every transaction is
READ ONLY and the server refuses a write. Nothing here migrates: a database behind the code's schema is an error
shown by the page, never changed by it.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL

from orchestrator.storage.db import default_db_url, normalize_url, sqlite_path


class ReadOnlyDbError(ValueError):
    """The database cannot be opened read-only (missing file, in-memory URL)."""


def sqlite_ro_uri(path: Path) -> str:
    """The sqlite3 URI opening `path` read-only."""
    return f"file:{quote(str(path.resolve()))}?mode=ro"


def open_readonly(url: str | URL | None = None) -> Engine:
    """An Engine that can only read the database at `url` (default: $TCPLAB_DB or results/tcplab.db)."""
    parsed = normalize_url(url if url is not None else default_db_url())
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(parsed)
        if path is None:
            raise ReadOnlyDbError(f"{parsed}: serve needs a database file, not an in-memory database")
        if not path.is_file():
            raise ReadOnlyDbError(f"{path}: no such database file")
        uri = sqlite_ro_uri(path)
        engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, timeout=30,
                                                                             check_same_thread=False))

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record) -> None:
            dbapi_conn.execute("PRAGMA query_only = ON")     # a second lock: no statement may write

        return engine
    return create_engine(parsed, pool_pre_ping=True,
                         connect_args={"options": "-c default_transaction_read_only=on"})
