"""Alembic environment: runs migrations on the connection handed over by orchestrator.storage.db.

open_db() passes an open connection (already inside a transaction) in config.attributes["connection"],
so the migration commits or rolls back together with the caller. Used without one (e.g. from the alembic
CLI with `-x url=...` or a configured sqlalchemy.url), it connects on its own.
"""
from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from orchestrator.storage.tables import in_schema, metadata

config = context.config


def include_object(obj, name, type_, reflected, compare_to) -> bool:   # noqa: ANN001 (Alembic's hook)
    """Compare only the tables this backend has: on PostgreSQL `packet` is a view over `packet_block`."""
    return type_ != "table" or in_schema(name, context.get_bind().dialect.name)


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        include_object=include_object,
        compare_type=True,
        # SQLite cannot ALTER most things; batch mode lets later migrations copy-and-move tables.
        render_as_batch=connection.dialect.name == "sqlite",
    )


def _url() -> str:
    from orchestrator.storage.db import default_db_url, normalize_url
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")
    return normalize_url(url or default_db_url())


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url())
    try:
        with engine.begin() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
