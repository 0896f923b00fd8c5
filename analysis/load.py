"""Reading ingested runs from the result DB into typed metadata and numpy arrays (the only DB reader).

One run at a time: a run's packets are fetched column-wise in chunks straight into structured arrays
(narrowed dtypes taken from orchestrator/ingest/records.py), so no per-packet Python objects outlive a
chunk. Which capture point and which qdisc form "the bottleneck" is decided here from the run's spec.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from orchestrator.ingest import records
from orchestrator.plan.runspec import LinkRef
from orchestrator.storage import tables as T

FETCH_CHUNK = 100_000
ROOT_PARENTS = frozenset({"root", "", "ffff:ffff", "ffff:"})
"""How a root qdisc's parent may be recorded (tc -j shows "root": true, netlink TC_H_ROOT)."""


def _narrow(dtype: np.dtype, names: Sequence[str]) -> np.dtype:
    return np.dtype([(n, dtype.fields[n][0]) for n in names])


# Only what the metrics read (ports come from the run's `conn` rows, joined in).
PACKET_FIELDS = ("ts_ns", "src_port", "dst_port", "seq", "payload_len", "ip_len")
PACKET_DTYPE = _narrow(records.PACKET, PACKET_FIELDS)
QDISC_FIELDS = ("ts_ns", "handle", "parent", "kind", "drops", "backlog_bytes", "qlen")
QDISC_DTYPE = _narrow(records.QDISC_SAMPLE, QDISC_FIELDS)
PROBE_FIELDS = ("ts_ns", "sport", "dport", "snd_cwnd", "ssthresh", "srtt_us")
PROBE_DTYPE = _narrow(records.TCP_PROBE, PROBE_FIELDS)


@dataclass(frozen=True)
class FlowInfo:
    """One row of the `flow` table; src_port is NULL when the sender's port was not recorded."""

    flow_id: int
    src_host: str
    dst_host: str
    src_port: int | None
    dst_port: int
    cc: str
    start_s: float
    duration_s: float


@dataclass(frozen=True)
class RunMeta:
    """A run's identity and the parameters tables and plot titles are made from."""

    run_id: str
    status: str
    params: dict[str, Any]
    t0_ns: int | None
    duration_s: float
    capture_point: str | None
    bottleneck: LinkRef | None

    @property
    def cc(self) -> str:
        return str(self.params.get("cc", ""))

    @property
    def rate_bit(self) -> int | None:
        rate = self.params.get("rate_bit")
        return int(rate) if rate is not None else None

    @property
    def flows(self) -> int | None:
        n = self.params.get("flows")
        return int(n) if n is not None else None


@dataclass(frozen=True)
class RunData:
    """Everything the run table and the report need from one run, already narrowed to the bottleneck.

    flows: src_port resolved where the flow table had NULL (see load_run). packets: per flow_id, the
    flow's data packets at the capture point (payload > 0, time-ordered). qdisc: samples of the
    bottleneck qdisc handle (time-ordered). probe: tcp_probe events whose remote port is a flow's
    receiver port (sender-side events of the data and control connections).
    """

    meta: RunMeta
    flows: list[FlowInfo]
    packets: dict[int, np.ndarray] = field(default_factory=dict)
    qdisc: np.ndarray = field(default_factory=lambda: np.empty(0, QDISC_DTYPE))
    qdisc_handle: str | None = None
    probe: np.ndarray = field(default_factory=lambda: np.empty(0, PROBE_DTYPE))


# ---------------------------------------------------------------------------- spec interpretation

def _link(obj: Any) -> LinkRef | None:
    try:
        return LinkRef.model_validate(obj)
    except ValueError:
        return None


def bottleneck_of(spec: dict[str, Any]) -> tuple[str | None, LinkRef | None]:
    """(capture point label, qdisc-stats link) of a run spec.

    The bottleneck link is the first qdisc_stats link; goodput is read at the capture on that link
    (downstream of the queue), else at the run's first capture point.
    """
    captures = [c for c in (_link(c.get("link")) for c in spec.get("captures") or []) if c]
    stats = [s for s in (_link(s) for s in spec.get("qdisc_stats") or []) if s]
    link = stats[0] if stats else None
    point = next((c.label for c in captures if c == link), None)
    if point is None and captures:
        point = captures[0].label
    return point, link


# ---------------------------------------------------------------------------- reading

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
    stmt = sa.select(r.c.run_id, r.c.status, r.c.params, r.c.spec, r.c.t0_ns, r.c.duration_s)
    if run_ids is None:
        stmt = stmt.where(r.c.status == "complete").order_by(r.c.run_id)
    else:
        wanted = list(run_ids)
        stmt = stmt.where(r.c.run_id.in_(wanted))
    metas = {}
    for row in conn.execute(stmt):
        point, link = bottleneck_of(row.spec or {})
        metas[row.run_id] = RunMeta(run_id=row.run_id, status=row.status, params=dict(row.params or {}),
                                    t0_ns=row.t0_ns, duration_s=row.duration_s,
                                    capture_point=point, bottleneck=link)
    if run_ids is None:
        return list(metas.values())
    missing = [i for i in wanted if i not in metas]
    if missing:
        raise KeyError(f"runs not in the database: {', '.join(missing)}")
    return [metas[i] for i in wanted]


def load_flows(conn: Connection, run_id: str) -> list[FlowInfo]:
    f = T.flow
    stmt = sa.select(f.c.flow_id, f.c.src_host, f.c.dst_host, f.c.src_port, f.c.dst_port, f.c.cc,
                     f.c.start_s, f.c.duration_s).where(f.c.run_id == run_id).order_by(f.c.flow_id)
    return [FlowInfo(**row._mapping) for row in conn.execute(stmt)]


