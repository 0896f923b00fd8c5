"""Reading ingested runs from the result DB into RunMeta and RunData (the only DB reader besides
analysis/select.py, which only resolves selectors to run ids).

One run at a time: a run's packets are fetched column-wise in chunks straight into structured arrays
(the narrowed dtypes of analysis/rundata.py), so no per-packet Python objects outlive a chunk. Which
capture point and which qdisc form "the bottleneck", and which capture is on the sender side (for RTT,
FCT and gaps), comes from the run's spec through RunMeta (analysis/runmeta.py).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from analysis.events import load_events
from analysis.rundata import (
    NO_SS_SAMPLES,
    PACKET_DTYPE,
    PROBE_DTYPE,
    PROBE_FIELDS,
    QDELAY_DTYPE,
    QDELAY_FIELDS,
    QDISC_DTYPE,
    QDISC_FIELDS,
    SIDE_DTYPE,
    SS_DTYPE,
    FlowInfo,
    RunData,
    dominant_port,
    own_rows,
    pick_interface,
    pick_queue_handle,
)
from analysis.runmeta import RunMeta, read_spec
from orchestrator.plan import LinkRef
from orchestrator.storage import packet_store
from orchestrator.storage import tables as T
from schemas.flag import Flag

FETCH_CHUNK = 100_000


def _to_array(conn: Connection, stmt: sa.Select, dtype: np.dtype) -> np.ndarray:
    """Run a select whose columns are dtype's fields in order, into a structured array."""
    parts: list[np.ndarray] = []
    result = conn.execution_options(stream_results=True).execute(stmt)
    for chunk in result.partitions(FETCH_CHUNK):
        arr = np.empty(len(chunk), dtype=dtype)
        for name, column in zip(dtype.names, zip(*chunk, strict=True), strict=True):
            arr[name] = column
        parts.append(arr)
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def list_runs(conn: Connection, run_ids: Iterable[str] | None = None) -> list[RunMeta]:
    """Runs in the given order, or every complete run ordered by run_id (failed runs hold partial
    data that would mislead a table; ask for them by id to see them)."""
    r = T.run
    stmt = sa.select(r.c.run_id, r.c.status, r.c.params, r.c.spec, r.c.t0_ns, r.c.duration_s, r.c.plan_name,
                     r.c.experiment, r.c.repetition, r.c.tags, r.c.flags)
    if run_ids is None:
        stmt = stmt.where(r.c.status == "complete").order_by(r.c.run_id)
    else:
        wanted = list(run_ids)
        stmt = stmt.where(r.c.run_id.in_(wanted))
    metas = {}
    for row in conn.execute(stmt):
        metas[row.run_id] = RunMeta(run_id=row.run_id, status=row.status, params=dict(row.params or {}),
                                    t0_ns=row.t0_ns, duration_s=row.duration_s, plan_name=row.plan_name,
                                    experiment=row.experiment, repetition=row.repetition,
                                    tags=tuple(str(t) for t in row.tags or ()), spec=read_spec(row.spec),
                                    flags=tuple(str(Flag.from_stored(f)) for f in row.flags or ()))
    if run_ids is None:
        return list(metas.values())
    missing = [i for i in wanted if i not in metas]
    if missing:
        raise KeyError(f"runs not in the database: {', '.join(missing)}")
    return [metas[i] for i in wanted]


def load_flows(conn: Connection, run_id: str) -> list[FlowInfo]:
    f = T.flow
    stmt = sa.select(f.c.flow_id, f.c.src_host, f.c.dst_host, f.c.src_port, f.c.dst_port, f.c.cc,
                     f.c.start_s, f.c.duration_s, f.c.start_skew_ns, f.c.tool
                     ).where(f.c.run_id == run_id).order_by(f.c.flow_id)
    return [FlowInfo(**row._mapping) for row in conn.execute(stmt)]


def _run_key(conn: Connection, run_id: str) -> int | None:
    return conn.execute(sa.select(T.run.c.run_key).where(T.run.c.run_id == run_id)).scalar()


def _conns_at(conn: Connection, key: int | None, point: str) -> np.ndarray:
    """(conn_id, src_port, dst_port) of every conn of a run at one capture point."""
    c = T.conn
    rows = conn.execute(sa.select(c.c.conn_id, c.c.src_port, c.c.dst_port)
                        .where(c.c.run_key == key, c.c.point == point)).all()
    return np.array([tuple(r) for r in rows], dtype=[("conn_id", "i4"), ("src_port", "i4"), ("dst_port", "i4")])


