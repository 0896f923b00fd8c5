"""PostgreSQL roles of a shared result database (`tcplab db init`, docs/database.md "Roles").

Two login roles: a **writer** for the managers and a **reader** for researchers. The writer owns every tcplab
object -- it has to: ATTACH PARTITION and the migrations `open_db` runs need the owner of the parent tables -- and
the per-run partition schema, where it creates a table per run at ingest. The reader may connect and SELECT:
on what exists now (tables, views, partitions) by GRANT, and on what the writer creates later (a run's partitions,
tables and views of later migrations) by ALTER DEFAULT PRIVILEGES FOR ROLE writer. Nothing else: no INSERT, UPDATE,
DELETE or CREATE (tests/db/test_db_roles.py connects as the reader and tries each). Its sessions also default to
read-only transactions, a guard against mistakes only (a session can turn it off; the grants are what protects).

Roles belong to the PostgreSQL cluster, so `db init` needs a superuser (or CREATEROLE and the objects' owner).
SQLite has no roles: the file's permissions are the only access control there.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import psycopg
from psycopg import sql
from sqlalchemy.engine import URL

from orchestrator.storage.db import normalize_url
from orchestrator.storage.tables import PARTITION_SCHEMA

DEFAULT_WRITER = "tcplab_writer"
DEFAULT_READER = "tcplab_reader"
WRITER_PASSWORD_ENV = "TCPLAB_WRITER_PASSWORD"
READER_PASSWORD_ENV = "TCPLAB_READER_PASSWORD"
SCHEMAS = ("public", PARTITION_SCHEMA)
_ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_RELKINDS = ("r", "p", "v", "m", "S")   # tables, partitioned tables, views, materialized views, sequences


class RolesError(ValueError):
    """`db init` could not do its work; the message names the parameter or what the server said."""


@dataclass(frozen=True)
class Roles:
    writer: str = DEFAULT_WRITER
    reader: str = DEFAULT_READER
    writer_password: str | None = None
    reader_password: str | None = None

    @classmethod
    def checked(cls, writer: str, reader: str, env: Mapping[str, str]) -> Roles:
        """Validated names (lower-case SQL identifiers, so no quoting surprises) and passwords from the environment."""
        for param, name in (("--writer", writer), ("--reader", reader)):
            if not _ROLE_NAME.fullmatch(name):
                raise RolesError(f"{param} {name!r}: a role name is 1-63 characters of a-z, 0-9 and _, not starting "
                                 "with a digit")
        if writer == reader:
            raise RolesError(f"--writer and --reader are both {writer!r}: they must be two roles")
        return cls(writer, reader, env.get(WRITER_PASSWORD_ENV) or None, env.get(READER_PASSWORD_ENV) or None)


def grant_statements(database: str, roles: Roles) -> list[sql.Composed]:
    """The GRANTs of both roles (pure; idempotent statements). Ownership of the existing objects is separate
    (`_transfer_ownership`): it depends on what the database holds."""
    w, r, db = sql.Identifier(roles.writer), sql.Identifier(roles.reader), sql.Identifier(database)
    schemas = sql.SQL(", ").join(sql.Identifier(s) for s in SCHEMAS)
    return [sql.SQL(s).format(w=w, r=r, db=db, schemas=schemas) for s in (
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC",     # PostgreSQL < 15 lets every role create there
        "GRANT CONNECT, TEMPORARY ON DATABASE {db} TO {w}",
        "GRANT USAGE, CREATE ON SCHEMA public TO {w}",
        "ALTER SCHEMA " + PARTITION_SCHEMA + " OWNER TO {w}",
        "GRANT CONNECT ON DATABASE {db} TO {r}",
        "GRANT USAGE ON SCHEMA {schemas} TO {r}",
        "GRANT SELECT ON ALL TABLES IN SCHEMA {schemas} TO {r}",
        "ALTER DEFAULT PRIVILEGES FOR ROLE {w} IN SCHEMA {schemas} GRANT SELECT ON TABLES TO {r}",
        "ALTER ROLE {r} SET default_transaction_read_only = on",
    )]


def _ensure_role(cur: psycopg.Cursor, name: str, password: str | None) -> bool:
    """Create the login role if it does not exist; set its password when one is given. True if created."""
    exists = cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is not None
    if not exists:
        cur.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    if password is not None:   # a literal, quoted by psycopg: ALTER ROLE takes no bound parameters
        cur.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
    return not exists


def _transfer_ownership(cur: psycopg.Cursor, owner: str) -> int:
    """Make `owner` the owner of every table, view and sequence in SCHEMAS (a partition is a table too); a sequence
    that belongs to a column (serial) follows its table, and may not be given away on its own."""
    rows = cur.execute("SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON "
                       "n.oid = c.relnamespace WHERE n.nspname = ANY(%s) AND c.relkind = ANY(%s) "
                       "AND pg_get_userbyid(c.relowner) <> %s AND (c.relkind <> 'S' OR NOT EXISTS "
                       "(SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid "
                       "AND d.deptype IN ('a', 'i')))",
                       (list(SCHEMAS), list(_RELKINDS), owner)).fetchall()
    for schema, name, kind in rows:
        what = {"v": "VIEW", "m": "MATERIALIZED VIEW", "S": "SEQUENCE"}.get(kind, "TABLE")
        cur.execute(sql.SQL("ALTER {} {}.{} OWNER TO {}").format(sql.SQL(what), sql.Identifier(schema),
                                                                sql.Identifier(name), sql.Identifier(owner)))
    return len(rows)


@dataclass(frozen=True)
class InitResult:
    database: str
    created: tuple[str, ...]
    owned: int


def require_postgresql(url: str) -> URL:
    parsed = normalize_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise RolesError(f"--db {parsed.render_as_string(hide_password=True)}: roles need PostgreSQL; a SQLite "
                         "database has none (its file permissions are the access control)")
    return parsed


def init_roles(url: str, roles: Roles) -> InitResult:
    """Create (if needed) and grant both roles on the database at `url`, already migrated to head, in one
    transaction; running it again changes nothing but passwords given again."""
    parsed = require_postgresql(url)
    dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        with psycopg.connect(dsn, connect_timeout=10) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {PARTITION_SCHEMA}")
            created = tuple(name for name, pw in ((roles.writer, roles.writer_password),
                                                  (roles.reader, roles.reader_password)) if _ensure_role(cur, name, pw))
            owned = _transfer_ownership(cur, roles.writer)
            for stmt in grant_statements(parsed.database or "", roles):
                cur.execute(stmt)
    except psycopg.Error as exc:
        raise RolesError(f"the server refused: {str(exc).strip()}") from exc
    return InitResult(parsed.database or "", created, owned)
