"""Writing one run into the result database: validation, replace-on-reingest, bulk loading.

Owns RunIngest (everything the DB holds about a run, with per-packet data as numpy arrays of the
orchestrator/ingest/records.py dtypes) and the one-transaction write of it. Bulk rows go to the
database straight from the arrays (tuples built column-wise, never a dict per row): PostgreSQL gets a
binary COPY through the very connection and transaction SQLAlchemy holds, SQLite an executemany.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import repeat
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import Connection, Engine, Table, exc, select, types
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from orchestrator.ingest import records
from orchestrator.storage import tables
from orchestrator.storage.db import SQLITE_BEGIN_OPTION

RUN_STATUSES = ("complete", "failed")
BATCH_ROWS = 50_000  # rows turned into Python tuples at a time: bounds memory for multi-million captures


class IngestError(Exception):
    """A RunIngest that was not written; `where` names the offending part (e.g. packets[2]).

    Raised for invalid content before the DB is touched, and for any database error during the
    write (the original driver error is the __cause__); either way the DB is unchanged.
    """

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


@dataclass(frozen=True)
class RunIngest:
    """One run as the DB stores it. Child rows may omit run_id; it is taken from `run`."""

    run: dict[str, Any]
    plan: dict[str, Any] | None = None
    flows: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    evidence: list[dict[str, Any]] = field(default_factory=list)          # host, phase, data
    packets: list[tuple[str, np.ndarray]] = field(default_factory=list)   # (capture point, PACKET)
    tcp_probe: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (host, TCP_PROBE)
    qdisc_samples: list[tuple[str, str, np.ndarray]] = field(default_factory=list)  # (host, iface, ..)
    iperf_intervals: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (flow_id, ..)


@dataclass(frozen=True)
class IngestCounts:
    """Rows per table written by write_run (or removed by delete_run)."""

    plan: int = 0
    run: int = 0
    flow: int = 0
    artifact: int = 0
    host_evidence: int = 0
    packet: int = 0
    tcp_probe: int = 0
    qdisc_sample: int = 0
    iperf_interval: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def total(self) -> int:
        return sum(asdict(self).values())


@dataclass(frozen=True)
class BulkLayout:
    """How one RunIngest field maps onto a bulk table: key columns from the tuple, then the array."""

    attr: str                 # RunIngest field name
    table: Table
    keys: tuple[str, ...]     # table columns filled from the tuple's leading items (after run_id)
    dtype: np.dtype

    @property
    def columns(self) -> tuple[str, ...]:
        return ("run_id", *self.keys, *self.dtype.names)


BULK_LAYOUTS = (
    BulkLayout("packets", tables.packet, ("point",), records.PACKET),
    BulkLayout("tcp_probe", tables.tcp_probe, ("host",), records.TCP_PROBE),
    BulkLayout("qdisc_samples", tables.qdisc_sample, ("host", "interface"), records.QDISC_SAMPLE),
    BulkLayout("iperf_intervals", tables.iperf_interval, ("flow_id",), records.IPERF_INTERVAL),
)

_CHILD_TABLES = (("flows", tables.flow), ("artifacts", tables.artifact), ("evidence", tables.host_evidence))
# Children before parents, so the deletes never depend on ON DELETE CASCADE being enabled.
_DELETE_ORDER = (*tables.PER_RUN_BULK_TABLES, tables.host_evidence, tables.artifact, tables.flow, tables.run)


# --- validation (pure) -------------------------------------------------------------------------------

def _required(table: Table) -> set[str]:
    return {c.name for c in table.columns
            if not c.nullable and c.default is None and c.server_default is None}


def _check_row(where: str, row: dict[str, Any], table: Table, run_id: str | None = None) -> None:
    if not isinstance(row, dict):
        raise IngestError(where, f"expected a dict of {table.name} columns, got {type(row).__name__}")
    unknown = set(row) - set(table.columns.keys())
    if unknown:
        raise IngestError(where, f"unknown {table.name} columns {sorted(unknown)}")
    missing = _required(table) - set(row) - ({"run_id"} if run_id is not None else set())
    if missing:
        raise IngestError(where, f"missing {table.name} columns {sorted(missing)}")
    if run_id is not None and row.get("run_id", run_id) != run_id:
        raise IngestError(where, f"run_id {row['run_id']!r} differs from the run's {run_id!r}")


def validate(ingest: RunIngest) -> None:
    """Raise IngestError for anything write_run would refuse, before the DB is touched."""
    _check_row("run", ingest.run, tables.run)
    run_id = ingest.run["run_id"]
    if ingest.run["status"] not in RUN_STATUSES:
        raise IngestError("run.status", f"{ingest.run['status']!r} is not one of {RUN_STATUSES}")
    if ingest.plan is not None:
        _check_row("plan", ingest.plan, tables.plan)
        if ingest.run.get("plan_sha256") != ingest.plan["plan_sha256"]:
            raise IngestError("run.plan_sha256", "does not match plan.plan_sha256")
    for attr, table in _CHILD_TABLES:
        for i, row in enumerate(getattr(ingest, attr)):
            _check_row(f"{attr}[{i}]", row, table, run_id)
    for layout in BULK_LAYOUTS:
        for i, item in enumerate(getattr(ingest, layout.attr)):
            where = f"{layout.attr}[{i}]"
            if not isinstance(item, tuple) or len(item) != len(layout.keys) + 1:
                raise IngestError(where, f"expected a tuple ({', '.join(layout.keys)}, array)")
            arr = item[-1]
            if not isinstance(arr, np.ndarray) or arr.ndim != 1:
                raise IngestError(where, "expected a one-dimensional numpy array")
            if arr.dtype != layout.dtype:
                raise IngestError(where, f"array dtype {arr.dtype} is not the {layout.table.name} record "
                                  f"dtype {layout.dtype}")


# --- row production (pure) ---------------------------------------------------------------------------

def bulk_rows(prefix: Sequence[Any], arr: np.ndarray, batch: int = BATCH_ROWS) -> Iterator[list[tuple]]:
    """Batches of row tuples (prefix..., record fields...) built column-wise from a structured array."""
    names = arr.dtype.names
    for start in range(0, len(arr), batch):
        chunk = arr[start:start + batch]
        # tolist() per column yields native ints/floats/strs in C; zip assembles the row tuples.
        columns = [chunk[n].tolist() for n in names]
        yield list(zip(*(repeat(p, len(chunk)) for p in prefix), *columns, strict=True))


def _items(ingest: RunIngest, layout: BulkLayout) -> Iterable[tuple[tuple[Any, ...], np.ndarray]]:
    run_id = ingest.run["run_id"]
    for item in getattr(ingest, layout.attr):
        yield (run_id, *item[:-1]), item[-1]


# --- writers (effects) -------------------------------------------------------------------------------

_PG_TYPES = {types.SmallInteger: "int2", types.BigInteger: "int8", types.Integer: "int4",
             types.Float: "float8", types.String: "text"}


def _pg_type(column_type: types.TypeEngine) -> str:
    for cls, name in _PG_TYPES.items():  # subclasses first: BigInteger is an Integer
        if isinstance(column_type, cls):
            return name
    raise TypeError(f"no COPY type for {column_type!r}")


def _copy_bulk(conn: Connection, ingest: RunIngest, layout: BulkLayout) -> int:
    """Binary COPY of all arrays of one layout, inside the SQLAlchemy connection's transaction."""
    columns = layout.columns
    pg_types = [_pg_type(layout.table.c[c].type) for c in columns]
    driver = conn.connection.driver_connection
    sql = f"COPY {layout.table.name} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
    with driver.cursor() as cur:
        with cur.copy(sql) as copy:
            copy.set_types(pg_types)
            for prefix, arr in _items(ingest, layout):
                for rows in bulk_rows(prefix, arr):
                    for row in rows:
                        copy.write_row(row)
        return max(cur.rowcount, 0)


