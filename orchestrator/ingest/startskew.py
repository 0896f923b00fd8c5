"""M-STARTSKEW: when each flow really started against when it was scheduled, from the captures.

A flow's measured start is the first SYN of its data connection (sender port -> receiver port, SYN without
ACK) at the capture point nearest its sender: a capture on the sender itself, else one on the interface
facing the sender, else the first point that saw the SYN. Its timestamp, in the capture host's clock, is
brought to the manager's clock with the offsets the engine measured before the run
(assemble.clock_offsets): skew = (syn_ts - offset[capture host]) - (T0 + start_s), T0 being in the manager's
clock. The fold (`StartTally`) sees the packets chunk by chunk while the writer streams them, vectorised: no
Python object per packet.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from orchestrator.plan import RunSpec
from orchestrator.storage.records import PROTO_TCP

SYN, ACK = 0x02, 0x10


def first_syns(chunk: np.ndarray, keys: np.ndarray) -> dict[int, int]:
    """(src_port << 16 | dst_port) of `keys` -> the earliest ts_ns of a SYN (no ACK) with that port pair in
    the chunk; keys absent from the chunk are left out. A key with dst_port only (src_port 0, the sender's
    port unknown) matches any source port."""
    if not chunk.size or not keys.size:
        return {}
    flags = chunk["tcp_flags"].astype(np.int32)
    syn = chunk[(chunk["proto"] == PROTO_TCP) & (flags & SYN != 0) & (flags & ACK == 0)]
    if not syn.size:
        return {}
    full = syn["src_port"].astype(np.int64) << 16 | syn["dst_port"].astype(np.int64)
    out: dict[int, int] = {}
    for key in keys.tolist():
        m = (full == key) if key >> 16 else (syn["dst_port"].astype(np.int64) == key)
        if m.any():
            out[key] = int(syn["ts_ns"][m].min())
    return out


def point_rank(spec: RunSpec, flow_src: str, label: str) -> int:
    """How near a capture point ("host:to-role") is to a flow's sender: 0 on the sender, 1 facing it, 2 other."""
    host, _, toward = label.partition(":")
    return 0 if host == flow_src else 1 if toward == f"to-{flow_src}" else 2


def flow_key(row: Mapping) -> int:
    return (int(row["src_port"] or 0) << 16) | int(row["dst_port"])


def start_values(spec: RunSpec, flow_rows: list[dict], t0_ns: int | None, seen: Mapping[tuple[str, int], int],
                 point_hosts: Mapping[str, str], offsets: Mapping[str, int]) -> dict[int, dict]:
    """flow_id -> its flow columns: scheduled_start_ns, measured_start_ns, start_skew_ns, start_point (None
    where unknown). `seen`: (capture point, flow key) -> first SYN ts_ns in that point's host clock."""
    out: dict[int, dict] = {}
    src_of = {f.flow_id: f.src for f in spec.flows}
    start_of = {f.flow_id: f.start_s for f in spec.flows}
    for row in flow_rows:
        fid = row["flow_id"]
        scheduled = t0_ns + int(start_of.get(fid, 0.0) * 1e9) if t0_ns is not None else None
        key = flow_key(row)
        points = sorted((p for (p, k) in seen if k == key), key=lambda p: (point_rank(spec, src_of.get(fid, ""), p), p))
        values = {"scheduled_start_ns": scheduled, "measured_start_ns": None, "start_skew_ns": None,
                  "start_point": None}
        if points:
            point = points[0]
            measured = seen[(point, key)] - int(offsets.get(point_hosts.get(point, ""), 0))
            values.update(measured_start_ns=measured, start_point=point,
                          start_skew_ns=measured - scheduled if scheduled is not None else None)
        out[fid] = values
    return out


class StartTally:
    """The packet fold for M-STARTSKEW: `observe` each (capture point, chunk), then `flow_values()`."""

    def __init__(self, spec: RunSpec, flow_rows: list[dict], t0_ns: int | None, point_hosts: Mapping[str, str],
                 offsets: Mapping[str, int]) -> None:
        self.spec, self.flow_rows, self.t0_ns = spec, flow_rows, t0_ns
        self.point_hosts, self.offsets = point_hosts, offsets
        self.keys = np.array(sorted({flow_key(r) for r in flow_rows}), dtype=np.int64)
        self.seen: dict[tuple[str, int], int] = {}

    def observe(self, point: str, chunk: np.ndarray) -> None:
        for key, ts in first_syns(chunk, self.keys).items():
            if ts < self.seen.get((point, key), ts + 1):
                self.seen[(point, key)] = ts

    def flags(self) -> list[dict]:
        return []

    def flow_values(self) -> dict[int, dict]:
        return start_values(self.spec, self.flow_rows, self.t0_ns, self.seen, self.point_hosts, self.offsets)
