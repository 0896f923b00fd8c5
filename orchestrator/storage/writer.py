"""Writing one run into the result database: validation, replace-on-reingest, bulk loading.

Owns RunIngest (everything the DB holds about a run, with per-packet data as numpy arrays of the
orchestrator/storage/records.py dtypes, or as re-iterable sources of such arrays, e.g. a PcapReader,
streamed chunk by chunk) and the one-transaction write of it. Each write gives the run a fresh
integer run_key; per-packet rows go to PostgreSQL by binary COPY into new per-run partitions that are
attached (and indexed) at the end, and the previous ingest's partitions are dropped in the same
transaction, so a failure anywhere leaves the database as it was (orchestrator/storage/bulk.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
import psycopg
from sqlalchemy import Connection, Engine, Table, exc, select, text
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from orchestrator.storage import bulk, records, tables
from orchestrator.storage.conns import ConnRegistry
from orchestrator.storage.db import writer

RUN_STATUSES = ("complete", "failed")
PacketSource = np.ndarray | Iterable[np.ndarray]


class IngestError(Exception):
    """A RunIngest that was not written; `where` names the offending part (e.g. packets[2]).

    Raised for invalid content before the DB is touched, and for any database error during the
    write (the original driver error is the __cause__); either way the DB is unchanged.
    """

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


class PacketObserver(Protocol):
    """A fold over a run's packets (a post-run guard such as G-ECN): shown every (capture point, PACKET chunk)
    as the writer streams it, then asked for the flags (JSON objects) the run row is to carry."""

    def observe(self, point: str, chunk: np.ndarray) -> None: ...

    def flags(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class RunIngest:
    """One run as the DB stores it. Child rows may omit run_id; it is taken from `run`.

    packets: (capture point label, PACKET array or re-iterable of PACKET chunks); the list index is
    the point id (written into each chunk's `point` field). conns: the registry qdelay's conn ids come
    from, filled further by the writer. capture_points: extra capture_point columns per point label
    (host, interface, tcpdump counts); the reader counts come from the source's `stats` if it has them.
    """

    run: dict[str, Any]
    plan: dict[str, Any] | None = None
    flows: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    evidence: list[dict[str, Any]] = field(default_factory=list)          # host, phase, data
    packets: list[tuple[str, PacketSource]] = field(default_factory=list)
    capture_points: dict[str, dict[str, Any]] = field(default_factory=dict)
    conns: ConnRegistry | None = None
    qdelay: list[tuple[str, Any]] = field(default_factory=list)  # (ingress point, QDELAY array or chunks)
    qdelay_pairs: list[dict[str, Any]] = field(default_factory=list)      # qdelay_pair rows
    tcp_probe: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (host, TCP_PROBE)
    qdisc_samples: list[tuple[str, str, np.ndarray]] = field(default_factory=list)  # (host, iface, ..)
    ss_samples: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (host, SS_SAMPLE)
    iperf_intervals: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (flow_id, ..)
    packet_observers: tuple[PacketObserver, ...] = ()   # folds whose flags join the run row before it is written


@dataclass(frozen=True)
class IngestCounts:
    """Rows per table written by write_run (or removed by delete_run)."""

    plan: int = 0
    run: int = 0
    flow: int = 0
    artifact: int = 0
    host_evidence: int = 0
    capture_point: int = 0
    conn: int = 0
    packet: int = 0
    qdelay: int = 0
    qdelay_pair: int = 0
    tcp_probe: int = 0
    qdisc_sample: int = 0
    ss_sample: int = 0
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
    keys: tuple[str, ...]     # table columns filled from the tuple's leading items
    dtype: np.dtype
    labels: tuple[str, ...] = ()  # leading tuple items that are not columns (before the keys)
    streamed: bool = False        # the array may also be a re-iterable of chunks (with a `dtype`)
    nulls: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None  # NULL masks of a chunk, by column

    @property
    def columns(self) -> tuple[str, ...]:
        key = "run_id" if "run_id" in self.table.c else "run_key"
        return (key, *self.keys, *self.dtype.names)


def _qdelay_nulls(arr: np.ndarray) -> dict[str, np.ndarray]:
    dropped = arr["dropped"] != 0   # never seen at the egress: no exit time, no sojourn
    return {"ts_out_ns": dropped, "sojourn_ns": dropped}


def _ss_nulls(arr: np.ndarray) -> dict[str, np.ndarray]:
    return records.null_masks(arr, records.SS_NULLABLE)


BULK_LAYOUTS = (
    BulkLayout("qdelay", tables.qdelay, (), records.QDELAY, labels=("ingress point",), streamed=True,
               nulls=_qdelay_nulls),
    BulkLayout("tcp_probe", tables.tcp_probe, ("host",), records.TCP_PROBE),
    BulkLayout("qdisc_samples", tables.qdisc_sample, ("host", "interface"), records.QDISC_SAMPLE),
    BulkLayout("ss_samples", tables.ss_sample, ("host",), records.SS_SAMPLE, nulls=_ss_nulls),
    BulkLayout("iperf_intervals", tables.iperf_interval, ("flow_id",), records.IPERF_INTERVAL),
)

_CHILD_TABLES = (("flows", tables.flow), ("artifacts", tables.artifact), ("evidence", tables.host_evidence),
                 ("qdelay_pairs", tables.qdelay_pair))
_BY_RUN_ID = (tables.iperf_interval, tables.qdelay_pair, tables.capture_point, tables.host_evidence,
              tables.artifact, tables.flow)


_ASSIGNED = {"run": {"run_key"}}  # columns write_run fills in itself


# --- validation (pure) -------------------------------------------------------------------------------

def _required(table: Table) -> set[str]:
    return {c.name for c in table.columns
            if not c.nullable and c.default is None and c.server_default is None} - _ASSIGNED.get(table.name, set())


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
    for i, item in enumerate(ingest.packets):
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise IngestError(f"packets[{i}]", "expected a tuple (capture point, packets)")
        src = item[1]
        if isinstance(src, np.ndarray):
            if src.ndim != 1 or src.dtype != records.PACKET:
                raise IngestError(f"packets[{i}]", f"expected a 1-d records.PACKET array, got {src.dtype}")
        elif not isinstance(src, Iterable):
            raise IngestError(f"packets[{i}]", "expected a records.PACKET array or an iterable of them")
    if ingest.qdelay and ingest.conns is None:
        raise IngestError("qdelay", "qdelay rows name conn ids: the RunIngest needs the conns registry")
    for layout in BULK_LAYOUTS:
        for i, item in enumerate(getattr(ingest, layout.attr)):
            where = f"{layout.attr}[{i}]"
            if not isinstance(item, tuple) or len(item) != len(layout.labels) + len(layout.keys) + 1:
                raise IngestError(where, f"expected a tuple ({', '.join(layout.labels + layout.keys)}, array)")
            arr = item[-1]
            if layout.streamed and not isinstance(arr, np.ndarray):
                if getattr(arr, "dtype", None) != layout.dtype or not isinstance(arr, Iterable):
                    raise IngestError(where, f"expected a {layout.table.name} array or a re-iterable of "
                                      f"{layout.dtype} chunks with that dtype")
                continue
            if not isinstance(arr, np.ndarray) or arr.ndim != 1:
                raise IngestError(where, "expected a one-dimensional numpy array")
            if arr.dtype != layout.dtype:
                raise IngestError(where, f"array dtype {arr.dtype} is not the {layout.table.name} record "
                                  f"dtype {layout.dtype}")


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

    def __init__(self, ingest: RunIngest, conns: ConnRegistry, run_key: int) -> None:
        self.ingest, self.conns, self.run_key = ingest, conns, run_key
        self.points: list[dict[str, Any]] = []

    def __iter__(self) -> Iterator[bulk.Batch]:
        for point_id, (label, src) in enumerate(self.ingest.packets):
            counts = np.zeros(2, dtype=np.int64)
            for chunk in _chunks(src):
                chunk["point"] = point_id
                for observer in self.ingest.packet_observers:
                    observer.observe(label, chunk)
                data: dict[str, Any] = {"run_key": self.run_key, "conn_id": self.conns.ids(chunk)}
                data.update({n: chunk[n] for n in records.PACKET_VALUE_FIELDS})
                counts += (np.count_nonzero(chunk["proto"] == records.PROTO_TCP),
                           np.count_nonzero(chunk["proto"] == records.PROTO_UDP))
                yield data, {}
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


def _old_key(conn: Connection, run_id: str) -> int | None:
    return conn.execute(select(tables.run.c.run_key).where(tables.run.c.run_id == run_id)).scalar()


def _new_key(conn: Connection) -> int:
    if conn.dialect.name == "postgresql":
        return int(conn.execute(text("SELECT nextval('run_key_seq')")).scalar_one())
    return int(conn.execute(text("SELECT coalesce(max(run_key), 0) + 1 FROM run")).scalar_one())


def _delete(conn: Connection, run_id: str, key: int | None, keep_partitions: bool = False) -> dict[str, int]:
    """Remove a run's rows, children before parents (no reliance on ON DELETE CASCADE). On PostgreSQL
    the per-packet partitions are dropped here unless keep_partitions (write_run drops them last)."""
    counts = {t.name: conn.execute(t.delete().where(t.c.run_id == run_id)).rowcount for t in _BY_RUN_ID}
    if key is not None:
        counts["conn"] = conn.execute(tables.conn.delete().where(tables.conn.c.run_key == key)).rowcount
        if conn.dialect.name == "postgresql":
            if not keep_partitions:
                counts.update(bulk.drop_partitions(conn, key))
        else:
            for table in tables.PARTITIONED_TABLES:
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


def write_run(engine: Engine, ingest: RunIngest) -> IngestCounts:
    """Write one run in a single transaction, replacing any earlier ingest of the same run_id.

    On any error nothing is changed: the old run (if any) and the plan row stay as they were.
    """
    validate(ingest)
    run_id = ingest.run["run_id"]
    counts: dict[str, int] = {}
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
                _upsert_plan(conn, ingest.plan)
            counts["plan"] = 1
        # the bulk tables first (they reference run_key, not the run row): the packet observers have then
        # seen every packet, and the run row is inserted once, with its final flags
        conns = ingest.conns if ingest.conns is not None else ConnRegistry()
        attach: list[Table] = []
        packets = _Packets(ingest, conns, key)
        with _step("packets"):
            loaded = bulk.load(conn, tables.packet, packets, key)
        counts["packet"] = loaded.rows
        attach += [tables.packet] if loaded.partition else []
        for layout in BULK_LAYOUTS:
            with _step(layout.attr):
                loaded = bulk.load(conn, layout.table, _array_batches(ingest, layout, key), key)
            counts[layout.table.name] = loaded.rows
            attach += [layout.table] if loaded.partition else []
        with _step("run"):
            conn.execute(tables.run.insert(), {**ingest.run, "flags": _final_flags(ingest), "run_key": key})
        counts["run"] = 1
        for attr, table in _CHILD_TABLES:
            rows = [_full_row(table, row, run_id) for row in getattr(ingest, attr)]
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
    """run_ids of the plan's runs whose status is 'complete' (the ones `tcplab run` skips)."""
    stmt = select(tables.run.c.run_id).where(tables.run.c.plan_sha256 == plan_sha256,
                                             tables.run.c.status == "complete")
    with engine.connect() as conn:
        return set(conn.scalars(stmt))