def _insert_bulk(conn: Connection, ingest: RunIngest, layout: BulkLayout) -> int:
    """executemany of row tuples (SQLite; its driver uses qmark placeholders)."""
    columns = layout.columns
    marks = ", ".join("?" for _ in columns)
    sql = f"INSERT INTO {layout.table.name} ({', '.join(columns)}) VALUES ({marks})"
    n = 0
    for prefix, arr in _items(ingest, layout):
        for rows in bulk_rows(prefix, arr):
            conn.exec_driver_sql(sql, rows)
            n += len(rows)
    return n


def _upsert_plan(conn: Connection, plan_row: dict[str, Any]) -> None:
    """Insert the plan, or refresh name/path/text of a known one; created_at stays the first-seen."""
    dialect = {"postgresql": pg_dialect, "sqlite": sqlite_dialect}.get(conn.dialect.name)
    if dialect is None:
        raise NotImplementedError(f"plan upsert on {conn.dialect.name}")
    stmt = dialect.insert(tables.plan).values(**plan_row)
    stmt = stmt.on_conflict_do_update(
        index_elements=[tables.plan.c.plan_sha256],
        set_={c: stmt.excluded[c] for c in ("name", "path", "text") if c in plan_row})
    conn.execute(stmt)


def _delete(conn: Connection, run_id: str) -> dict[str, int]:
    counts = {}
    for table in _DELETE_ORDER:
        counts[table.name] = conn.execute(table.delete().where(table.c.run_id == run_id)).rowcount
    return counts


