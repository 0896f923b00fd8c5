"""Read-only ad-hoc SQL against the result database (`tcplab query`), and formatting of the answer.

Owns the guarantee that a query cannot change the database: SQLite is opened with a `mode=ro` URI,
PostgreSQL runs one prepared statement (so no `;`-chained second statement) in a READ ONLY transaction
on a session whose default is read-only too, and always rolls back. This protects against mistakes,
not against a hostile user: give those a PostgreSQL role without write grants.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import sqlite3
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg

from orchestrator.storage.db import PG_SESSION_OPTIONS, default_db_url, normalize_url, sqlite_path


class QueryError(RuntimeError):
    """A query that could not run: missing database, write attempt, SQL error. Message is for users."""


Params = Mapping[str, Any]


def _sqlite_query(path: Path, sql: str, params: Params | None) -> tuple[list[str], list[tuple]]:
    if not path.is_file():
        raise QueryError(f"no SQLite database at {path}")
    # as_uri() percent-escapes the path, so names containing '?' or '#' still open the right file.
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        cur = conn.execute(sql, dict(params)) if params is not None else conn.execute(sql)
        columns = [d[0] for d in cur.description or ()]
        return columns, cur.fetchall()
    except sqlite3.OperationalError as exc:
        if "readonly" in str(exc):
            raise QueryError(f"refused: the database is opened read-only ({exc})") from exc
        raise QueryError(f"SQL error: {exc}") from exc
    except sqlite3.Error as exc:  # includes "You can only execute one statement at a time."
        raise QueryError(f"SQL error: {exc}") from exc
    finally:
        conn.close()


def _pg_query(url: str, sql: str, params: Params | None) -> tuple[list[str], list[tuple]]:
    try:
        conn = psycopg.connect(url, options=f"-c default_transaction_read_only=on {PG_SESSION_OPTIONS}",
                               connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise QueryError(f"cannot connect: {exc}") from exc
    try:
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION READ ONLY")
            # A prepared statement holds exactly one command: "...; COMMIT; DELETE ..." is refused.
            if params is None:
                cur.execute(sql, prepare=True)  # no params, so '%' in the SQL is not a placeholder
            else:   # `:name` placeholders as psycopg's %(name)s, a literal '%' doubled (SQLAlchemy's compiler)
                cur.execute(str(text(sql).compile(dialect=pg_psycopg.dialect())), dict(params), prepare=True)
            columns = [d.name for d in cur.description or ()]
            rows = [tuple(r) for r in cur.fetchall()] if cur.description else []
        return columns, rows
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        raise QueryError(f"refused: queries are read-only ({exc.diag.message_primary})") from exc
    except psycopg.Error as exc:
        raise QueryError(f"SQL error: {exc}".rstrip()) from exc
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()
        conn.close()


def run_query(url: str | None, sql: str, params: Params | None = None) -> tuple[list[str], list[tuple]]:
    """Run one read-only SQL statement, with `:name` parameters bound from `params` when given; returns (column
    names, rows). Raises QueryError."""
    parsed = normalize_url(url if url is not None else default_db_url())
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = sqlite_path(parsed)
        if path is None:
            raise QueryError("querying needs a SQLite file (an in-memory database is empty)")
        return _sqlite_query(path, sql, params)
    if backend == "postgresql":
        libpq_url = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        return _pg_query(libpq_url, sql, params)
    raise QueryError(f"unsupported database {backend!r}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        # PostgreSQL sum()/avg() return numeric; JSON consumers want numbers, not strings.
        return int(value) if value.is_finite() and value == value.to_integral_value() else float(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, uuid.UUID | dt.timedelta):
        return str(value)
    raise TypeError(f"cannot render {type(value).__name__} as JSON")


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, dict | list):
        return json.dumps(value, default=_jsonable)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def format_rows(columns: list[str], rows: list[tuple], as_json: bool = False) -> str:
    """Render a query answer: JSON (a list of objects) or plain aligned text columns."""
    if as_json:
        return json.dumps([dict(zip(columns, row, strict=True)) for row in rows], default=_jsonable,
                          indent=2)
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], int | float | decimal.Decimal) and not isinstance(row[i], bool)
                   for row in rows if row[i] is not None) for i in range(len(columns))]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    out = [line(list(columns)), line(["-" * w for w in widths]), *(line(r) for r in cells)]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)
