"""RunIngest: everything the result database holds about one run, and the pure checks of it.

Per-packet data are numpy arrays of the orchestrator/storage/records.py dtypes, or re-iterable sources of such
arrays (e.g. a PcapReader, streamed chunk by chunk). `validate` refuses, before the database is touched, any
RunIngest the writer (orchestrator/storage/writer.py) would refuse; `BULK_LAYOUTS` say how each per-sample
field maps onto its table.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
from sqlalchemy import Table

from orchestrator.storage import records, tables
from orchestrator.storage.conns import ConnRegistry

RUN_STATUSES = ("complete", "failed", "refused")   # refused: preflight said no, no host touched
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
    hosts: list[dict[str, Any]] = field(default_factory=list)             # run_host rows
    events: list[dict[str, Any]] = field(default_factory=list)            # run_event rows
    packets: list[tuple[str, PacketSource]] = field(default_factory=list)
    capture_points: dict[str, dict[str, Any]] = field(default_factory=dict)
    conns: ConnRegistry | None = None
    qdelay: list[tuple[str, Any]] = field(default_factory=list)  # (ingress point, QDELAY array or chunks)
    qdelay_pairs: list[dict[str, Any]] = field(default_factory=list)      # qdelay_pair rows
    tcp_probe: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (host, TCP_PROBE)
    qdisc_samples: list[tuple[str, str, np.ndarray]] = field(default_factory=list)  # (host, iface, ..)
    ss_samples: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (host, SS_SAMPLE)
    iperf_intervals: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (flow_id, ..)
    kernel_trace: list[tuple[str, np.ndarray]] = field(default_factory=list)  # (host, KERNEL_TRACE)
    app_writes: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (flow_id, APP_WRITE)
    bulk_sends: dict[int, dict[str, Any]] = field(default_factory=dict)  # flow_id -> its bulk sender's log entry
    packet_observers: tuple[PacketObserver, ...] = ()   # folds whose flags join the run row before it is written


@dataclass(frozen=True)
class IngestCounts:
    """Rows per table written by write_run (or removed by delete_run)."""

    plan: int = 0
    run: int = 0
    flow: int = 0
    artifact: int = 0
    host_evidence: int = 0
    run_host: int = 0
    run_event: int = 0
    capture_point: int = 0
    conn: int = 0
    packet: int = 0
    qdelay: int = 0
    qdelay_pair: int = 0
    tcp_probe: int = 0
    qdisc_sample: int = 0
    ss_sample: int = 0
    iperf_interval: int = 0
    kernel_trace: int = 0
    app_write: int = 0

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


def _app_write_nulls(arr: np.ndarray) -> dict[str, np.ndarray]:
    # a latency may be negative (clock offsets of two hosts): NULL follows the time it is taken from
    none_arrived, none_read = arr["arrive_ns"] == -1, arr["read_ns"] == -1
    return {"arrive_ns": none_arrived, "latency_ns": none_arrived, "read_ns": none_read,
            "read_latency_ns": none_read}


def _ss_nulls(arr: np.ndarray) -> dict[str, np.ndarray]:
    return records.null_masks(arr, records.SS_NULLABLE)


BULK_LAYOUTS = (
    BulkLayout("qdelay", tables.qdelay, (), records.QDELAY, labels=("ingress point",), streamed=True,
               nulls=_qdelay_nulls),
    BulkLayout("tcp_probe", tables.tcp_probe, ("host",), records.TCP_PROBE),
    BulkLayout("qdisc_samples", tables.qdisc_sample, ("host", "interface"), records.QDISC_SAMPLE),
    BulkLayout("ss_samples", tables.ss_sample, ("host",), records.SS_SAMPLE, nulls=_ss_nulls),
    BulkLayout("iperf_intervals", tables.iperf_interval, ("flow_id",), records.IPERF_INTERVAL),
    BulkLayout("kernel_trace", tables.kernel_trace, ("host",), records.KERNEL_TRACE,
               nulls=lambda arr: records.null_masks(arr, records.KERNEL_TRACE_NULLABLE)),
    BulkLayout("app_writes", tables.app_write, ("flow_id",), records.APP_WRITE, nulls=_app_write_nulls),
)

CHILD_TABLES = (("flows", tables.flow), ("artifacts", tables.artifact), ("evidence", tables.host_evidence),
                 ("qdelay_pairs", tables.qdelay_pair), ("hosts", tables.run_host),
                ("events", tables.run_event))
TABLES_BY_RUN_ID = (tables.iperf_interval, tables.app_write, tables.qdelay_pair, tables.capture_point,
              tables.host_evidence, tables.run_host, tables.kernel_trace, tables.run_event,
              tables.artifact, tables.flow)


ASSIGNED_COLUMNS = {"run": {"run_key"}}  # columns write_run fills in itself


# --- validation (pure) -------------------------------------------------------------------------------

def _required(table: Table) -> set[str]:
    needed = {c.name for c in table.columns if not c.nullable and c.default is None and c.server_default is None}
    return needed - ASSIGNED_COLUMNS.get(table.name, set())


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
    for attr, table in CHILD_TABLES:
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