def _run_key(conn: Connection, run_id: str) -> int | None:
    return conn.execute(sa.select(T.run.c.run_key).where(T.run.c.run_id == run_id)).scalar()


def load_packets(conn: Connection, run_id: str, point: str,
                 dst_ports: Sequence[int] | None = None) -> np.ndarray:
    """Data packets (payload > 0) of a run at one capture point, optionally to some ports, by time."""
    p, c = T.packet, T.conn
    key = _run_key(conn, run_id)
    cols = [c.c[n] if n in ("src_port", "dst_port") else p.c[n] for n in PACKET_FIELDS]
    stmt = (sa.select(*cols).select_from(p.join(c, sa.and_(c.c.run_key == p.c.run_key, c.c.conn_id == p.c.conn_id)))
            .where(p.c.run_key == key, c.c.point == point, p.c.payload_len > 0)
            .order_by(p.c.ts_ns))
    if dst_ports is not None:
        stmt = stmt.where(c.c.dst_port.in_(list(dst_ports)))
    return _to_array(conn, stmt, PACKET_DTYPE)


def _pick_interface(interfaces: list[str], link: LinkRef | None) -> str:
    """The sampled interface that is the bottleneck link: the only one, else one named after the link
    (the DB stores the real interface name, which the spec does not know), else the first by name."""
    interfaces = sorted(interfaces)
    if len(interfaces) > 1 and link is not None:
        for name in interfaces:
            if name in (link.label, f"to-{link.toward}") or link.toward in name:
                return name
    return interfaces[0]


def pick_root_handle(samples: np.ndarray) -> str | None:
    """The handle carrying the interface's total backlog: the root qdisc (htb/tbf count their
    children's backlog), else, if no sample is marked root, the handle with the largest summed
    backlog."""
    if samples.size == 0:
        return None
    roots = sorted(set(samples["handle"][np.isin(samples["parent"], sorted(ROOT_PARENTS))]))
    if roots:
        return str(roots[0])
    handles = np.unique(samples["handle"])
    totals = [samples["backlog_bytes"][samples["handle"] == h].sum() for h in handles]
    return str(handles[int(np.argmax(totals))])


def load_bottleneck_qdisc(conn: Connection, run_id: str,
                          link: LinkRef | None) -> tuple[str | None, np.ndarray]:
    """(handle, time-ordered samples) of the bottleneck's root qdisc; (None, empty) if none stored."""
    q = T.qdisc_sample
    where = [q.c.run_key == _run_key(conn, run_id)]
    pairs = conn.execute(sa.select(q.c.host, q.c.interface).where(*where).distinct()).all()
    if not pairs:
        return None, np.empty(0, QDISC_DTYPE)
    hosts = {h for h, _ in pairs}
    host = link.host if link is not None and link.host in hosts else sorted(hosts)[0]
    iface = _pick_interface([i for h, i in pairs if h == host], link)
    where += [q.c.host == host, q.c.interface == iface]
    stmt = sa.select(*(q.c[n] for n in QDISC_FIELDS)).where(*where).order_by(q.c.ts_ns)
    samples = _to_array(conn, stmt, QDISC_DTYPE)
    handle = pick_root_handle(samples)
    return handle, samples[samples["handle"] == handle]


def load_probe(conn: Connection, run_id: str, dports: Sequence[int] | None = None) -> np.ndarray:
    """tcp_probe events of a run, optionally only those whose remote port is a receiver's port."""
    t = T.tcp_probe
    stmt = (sa.select(*(t.c[n] for n in PROBE_FIELDS)).where(t.c.run_key == _run_key(conn, run_id))
            .order_by(t.c.ts_ns))
    if dports is not None:
        stmt = stmt.where(t.c.dport.in_(list(dports)))
    return _to_array(conn, stmt, PROBE_DTYPE)


def dominant_port(ports: np.ndarray, weights: np.ndarray) -> int | None:
    """The port carrying the most weight (bytes or events), or None if there is none.

    Needed when the flow table has no sender port: iperf3's control connection uses the same
    receiver port as the data stream but carries only a few hundred bytes and ACKs."""
    if ports.size == 0:
        return None
    uniq, inverse = np.unique(ports, return_inverse=True)
    return int(uniq[int(np.argmax(np.bincount(inverse, weights=weights)))])


def load_run(conn: Connection, meta: RunMeta) -> RunData:
    """Flows, per-flow bottleneck packets, bottleneck qdisc samples and tcp_probe events of one run.

    A flow whose src_port is NULL gets the dominant sender port among packets (else tcp_probe events)
    to its receiver port, so the iperf3 control connection never mixes into the data flow.
    """
    flows = load_flows(conn, meta.run_id)
    ports = [f.dst_port for f in flows]
    pkts = np.empty(0, PACKET_DTYPE)
    if meta.capture_point is not None and flows:
        pkts = load_packets(conn, meta.run_id, meta.capture_point, ports)
    probe = load_probe(conn, meta.run_id, ports) if ports else np.empty(0, PROBE_DTYPE)
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
    handle, qdisc = load_bottleneck_qdisc(conn, meta.run_id, meta.bottleneck)
    return RunData(meta=meta, flows=resolved, packets=packets, qdisc=qdisc, qdisc_handle=handle,
                   probe=probe)


def iter_runs(engine: Engine, run_ids: Iterable[str] | None = None) -> Iterable[RunData]:
    """Load runs one after another, so only one run's arrays are in memory at a time."""
    with engine.connect() as conn:
        for meta in list_runs(conn, run_ids):
            yield load_run(conn, meta)
