"""Per-packet queue delay at a sender's own egress (docs/metrics.md#m-qdelay, method (a)): from a queue trace of
the interface -- net:net_dev_queue (an skb enters the qdisc chain), qdisc:qdisc_dequeue (the chain's root hands
an skb on) and net:net_dev_xmit (the driver took a packet) -- and the capture on the same interface, which sees
each packet as the driver gets it and so names its flow.

TCP hands the qdisc GSO super-packets even with `gso off` on the device (a 6.x kernel always sets GSO in a TCP
socket's route capabilities): the chain queues, counts and drops the super-packet, which is cut into MTU
packets only after it left the chain, each with an skb of its own. So a packet's entry into the chain is its
super-packet's: pairs of queue and dequeue events by skb address give each super-packet's entry; every xmit
belongs to the dequeue just before it in the trace (the root qdisc is run by one CPU at a time, which dequeues
and hands the segments to the driver in one go); each captured packet is the xmit nearest in time with the same
frame length (ip_len + 14), within MAX_MATCH_NS. The segments of one super-packet leave microseconds apart and
the next super-packet only when the chain releases it, so a packet matched to a neighbour of its own xmit
still gets its own super-packet's entry; the packet's own capture stamp is its departure.

sojourn = t_capture - t_queue - the chain's constant netem delay: the time from entering the chain to leaving
for the wire. The tracepoints print microseconds. A queue event with no dequeue of its address after it never
left (dropped in the chain); such packets have no capture to name their flow and are only counted.

Pure and vectorised (Arrow string kernels as the tcp_probe parser, numpy sorts and searches; no Python object
per event or packet).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from orchestrator.ingest.tracetext import hex_column, trace_ns
from orchestrator.storage import records

EVENTS = np.dtype([("ts_ns", "i8"), ("order", "i8"), ("skb", "u8"), ("len", "i4"), ("kind", "i1")])
QUEUE, DEQUEUE, XMIT = 0, 1, 2
XMITS = np.dtype([("ts_in_ns", "i8"), ("ts_xmit_ns", "i8"), ("len", "i4")])
_MARKERS = {QUEUE: ": net_dev_queue: ", DEQUEUE: ": qdisc_dequeue: ", XMIT: ": net_dev_xmit: "}
# the fields each event's text carries, in order: (position among its space-separated tokens, key)
_LAYOUT = {QUEUE: ((1, "skbaddr"), (2, "len")), DEQUEUE: ((6, "packets"), (7, "skbaddr")),
           XMIT: ((1, "skbaddr"), (2, "len"), (3, "rc"))}
MAX_MATCH_NS = 50_000   # a capture stamp and its xmit: one driver call apart (p50 0.3 µs, p90 7 µs measured)
ETH_HEADER = 14


class QueueTraceFormatError(ValueError):
    """A queue-trace line the parser does not understand; says which event."""


def _columns(events: pa.Array, kind: int) -> dict[str, pa.Array] | None:
    marker = _MARKERS[kind]
    halves = pc.split_pattern(events, marker, max_splits=1)
    stamp = pc.list_element(pc.split_pattern(pc.list_element(halves, 0), " ", max_splits=1, reverse=True), 1)
    sec_frac = pc.split_pattern(stamp, ".", max_splits=1)
    tokens = pc.split_pattern(pc.list_element(halves, 1), " ")
    last = max(i for i, _ in _LAYOUT[kind])
    if pc.min(pc.list_value_length(sec_frac)).as_py() != 2 or pc.min(pc.list_value_length(tokens)).as_py() <= last:
        return None
    out = {"sec": pc.list_element(sec_frac, 0), "frac": pc.list_element(sec_frac, 1)}
    offsets = tokens.offsets.to_numpy()
    flat, first = tokens.flatten(), offsets[:-1] - offsets[0]
    for i, key in _LAYOUT[kind]:
        col = flat.take(pa.array(first + i))
        if not pc.all(pc.starts_with(col, key + "=")).as_py():
            return None
        out[key] = pc.utf8_slice_codeunits(col, len(key) + 1)
    return out


def parse_queue_trace(text: str, clock_offset_ns: int) -> np.ndarray:
    """EVENTS rows in trace order (ts_ns in the run's clock: the trace clock plus `clock_offset_ns`; `order` the
    line's place in the file, which breaks ties of the microsecond stamps). Dequeues of no packet and xmits the
    driver refused (rc != 0: the packet is requeued and sent again) are left out."""
    lines = pc.split_pattern(pa.array([text]), "\n").flatten()
    parts = []
    for kind, marker in _MARKERS.items():
        hit = pc.match_substring(lines, marker)
        sel = pc.filter(lines, hit)
        if len(sel) == 0:
            continue
        f = _columns(sel, kind)
        if f is None:
            raise QueueTraceFormatError(f"queue trace: a{marker.strip(': ')} event is not in the known format")
        try:
            ts = trace_ns(pc.cast(f["sec"], pa.int64()).to_numpy(), f["frac"]) + clock_offset_ns
            length = pc.cast(f["len"], pa.int32()).to_numpy() if "len" in f else np.zeros(len(sel), np.int32)
            keep = np.ones(len(sel), bool)
            if "rc" in f:
                keep = pc.cast(f["rc"], pa.int32()).to_numpy() == 0
            if "packets" in f:
                keep = pc.cast(f["packets"], pa.int32()).to_numpy() > 0
        except (pa.ArrowInvalid, ValueError) as exc:
            raise QueueTraceFormatError(f"queue trace: a number that is not one ({exc})") from None
        skb = hex_column(f["skbaddr"])
        if skb is None:
            raise QueueTraceFormatError("queue trace: an skbaddr that is not hexadecimal")
        part = np.zeros(len(sel), EVENTS)
        part["ts_ns"], part["skb"], part["len"], part["kind"] = ts, skb, length, kind
        part["order"] = pc.indices_nonzero(hit).to_numpy()
        parts.append(part[keep])
    out = np.concatenate(parts) if parts else np.zeros(0, EVENTS)
    return out[np.lexsort((out["order"], out["ts_ns"]))]


@dataclass(frozen=True)
class TraceXmits:
    rows: np.ndarray        # XMITS: each packet the driver took, with its super-packet's entry, by time
    dropped: int            # skbs that entered the chain and never left it


def trace_xmits(events: np.ndarray) -> TraceXmits:
    """Each xmit with the entry time of the skb whose dequeue came last before it (see the module docstring)."""
    qd = events[events["kind"] != XMIT]
    by_addr = qd[np.lexsort((qd["order"], qd["ts_ns"], qd["skb"]))]
    pair = np.flatnonzero((by_addr["kind"][:-1] == QUEUE) & (by_addr["kind"][1:] == DEQUEUE)
                          & (by_addr["skb"][:-1] == by_addr["skb"][1:]))
    entered = by_addr["ts_ns"][pair]                              # per dequeue that closes a pair
    deq_at = by_addr["ts_ns"][pair + 1]
    deq_order = by_addr["order"][pair + 1]
    o = np.argsort(deq_order, kind="stable")
    entered, deq_at, deq_order = entered[o], deq_at[o], deq_order[o]
    xm = events[events["kind"] == XMIT]
    k = np.searchsorted(deq_order, xm["order"], side="right") - 1   # the dequeue before each xmit, in file order
    ok = k >= 0
    rows = np.zeros(int(ok.sum()), XMITS)
    rows["ts_in_ns"], rows["ts_xmit_ns"], rows["len"] = entered[k[ok]], xm["ts_ns"][ok], xm["len"][ok]
    dropped = int((qd["kind"] == QUEUE).sum()) - pair.size
    return TraceXmits(rows, dropped)


def attach(xmits: np.ndarray, packets: np.ndarray, netem_ns: int) -> tuple[np.ndarray, int]:
    """QDELAY rows for the captured packets (fields ts_ns, ip_len, payload_len, ecn, conn_id, by time) that
    match an xmit, and how many captured packets matched none."""
    t = xmits["ts_xmit_ns"]
    if t.size == 0 or packets.size == 0:
        return np.zeros(0, records.QDELAY), int(packets.size)
    pos = np.clip(np.searchsorted(t, packets["ts_ns"]), 0, t.size - 1)
    left = np.maximum(pos - 1, 0)
    near = np.where(np.abs(t[left] - packets["ts_ns"]) <= np.abs(t[pos] - packets["ts_ns"]), left, pos)
    gap = np.abs(t[near] - packets["ts_ns"])
    keep = np.flatnonzero((gap <= MAX_MATCH_NS) & (xmits["len"][near] == packets["ip_len"] + ETH_HEADER))
    x = xmits[near[keep]]
    out = np.zeros(keep.size, records.QDELAY)
    out["conn_id"] = packets["conn_id"][keep]
    out["ts_in_ns"], out["ts_out_ns"] = x["ts_in_ns"], packets["ts_ns"][keep]
    out["sojourn_ns"] = packets["ts_ns"][keep] - x["ts_in_ns"] - netem_ns
    out["payload_len"] = packets["payload_len"][keep]
    out["ce"] = (packets["ecn"][keep] == 3).astype(np.int16)
    return out, int(packets.size - keep.size)