@contextmanager
def _step(where: str) -> Iterator[None]:
    """Name the part being written in database errors (COPY errors come from psycopg, the rest
    from SQLAlchemy); raising inside the transaction block is what rolls it back."""
    try:
        yield
    except (exc.DBAPIError, psycopg.Error) as err:
        detail = getattr(err, "orig", None) or err
        raise IngestError(where, f"database refused the write: {str(detail).strip()}") from err


def _full_row(table: Table, row: dict[str, Any], run_id: str) -> dict[str, Any]:
    """Every column, absent ones as None: executemany compiles one INSERT from the first row's keys."""
    merged = {**row, "run_id": run_id}
    return {c: merged.get(c) for c in table.columns.keys()}


def _writer(engine: Engine) -> Engine:
    return engine.execution_options(**{SQLITE_BEGIN_OPTION: "BEGIN IMMEDIATE"})


def write_run(engine: Engine, ingest: RunIngest) -> IngestCounts:
    """Write one run in a single transaction, replacing any earlier ingest of the same run_id.

    On any error nothing is changed: the old run (if any) and the plan row stay as they were.
    """
    validate(ingest)
    run_id = ingest.run["run_id"]
    counts: dict[str, int] = {}
    with _writer(engine).begin() as conn:
        with _step(f"run {run_id!r}: deleting the earlier ingest"):
            _delete(conn, run_id)
        if ingest.plan is not None:
            with _step("plan"):
                _upsert_plan(conn, ingest.plan)
            counts["plan"] = 1
        with _step("run"):
            conn.execute(tables.run.insert(), ingest.run)
        counts["run"] = 1
        for attr, table in _CHILD_TABLES:
            rows = [_full_row(table, row, run_id) for row in getattr(ingest, attr)]
            if rows:
                with _step(attr):
                    conn.execute(table.insert(), rows)
            counts[table.name] = len(rows)
        if conn.dialect.name not in ("postgresql", "sqlite"):
            raise NotImplementedError(f"bulk load on {conn.dialect.name}")
        bulk = _copy_bulk if conn.dialect.name == "postgresql" else _insert_bulk
        for layout in BULK_LAYOUTS:
            with _step(layout.attr):
                counts[layout.table.name] = bulk(conn, ingest, layout)
    return IngestCounts(**counts)


def delete_run(engine: Engine, run_id: str) -> IngestCounts:
    """Remove a run and all its rows in every table; returns the rows removed per table."""
    with _writer(engine).begin() as conn:
        return IngestCounts(**_delete(conn, run_id))


def completed_run_ids(engine: Engine, plan_sha256: str) -> set[str]:
    """run_ids of the plan's runs whose status is 'complete' (the ones a campaign may skip)."""
    stmt = select(tables.run.c.run_id).where(tables.run.c.plan_sha256 == plan_sha256,
                                             tables.run.c.status == "complete")
    with engine.connect() as conn:
        return set(conn.scalars(stmt))
