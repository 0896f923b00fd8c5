"""Writing one run into the result database: validation, replace-on-reingest, bulk loading.

Owns the one-transaction write of a RunIngest (orchestrator/storage/run_ingest.py). Each write gives the run a fresh
integer run_key; per-packet rows go to PostgreSQL by binary COPY into new per-run partitions that are
attached (and indexed) at the end, and the previous ingest's partitions are dropped in the same
transaction, so a failure anywhere leaves the database as it was (orchestrator/storage/bulk.py).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import Connection, Engine, Table, exc, or_, select, text
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from orchestrator.storage import bulk, packet_store, records, tables, trials
from orchestrator.storage.conns import ConnRegistry
from orchestrator.storage.db import writer
from orchestrator.storage.run_ingest import (
    BULK_LAYOUTS,
    CHILD_TABLES,
    TABLES_BY_RUN_ID,
    BulkLayout,
    IngestCounts,
    IngestError,
    PacketSource,
    RunIngest,
    validate,
)

# --- batches (pure) ----------------------------------------------------------------------------------

def _array_batches(ingest: RunIngest, layout: BulkLayout, run_key: int) -> Iterator[bulk.Batch]:
    for item in getattr(ingest, layout.attr):
        for arr in _chunks(item[-1]):
            data: dict[str, Any] = {"run_id": ingest.run["run_id"], "run_key": run_key}
            data.update(zip(layout.keys, item[len(layout.labels):-1], strict=True))
            data.update({n: arr[n] for n in layout.dtype.names})
            yield data, layout.nulls(arr) if layout.nulls is not None else {}


def _chunks(src: PacketSource) -> Iterator[np.ndarray]:
    if isinstance(src, np.ndarray):
        yield src
    else:
        yield from src


class _Packets:
    """Packet batches of every capture point; afterwards the capture_point rows (reader counts)."""

    def __init__(self, ingest: RunIngest, conns: ConnRegistry, run_key: int, blocks: bool) -> None:
        self.ingest, self.conns, self.run_key, self.blocks = ingest, conns, run_key, blocks
        self.points: list[dict[str, Any]] = []
        self.count = 0      # packets (a PostgreSQL batch row is a block of them)
        self.block_numbers = packet_store.BlockNumbers()

    def __iter__(self) -> Iterator[bulk.Batch]:
        for point_id, (label, src) in enumerate(self.ingest.packets):
            counts = np.zeros(2, dtype=np.int64)
            for chunk in _chunks(src):
                chunk["point"] = point_id
                for observer in self.ingest.packet_observers:
                    observer.observe(label, chunk)
                conn_ids = self.conns.ids(chunk)
                counts += (np.count_nonzero(chunk["proto"] == records.PROTO_TCP),
                           np.count_nonzero(chunk["proto"] == records.PROTO_UDP))
                self.count += chunk.size
                if self.blocks:
                    for data in packet_store.block_batches(conn_ids, chunk, self.block_numbers):
                        yield data, {}
                else:
                    yield {"run_key": self.run_key, **packet_store.row_batch(conn_ids, chunk)}, {}
            stats = getattr(src, "stats", None)
            row = {"point_id": point_id, "point": label, "tcp": int(counts[0]), "udp": int(counts[1]),
                   "records": int(counts.sum()), "other": 0, "truncated": 0, "trailing_bytes": 0}
            if stats is not None:
                row.update({k: getattr(stats, k) for k in ("records", "tcp", "udp", "other", "truncated",
                                                            "trailing_bytes")})
            extra = self.ingest.capture_points.get(label, {})
            row.update({k: v for k, v in extra.items() if k in tables.capture_point.c and k != "run_id"})
            self.points.append(_full_row(tables.capture_point, row, self.ingest.run["run_id"]))


# --- writers (effects) -------------------------------------------------------------------------------

def _insert_plan(engine: Engine, plan_row: dict[str, Any]) -> None:
    """A plan not stored yet goes in on its own, committed at once (a plan row without runs is harmless). Inserted
    inside the run's transaction, its row -- or its unique-index entry -- would make every other manager writing a
    run of the same plan wait for that whole transaction (docs/database.md, "Two managers, one database")."""
    dialect = {"postgresql": pg_dialect, "sqlite": sqlite_dialect}.get(engine.dialect.name)
    if dialect is None:
        raise NotImplementedError(f"plan insert on {engine.dialect.name}")
    with writer(engine).begin() as conn:
        conn.execute(dialect.insert(tables.plan).values(**plan_row)
                     .on_conflict_do_nothing(index_elements=[tables.plan.c.plan_sha256]))


def _refresh_plan(conn: Connection, plan_row: dict[str, Any]) -> None:
    """Refresh name/path/text of the stored plan where they differ; created_at stays the first-seen. An UPDATE that
    matches no row locks none, so runs of an unchanged plan never wait for each other."""
    p = tables.plan
    fields = {c: plan_row[c] for c in ("name", "path", "text") if c in plan_row}
    if fields:
        changed = or_(*(p.c[c] != v for c, v in fields.items()))
        conn.execute(p.update().where(p.c.plan_sha256 == plan_row["plan_sha256"], changed).values(**fields))


def _old_key(conn: Connection, run_id: str) -> int | None:
    return conn.execute(select(tables.run.c.run_key).where(tables.run.c.run_id == run_id)).scalar()


def _new_key(conn: Connection) -> int:
    if conn.dialect.name == "postgresql":
        return int(conn.execute(text("SELECT nextval('run_key_seq')")).scalar_one())
    return int(conn.execute(text("SELECT coalesce(max(run_key), 0) + 1 FROM run")).scalar_one())


def _delete(conn: Connection, run_id: str, key: int | None, keep_partitions: bool = False) -> dict[str, int]:
    """Remove a run's rows, children before parents (no reliance on ON DELETE CASCADE). On PostgreSQL
    the per-packet partitions are dropped here unless keep_partitions (write_run drops them last)."""
    counts = {t.name: conn.execute(t.delete().where(t.c.run_id == run_id)).rowcount for t in TABLES_BY_RUN_ID}
    if key is not None:
        counts["conn"] = conn.execute(tables.conn.delete().where(tables.conn.c.run_key == key)).rowcount
        if conn.dialect.name == "postgresql":
            if not keep_partitions:
                counts.update(bulk.drop_partitions(conn, key))
        else:
            for table in tables.run_key_tables(conn.dialect.name):
                counts[table.name] = conn.execute(table.delete().where(table.c.run_key == key)).rowcount
    counts["run"] = conn.execute(tables.run.delete().where(tables.run.c.run_id == run_id)).rowcount
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


def _final_flags(ingest: RunIngest) -> list[Any]:
    """The run's flags and then each observer's, each once."""
    flags = list(ingest.run.get("flags") or [])
    return flags + [f for o in ingest.packet_observers for f in o.flags() if f not in flags]


def _final_rows(ingest: RunIngest, attr: str) -> list[dict[str, Any]]:
    """A child table's rows; the flow rows with the values the observers measured per flow (M-ACKRATIO)."""
    rows = list(getattr(ingest, attr))
    if attr != "flows":
        return rows
    values: dict[int, dict[str, Any]] = {}
    for o in ingest.packet_observers:
        for flow_id, v in getattr(o, "flow_values", dict)().items():
            values.setdefault(flow_id, {}).update(v)
    return [{**r, **values.get(r["flow_id"], {})} for r in rows]


