"""One run's data as analysis holds it: the narrowed record dtypes, the flows, and a run's arrays already
narrowed to the bottleneck (`RunData`), plus the pure choices made on them (which qdisc handle is the
bottleneck queue, which interface, which sender port a flow used). The DB reading that fills them is
analysis/load.py; the run's configuration is analysis/runmeta.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from analysis.runmeta import RunMeta
from orchestrator.plan import LinkRef
from orchestrator.storage import records

ROOT_PARENTS = frozenset({"root", "", "ffff:ffff", "ffff:"})
"""How a root qdisc's parent may be recorded (tc -j shows "root": true, netlink TC_H_ROOT)."""


def _narrow(dtype: np.dtype, names: Sequence[str]) -> np.dtype:
    return np.dtype([(n, dtype.fields[n][0]) for n in names])


# Only what the metrics read (ports come from the run's `conn` rows, joined in).
PACKET_FIELDS = ("ts_ns", "src_port", "dst_port", "seq", "payload_len", "ip_len", "ecn")
PACKET_DTYPE = _narrow(records.PACKET, PACKET_FIELDS)
# Both directions of a flow at the sender-side capture: RTT from timestamps, FCT, gaps.
SIDE_FIELDS = ("ts_ns", "src_port", "dst_port", "seq", "ack", "payload_len", "ip_len", "tcp_flags", "ecn",
               "tsval", "tsecr")
SIDE_DTYPE = _narrow(records.PACKET, SIDE_FIELDS)
QDELAY_FIELDS = ("ts_in_ns", "sojourn_ns", "payload_len", "ce", "dropped")
QDELAY_DTYPE = np.dtype(_narrow(records.QDELAY, QDELAY_FIELDS).descr + [("src_port", "i4"), ("dst_port", "i4")])
QDISC_FIELDS = ("ts_ns", "handle", "parent", "kind", "packets", "drops", "backlog_bytes", "qlen")
QDISC_DTYPE = _narrow(records.QDISC_SAMPLE, QDISC_FIELDS)
PROBE_FIELDS = ("ts_ns", "sport", "dport", "snd_cwnd", "ssthresh", "srtt_us")
PROBE_DTYPE = _narrow(records.TCP_PROBE, PROBE_FIELDS)
SS_DTYPE = np.dtype([("ts_ns", "i8"), ("sport", "i4"), ("dport", "i4"), ("cwnd", "f8"), ("rtt_us", "f8"),
                     ("dctcp_alpha", "f8")])
"""ss samples (M-SS); NULL columns become NaN (e.g. dctcp_alpha of a non-DCTCP flow)."""
NO_SS_SAMPLES = "no ss samples"


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
    start_skew_ns: int | None = None      # M-STARTSKEW: first data packet - scheduled start (NULL: not measured)
    tool: str = "iperf3"                  # `bulk`: connected before its start, so M-FCT starts at its first data


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
    # detail (load_run(..., detail=True)): queue delay rows of the flows, both directions of each flow at
    # the sender-side capture, ss samples (or why there are none)
    qdelay: np.ndarray = field(default_factory=lambda: np.empty(0, QDELAY_DTYPE))
    sender_point: str | None = None
    sender_side: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    ss: np.ndarray = field(default_factory=lambda: np.empty(0, SS_DTYPE))
    ss_note: str = NO_SS_SAMPLES
    events: tuple = ()   # analysis.events.EventRow of the run's timed plan events


# ---------------------------------------------------------------------------- choices on the data

def pick_interface(interfaces: list[str], link: LinkRef | None) -> str:
    """The sampled interface that is the bottleneck link: the only one, else one named after the link
    (the DB stores the real interface name, which the spec does not know), else the first by name."""
    interfaces = sorted(interfaces)
    if len(interfaces) > 1 and link is not None:
        for name in interfaces:
            if name in (link.label, f"to-{link.toward}") or link.toward in name:
                return name
    return interfaces[0]


def pick_queue_handle(samples: np.ndarray) -> str | None:
    """The handle carrying the bottleneck queue's backlog: the root qdisc (htb/tbf count their children's
    backlog), stepping below any netem, whose backlog is its delay line (packets on the emulated wire, not
    queued: netem 10 ms at 20 Mbit/s holds 25 kB). Without a root sample: the largest summed backlog."""
    if samples.size == 0:
        return None
    roots = sorted(set(samples["handle"][np.isin(samples["parent"], sorted(ROOT_PARENTS))]))
    if not roots:
        handles = np.unique(samples["handle"])
        totals = [samples["backlog_bytes"][samples["handle"] == h].sum() for h in handles]
        return str(handles[int(np.argmax(totals))])
    kinds = dict(zip(samples["handle"].tolist(), samples["kind"].tolist(), strict=True))
    parents = dict(zip(samples["handle"].tolist(), samples["parent"].tolist(), strict=True))
    handle = str(roots[0])
    while kinds.get(handle) == "netem":
        children = sorted(h for h, parent in parents.items() if parent.startswith(handle) and h != handle)
        if not children:
            break
        handle = children[0]
    return handle


def dominant_port(ports: np.ndarray, weights: np.ndarray) -> int | None:
    """The port carrying the most weight (bytes or events), or None if there is none.

    Needed when the flow table has no sender port: iperf3's control connection uses the same
    receiver port as the data stream but carries only a few hundred bytes and ACKs."""
    if ports.size == 0:
        return None
    uniq, inverse = np.unique(ports, return_inverse=True)
    return int(uniq[int(np.argmax(np.bincount(inverse, weights=weights)))])


def own_rows(arr: np.ndarray, f: FlowInfo, ports: str) -> np.ndarray:
    """Rows of one flow's connection: `ports` names the (sender, receiver) port fields' order."""
    a, b = ("src_port", "dst_port") if ports == "data" else ("dst_port", "src_port")
    mask = arr[b] == f.dst_port
    return arr[mask & (arr[a] == f.src_port)] if f.src_port is not None else arr[mask]
