"""Bulk rows of one run: column batches from numpy arrays, and their load into PostgreSQL or SQLite.

Owns the per-run partitions on PostgreSQL: each per-packet table of a run is loaded into a fresh table
`tcplab_part.<table>_<run_key>` (LIKE the parent, run_key as a column DEFAULT so it is never sent,
a CHECK that lets ATTACH skip its validation scan) by binary COPY from numpy-built buffers
(orchestrator/storage/pgcopy.py), then attached to the parent, which builds the parent's indexes on
it: indexes are made after the load. SQLite gets executemany of tuples built column-wise.

A batch is (data, nulls): data maps column -> array (one value per row) or scalar (same for all rows).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from itertools import repeat
from queue import Queue
from typing import Any

import numpy as np
from psycopg.copy import QueuedLibpqWriter
from sqlalchemy import Connection, Table, types

from orchestrator.storage import packet_store, pgcopy, tables
from orchestrator.storage.pgcopy import batch_rows

Batch = tuple[dict[str, Any], dict[str, np.ndarray]]
SQLITE_ROWS = 50_000  # rows turned into Python tuples at a time (SQLite path)
QUEUE_SLICES = 256    # COPY data queued for the writer thread: 256 x 128 KiB

_KINDS = {types.SmallInteger: "int2", types.BigInteger: "int8", types.Integer: "int4",
          types.Float: "float8", types.String: "text", types.LargeBinary: "bytea"}


def column_kind(column_type: types.TypeEngine) -> str:
    for cls, name in _KINDS.items():  # subclasses first: BigInteger is an Integer
        if isinstance(column_type, cls):
            return name
    raise TypeError(f"no COPY type for {column_type!r}")


def partition_name(table: Table, run_key: int) -> str:
    return f"{tables.PARTITION_SCHEMA}.{table.name}_{int(run_key)}"


@dataclass
class Loaded:
    """What load() did for one table: rows written and the partition waiting to be attached."""

    rows: int = 0
    partition: str | None = None


def load(conn: Connection, table: Table, batches: Iterable[Batch], run_key: int) -> Loaded:
    """Write the batches into `table` for run `run_key` (PostgreSQL partition or SQLite rows)."""
    if conn.dialect.name == "postgresql":
        return _copy(conn, table, batches, run_key)
    return Loaded(rows=_insert(conn, table, batches))


def _copy(conn: Connection, table: Table, batches: Iterable[Batch], run_key: int) -> Loaded:
    partitioned = table in tables.PARTITIONED_TABLES
    cols = [(c.name, column_kind(c.type)) for c in table.columns if not (partitioned and c.name == "run_key")]
    driver = conn.connection.driver_connection
    out = Loaded()
    with driver.cursor() as cur, ExitStack() as stack:
        copy = None
        for data, nulls in batches:
            rows = batch_rows(data)
            if rows == 0:
                continue
            if copy is None:  # the partition is made only for a table that has rows
                target = table.name
                if partitioned:
                    target = out.partition = _create_partition(cur, table, run_key)
                names = ", ".join(c for c, _ in cols)
                copy = stack.enter_context(cur.copy(f"COPY {target} ({names}) FROM STDIN (FORMAT BINARY)",
                                                    writer=_QueuedWriter(cur)))
                copy.write(pgcopy.HEADER)
            for buf in pgcopy.encode(cols, data, nulls):
                copy.write(buf)
            out.rows += rows
        if copy is not None:
            copy.write(pgcopy.TRAILER)
    return out


class _QueuedWriter(QueuedLibpqWriter):
    """psycopg's threaded COPY writer (the server parses one batch while numpy builds the next) with a
    smaller queue: at most QUEUE_SLICES x 128 KiB slices of our buffers wait, which bounds memory."""

    def __init__(self, cursor: Any) -> None:
        super().__init__(cursor)
        self._queue = Queue(maxsize=QUEUE_SLICES)


def _create_partition(cur: Any, table: Table, run_key: int) -> str:
    name = partition_name(table, run_key)
    key = int(run_key)
    blocks = table is tables.packet_block
    with_ = f" WITH ({packet_store.PARTITION_WITH})" if blocks else ""
    cur.execute(f"CREATE TABLE {name} (LIKE {table.name} INCLUDING DEFAULTS){with_}")
    for ddl in packet_store.PARTITION_DDL if blocks else ():
        cur.execute(ddl.format(name=name))
    cur.execute(f"ALTER TABLE {name} ALTER COLUMN run_key SET DEFAULT {key}")
    cur.execute(f"ALTER TABLE {name} ADD CONSTRAINT {table.name}_{key}_run_key CHECK (run_key = {key})")
    return name


def attach(conn: Connection, table: Table, run_key: int) -> None:
    """Make a loaded partition part of its parent; the parent's indexes are built on it here."""
    conn.exec_driver_sql(f"ALTER TABLE {table.name} ATTACH PARTITION {partition_name(table, run_key)} "
                         f"FOR VALUES IN ({int(run_key)})")


def drop_partitions(conn: Connection, run_key: int, count: bool = True) -> dict[str, int]:
    """Drop every partition of run_key (PostgreSQL); returns the rows each held (if counted)."""
    rows = {}
    for table in tables.PARTITIONED_TABLES:
        name = partition_name(table, run_key)
        if conn.exec_driver_sql("SELECT to_regclass(%(n)s)", {"n": name}).scalar():
            if count and table is tables.packet_block:   # counted in packets, like the SQLite rows
                rows[tables.packet.name] = packet_store.packets_in_partition(conn, name)
            elif count:
                rows[table.name] = conn.exec_driver_sql(f"SELECT count(*) FROM {name}").scalar_one()
            conn.exec_driver_sql(f"DROP TABLE {name}")
    return rows


def _insert(conn: Connection, table: Table, batches: Iterable[Batch]) -> int:
    names = [c.name for c in table.columns]
    sql = f"INSERT INTO {table.name} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"
    n = 0
    for data, nulls in batches:
        for rows in sqlite_rows(names, data, nulls):
            conn.exec_driver_sql(sql, rows)
            n += len(rows)
    return n


def sqlite_rows(names: list[str], data: dict[str, Any], nulls: dict[str, np.ndarray],
                batch: int = SQLITE_ROWS) -> Iterator[list[tuple]]:
    """Row tuples of native Python values, built column-wise (tolist runs in C), NULLs as None."""
    total = batch_rows(data)
    for start in range(0, total, batch):
        stop = min(start + batch, total)
        cols = []
        for name in names:
            value = data[name]
            if not isinstance(value, np.ndarray):
                cols.append(repeat(value.item() if isinstance(value, np.generic) else value, stop - start))
                continue
            col = value[start:stop].tolist()
            mask = nulls.get(name)
            if mask is not None and mask[start:stop].any():
                col = [None if m else v for v, m in zip(col, mask[start:stop].tolist(), strict=True)]
            cols.append(col)
        yield list(zip(*cols, strict=False))