def _packets_of(conn: Connection, key: int | None, conns: np.ndarray, dtype: np.dtype,
                data_only: bool = False) -> np.ndarray:
    """The packets of `conns` (rows of _conns_at) by time, as `dtype`: the value fields read through
    orchestrator/storage/packet_store.py (blocks on PostgreSQL, rows on SQLite), the ports from the conns."""
    if conns.size == 0:
        return np.empty(0, dtype)
    fields = [n for n in dtype.names if n not in ("src_port", "dst_port")]
    pkts = packet_store.read_packets(conn, key, conns["conn_id"].tolist(), fields)
    if data_only:
        pkts = pkts[pkts["payload_len"] > 0]
    row_of_conn = np.zeros(int(conns["conn_id"].max()) + 1, np.int64)
    row_of_conn[conns["conn_id"]] = np.arange(conns.size)
    row = row_of_conn[pkts["conn_id"]]
    out = np.empty(pkts.size, dtype)
    for name in dtype.names:
        out[name] = conns[name][row] if name in ("src_port", "dst_port") else pkts[name]
    return out


def load_packets(conn: Connection, key: int | None, point: str,
                 dst_ports: Sequence[int] | None = None) -> np.ndarray:
    """Data packets (payload > 0) of a run (its run_key) at one capture point, optionally to some ports,
    by time."""
    conns = _conns_at(conn, key, point)
    if dst_ports is not None:
        conns = conns[np.isin(conns["dst_port"], list(dst_ports))]
    return _packets_of(conn, key, conns, PACKET_DTYPE, data_only=True)


def load_bottleneck_qdisc(conn: Connection, key: int | None,
                          link: LinkRef | None) -> tuple[str | None, np.ndarray]:
    """(handle, time-ordered samples) of the bottleneck queue (pick_queue_handle); (None, empty) if none."""
    q = T.qdisc_sample
    where = [q.c.run_key == key]
    pairs = conn.execute(sa.select(q.c.host, q.c.interface).where(*where).distinct()).all()
    if not pairs:
        return None, np.empty(0, QDISC_DTYPE)
    hosts = {h for h, _ in pairs}
    host = link.host if link is not None and link.host in hosts else sorted(hosts)[0]
    iface = pick_interface([i for h, i in pairs if h == host], link)
    where += [q.c.host == host, q.c.interface == iface]
    stmt = sa.select(*(q.c[n] for n in QDISC_FIELDS)).where(*where).order_by(q.c.ts_ns)
    samples = _to_array(conn, stmt, QDISC_DTYPE)
    handle = pick_queue_handle(samples)
    return handle, samples[samples["handle"] == handle]


def load_probe(conn: Connection, key: int | None, dports: Sequence[int] | None = None) -> np.ndarray:
    """tcp_probe events of a run, optionally only those whose remote port is a receiver's port."""
    t = T.tcp_probe
    stmt = (sa.select(*(t.c[n] for n in PROBE_FIELDS)).where(t.c.run_key == key)
            .order_by(t.c.ts_ns))
    if dports is not None:
        stmt = stmt.where(t.c.dport.in_(list(dports)))
    return _to_array(conn, stmt, PROBE_DTYPE)


def load_qdelay(conn: Connection, key: int | None, dst_ports: Sequence[int]) -> np.ndarray:
    """Queue-delay rows (paired aqm captures) of the connections to the given receiver ports, by
    arrival time at the queue, with their ingress conn's ports joined in."""
    q, c = T.qdelay, T.conn
    # a dropped packet has NULL sojourn: -1 keeps the column integer (the `dropped` flag says which)
    cols = [sa.func.coalesce(q.c[n], -1) if n == "sojourn_ns" else q.c[n] for n in QDELAY_FIELDS]
    cols += [c.c.src_port, c.c.dst_port]
    stmt = (sa.select(*cols).select_from(q.join(c, sa.and_(c.c.run_key == q.c.run_key, c.c.conn_id == q.c.conn_id)))
            .where(q.c.run_key == key, c.c.dst_port.in_(list(dst_ports)))
            .order_by(q.c.ts_in_ns))
    return _to_array(conn, stmt, QDELAY_DTYPE)


def load_side_packets(conn: Connection, key: int | None, point: str, ports: Sequence[int]) -> np.ndarray:
    """Every packet (both directions, handshake included) at a capture point whose source or
    destination port is one of the receiver ports, by time."""
    conns = _conns_at(conn, key, point)
    ports = list(ports)
    conns = conns[np.isin(conns["dst_port"], ports) | np.isin(conns["src_port"], ports)]
    return _packets_of(conn, key, conns, SIDE_DTYPE)