def write_run(engine: Engine, ingest: RunIngest) -> IngestCounts:
    """Write one run in a single transaction, replacing any earlier ingest of the same run_id.

    On any error nothing is changed: the old run (if any) and the plan row stay as they were (a plan stored for the
    first time stays: it is committed before the run's transaction, see _insert_plan).
    """
    validate(ingest)
    run_id = ingest.run["run_id"]
    counts: dict[str, int] = {}
    if ingest.plan is not None:
        with _step("plan"):
            _insert_plan(engine, ingest.plan)
    with writer(engine).begin() as conn:
        if conn.dialect.name not in ("postgresql", "sqlite"):
            raise NotImplementedError(f"bulk load on {conn.dialect.name}")
        pg = conn.dialect.name == "postgresql"
        with _step(f"run {run_id!r}: deleting the earlier ingest"):
            old = _old_key(conn, run_id)
            _delete(conn, run_id, old, keep_partitions=True)
            key = _new_key(conn)
        if ingest.plan is not None:
            with _step("plan"):
                _refresh_plan(conn, ingest.plan)
            counts["plan"] = 1
        # the bulk tables first (they reference run_key, not the run row): the packet observers have then
        # seen every packet, and the run row is inserted once, with its final flags
        conns = ingest.conns if ingest.conns is not None else ConnRegistry()
        attach: list[Table] = []
        packets = _Packets(ingest, conns, key, packet_store.stored_as_blocks(conn))
        with _step("packets"):
            loaded = bulk.load(conn, packet_store.table(conn), packets, key)
        counts["packet"] = packets.count
        attach += [packet_store.table(conn)] if loaded.partition else []
        for layout in BULK_LAYOUTS:
            with _step(layout.attr):
                loaded = bulk.load(conn, layout.table, _array_batches(ingest, layout, key), key)
            counts[layout.table.name] = loaded.rows
            attach += [layout.table] if loaded.partition else []
        with _step("run"):
            conn.execute(tables.run.insert(), {**ingest.run, "flags": _final_flags(ingest), "run_key": key})
        counts["run"] = 1
        for attr, table in CHILD_TABLES:
            rows = [_full_row(table, row, run_id) for row in _final_rows(ingest, attr)]
            if rows:
                with _step(attr):
                    conn.execute(table.insert(), rows)
            counts[table.name] = len(rows)
        with _step("conns"):
            conn_rows = [{**r, "run_key": key} for r in conns.rows([p for p, _ in ingest.packets])]
            if conn_rows:
                conn.execute(tables.conn.insert(), conn_rows)
            if packets.points:
                conn.execute(tables.capture_point.insert(), packets.points)
        counts["conn"], counts["capture_point"] = len(conn_rows), len(packets.points)
        with _step("trial"):   # a campaign trial is ok in the transaction that stores its run and artifacts
            trials.settle(conn, ingest.run, _final_rows(ingest, "hosts"), ingest.artifacts)
        if pg:
            with _step("partitions"):
                if old is not None:
                    bulk.drop_partitions(conn, old, count=False)
                for table in attach:
                    bulk.attach(conn, table, key)
    return IngestCounts(**counts)


