"""`tcplab query`, `tcplab db init` and `tcplab export`: the shared result database's commands (docs/database.md).
Thin: each calls one module (storage/query.py and saved_queries.py, storage/roles.py, analysis/parquet_export.py)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from rich.console import Console

DB_HELP = "database URL (default $TCPLAB_DB or results/tcplab.db)"


def cmd_query(args: argparse.Namespace, console: Console) -> int:
    from orchestrator.storage import saved_queries as sq
    from orchestrator.storage.query import QueryError, format_rows, run_query

    if args.list:
        print("\n".join(sq.describe(q) for q in sq.QUERIES.values()))
        return 0
    if (args.sql is None) == (args.name is None):
        console.print("[red]query: give SQL or --name NAME (tcplab query --list shows the names)[/red]")
        return 2
    try:
        if args.name is not None:
            query = sq.saved_query(args.name)
            cols, rows = run_query(args.db, query.sql, sq.bind(query, sq.parse_assignments(args.param)))
        elif args.param:
            raise sq.SavedQueryError("--param is for saved queries (--name)")
        else:
            cols, rows = run_query(args.db, args.sql)
    except (QueryError, sq.SavedQueryError) as exc:
        console.print(f"[red]query failed:[/red] {exc}", markup=True, highlight=False)
        return 2
    print(format_rows(cols, rows, as_json=args.json))
    return 0


def cmd_db(args: argparse.Namespace, console: Console) -> int:
    from orchestrator.storage.db import default_db_url, open_db
    from orchestrator.storage.roles import Roles, RolesError, init_roles, require_postgresql

    url = args.db or default_db_url()
    try:
        roles = Roles.checked(args.writer, args.reader, os.environ)
        require_postgresql(url)            # SQLite has no roles: said before anything is created
        open_db(url).dispose()             # migrate to head first: the views and tables the grants cover
        result = init_roles(url, roles)
    except RolesError as exc:
        console.print(f"db init: {exc}", style="red", markup=False)
        return 2
    made = ", ".join(result.created) or "none (both existed)"
    console.print(f"db init {result.database}: writer {roles.writer}, reader {roles.reader}; roles created: {made}; "
                  f"{result.owned} objects given to the writer", markup=False)
    return 0


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    from analysis.parquet_export import export
    from analysis.select import SelectorError, select_all
    from orchestrator.engine.provenance import tcplab_version
    from orchestrator.storage.db import open_existing_db

    db = open_existing_db(args.db)
    try:
        run_ids = select_all(db, args.selectors) if args.selectors else _complete_runs(db)
        rows = export(db, run_ids, args.what, Path(args.out), args.selectors, tcplab_version())
    except SelectorError as exc:
        console.print(f"export: no runs for {exc}", style="red", markup=False)
        return 2
    except ValueError as exc:   # --what
        console.print(f"export: {exc}", style="red", markup=False)
        return 2
    finally:
        db.dispose()
    console.print(f"export: {rows} {args.what} rows of {len(run_ids)} runs -> {args.out}", markup=False)
    return 0


def _complete_runs(db) -> list[str]:
    from sqlalchemy import select

    from orchestrator.storage import tables
    with db.connect() as conn:
        return list(conn.scalars(select(tables.run.c.run_id).where(tables.run.c.status == "complete")
                                 .order_by(tables.run.c.run_id)))


def add_parsers(sub: argparse._SubParsersAction, console: Console) -> None:
    from orchestrator.storage.roles import DEFAULT_READER, DEFAULT_WRITER, READER_PASSWORD_ENV, WRITER_PASSWORD_ENV

    q = sub.add_parser("query", help="read-only SQL, or a named saved query, against the result database")
    q.add_argument("sql", nargs="?", help="one SQL statement (or use --name)")
    q.add_argument("--name", help="a saved query (tcplab query --list)")
    q.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a saved query's parameter")
    q.add_argument("--list", action="store_true", help="the saved queries with their parameters")
    q.add_argument("--db", default=None, help=DB_HELP)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=lambda a: cmd_query(a, console))

    db = sub.add_parser("db", help="the shared database: `db init` creates the writer and reader roles "
                        "(PostgreSQL; docs/database.md)")
    db.add_argument("action", choices=["init"])
    db.add_argument("--db", default=None, help="admin URL of the PostgreSQL database (a superuser)")
    db.add_argument("--writer", default=DEFAULT_WRITER,
                    help=f"the managers' role (password from ${WRITER_PASSWORD_ENV})")
    db.add_argument("--reader", default=DEFAULT_READER, help=f"the researchers' read-only role (password from "
                    f"${READER_PASSWORD_ENV})")
    db.set_defaults(func=lambda a: cmd_db(a, console))

    ex = sub.add_parser("export", help="a selection of runs to Parquet with the run metadata (pandas/polars/DuckDB)")
    ex.add_argument("selectors", nargs="*", metavar="SELECTOR", help="as for report (run:, plan:, tag:, "
                    "experiment:); none = every complete run")
    ex.add_argument("--out", required=True, help="the .parquet file")
    ex.add_argument("--what", default="runs", metavar="runs|flows|qdelay|packets",
                    help="one row per run, flow, queue-delay sample or packet (default runs)")
    ex.add_argument("--db", default=None, help=DB_HELP)
    ex.set_defaults(func=lambda a: cmd_export(a, console))