def ss_table(conn: Connection) -> sa.Table | None:
    """The `ss_sample` table if this schema and this database have it (it is being added to the schema
    separately; older databases lack it), else None."""
    if "ss_sample" not in sa.inspect(conn).get_table_names():
        return None
    known = T.metadata.tables.get("ss_sample")
    return known if known is not None else sa.Table("ss_sample", sa.MetaData(), autoload_with=conn)


def load_ss(conn: Connection, run_id: str, key: int | None, dports: Sequence[int]) -> tuple[np.ndarray, str]:
    """(ss samples of the flows' sender sockets, note). The note says why there are none: no ss_sample
    table, or no rows for this run; it is empty when samples were found."""
    t = ss_table(conn)
    if t is None:
        return np.empty(0, SS_DTYPE), f"{NO_SS_SAMPLES} (the database has no ss_sample table)"
    of_run = t.c.run_key == key if "run_key" in t.c else t.c.run_id == run_id
    cols = [t.c[n] if n in t.c else sa.null() for n in SS_DTYPE.names]
    stmt = sa.select(*cols).where(of_run, t.c.dport.in_(list(dports))).order_by(t.c.ts_ns)
    arr = _to_array(conn, stmt, SS_DTYPE)      # NULL into a float field becomes NaN
    return arr, ("" if arr.size else f"{NO_SS_SAMPLES} (none recorded for this run)")


def load_run(conn: Connection, meta: RunMeta, detail: bool = False) -> RunData:
    """Flows, per-flow bottleneck packets, bottleneck qdisc samples and tcp_probe events of one run;
    with detail also the flows' queue-delay rows, sender-side packets (data, acks) and ss samples.

    A flow whose src_port is NULL gets the dominant sender port among packets (else tcp_probe events)
    to its receiver port, so the iperf3 control connection never mixes into the data flow.
    """
    flows = load_flows(conn, meta.run_id)
    key = _run_key(conn, meta.run_id)          # once per run: every table below is keyed by it
    ports = [f.dst_port for f in flows]
    pkts = np.empty(0, PACKET_DTYPE)
    if meta.capture_point is not None and flows:
        pkts = load_packets(conn, key, meta.capture_point, ports)
    probe = load_probe(conn, key, ports) if ports else np.empty(0, PROBE_DTYPE)
    resolved: list[FlowInfo] = []
    packets: dict[int, np.ndarray] = {}
    for f in flows:
        to_f = pkts["dst_port"] == f.dst_port
        sport = f.src_port
        if sport is None:
            sport = dominant_port(pkts["src_port"][to_f], pkts["payload_len"][to_f])
        if sport is None:
            at_f = probe["dport"] == f.dst_port
            sport = dominant_port(probe["sport"][at_f], np.ones(int(at_f.sum())))
        resolved.append(replace(f, src_port=sport))
        packets[f.flow_id] = pkts[to_f & (pkts["src_port"] == sport)] if sport is not None else pkts[to_f]
    handle, qdisc = load_bottleneck_qdisc(conn, key, meta.bottleneck)
    data = RunData(meta=meta, flows=resolved, packets=packets, qdisc=qdisc, qdisc_handle=handle, probe=probe,
                   events=tuple(load_events(conn, meta.run_id)))
    return _with_detail(conn, key, data) if detail and resolved else data


def _with_detail(conn: Connection, key: int | None, data: RunData) -> RunData:
    meta, flows = data.meta, data.flows
    ports = [f.dst_port for f in flows]
    qdelay = load_qdelay(conn, key, ports)
    qdelay = np.concatenate([own_rows(qdelay, f, "data") for f in flows]) if flows else qdelay
    senders = sorted({f.src_host for f in flows})
    point = meta.sender_point(senders[0]) if senders else None
    side: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if point is not None:
        pkts = load_side_packets(conn, key, point, ports)
        side = {f.flow_id: (own_rows(pkts, f, "data"), own_rows(pkts, f, "ack")) for f in flows}
    ss, note = load_ss(conn, meta.run_id, key, ports)
    return replace(data, qdelay=qdelay[np.argsort(qdelay["ts_in_ns"], kind="stable")], sender_point=point,
                   sender_side=side, ss=ss, ss_note=note)


def iter_runs(engine: Engine, run_ids: Iterable[str] | None = None, detail: bool = False) -> Iterable[RunData]:
    """Load runs one after another, so only one run's arrays are in memory at a time."""
    with engine.connect() as conn:
        for meta in list_runs(conn, run_ids):
            yield load_run(conn, meta, detail)