def delete_run(engine: Engine, run_id: str) -> IngestCounts:
    """Remove a run and all its rows in every table; returns the rows removed per table."""
    with writer(engine).begin() as conn:
        counts = _delete(conn, run_id, _old_key(conn, run_id))
    return IngestCounts(**{k: v for k, v in counts.items() if k in IngestCounts.__dataclass_fields__})


def completed_run_ids(engine: Engine, plan_sha256: str) -> set[str]:
    """run_ids of the plan's runs whose status is 'complete'; failed and refused runs are tried again."""
    return set(completed_builds(engine, plan_sha256))


def completed_builds(engine: Engine, plan_sha256: str) -> dict[str, dict[str, str | None]]:
    """The plan's complete runs, each with the kernel build key its hosts ran (role -> key, None for a
    distribution or unbuilt kernel), read from the stored specs: `tcplab run` skips a run only when it is
    complete on the same builds (docs/kernels.md)."""
    stmt = select(tables.run.c.run_id, tables.run.c.spec).where(tables.run.c.plan_sha256 == plan_sha256,
                                                                 tables.run.c.status == "complete")
    out = {}
    with engine.connect() as conn:
        for run_id, spec in conn.execute(stmt):
            doc = json.loads(spec) if isinstance(spec, str) else spec
            hosts = doc.get("hosts", {}) if isinstance(doc, dict) else {}
            out[run_id] = {role: (h.get("kernel") or {}).get("build_key") for role, h in hosts.items()}
    return out
