"""M-STARTSKEW: when each flow really started against when it was scheduled, from the captures.

A flow's measured start is its first data packet (payload > 0, sender port -> receiver port) at the capture
point nearest its sender: a capture on the sender itself, else one on the interface facing the sender, else
the first point that saw it. Not the SYN: a `bulk` flow connects before T0 and only its first data byte says
when it started. Bytes a tool sends before its data are left out: iperf3 writes a 37-byte cookie on the data
connection right after connecting, then waits for the test to start (PREAMBLE_BYTES); the first packet that
carries a byte past that preamble (stream offset from the first payload packet seen) is the start. The
timestamp, in the capture host's clock, is brought to the manager's clock with the offsets the engine
measured before the run (assemble.clock_offsets): skew = (data_ts - offset[capture host]) - (T0 + start_s),
T0 being in the manager's clock. The fold (`StartTally`) sees the packets chunk by chunk while the writer
streams them, vectorised: no Python object per packet.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from orchestrator.plan import RunSpec
from orchestrator.storage.records import PROTO_TCP

# bytes a tool writes on the data connection before the flow's data (iperf3: its cookie, COOKIE_SIZE)
PREAMBLE_BYTES = {"iperf3": 37}
SEQ_SPACE = 1 << 32
NOT_SEEN = np.iinfo(np.int64).max


def first_data(chunk: np.ndarray, keys: np.ndarray, preamble: Mapping[int, int],
               base: dict[int, int]) -> dict[int, int]:
    """(src_port << 16 | dst_port) of `keys` -> the earliest ts_ns in the chunk of a data packet with that
    port pair that carries a byte past the key's `preamble` bytes (0 if absent); keys absent are left out.
    `base`: key -> the sequence number of the first payload packet seen so far (the stream's offset 0): read
    and filled in, so a preamble split from its data across chunks is still skipped. A key with dst_port
    only (src_port 0, the sender's port unknown) matches any source port."""
    if not chunk.size or not keys.size:
        return {}
    data = chunk[(chunk["proto"] == PROTO_TCP) & (chunk["payload_len"] > 0)
                 & np.isin(chunk["dst_port"], keys & 0xFFFF)]
    if not data.size:
        return {}
    dport = data["dst_port"].astype(np.int64)
    full = data["src_port"].astype(np.int64) << 16 | dport
    out: dict[int, int] = {}
    for key in keys.tolist():
        m = (full == key) if key >> 16 else (dport == key)
        if not m.any():
            continue
        seq, ts, length = data["seq"][m].astype(np.int64), data["ts_ns"][m], data["payload_len"][m]
        start = base.setdefault(key, int(seq[0]))
        past = (seq - start) % SEQ_SPACE + length > preamble.get(key, 0)
        if past.any():
            out[key] = int(ts[past].min())
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
    where unknown). `seen`: (capture point, flow key) -> first data ts_ns in that point's host clock."""
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
        tools = {f.flow_id: f.tool for f in spec.flows}
        self.preamble = {flow_key(r): PREAMBLE_BYTES.get(tools.get(r["flow_id"], ""), 0) for r in flow_rows}
        self.bases: dict[str, dict[int, int]] = {}
        self.seen: dict[tuple[str, int], int] = {}
        # per point, each key's earliest start so far (NOT_SEEN: none): a chunk is searched only for the keys it
        # could still move earlier, so once every flow has started the fold costs one min() per chunk
        self.earliest: dict[str, np.ndarray] = {}
        self.position = {k: i for i, k in enumerate(self.keys.tolist())}

    def observe(self, point: str, chunk: np.ndarray) -> None:
        if not chunk.size:
            return
        earliest = self.earliest.setdefault(point, np.full(self.keys.size, NOT_SEEN, dtype=np.int64))
        todo = self.keys[earliest > int(chunk["ts_ns"].min())]
        for key, ts in first_data(chunk, todo, self.preamble, self.bases.setdefault(point, {})).items():
            if ts < self.seen.get((point, key), ts + 1):
                self.seen[(point, key)] = ts
                earliest[self.position[key]] = ts

    def flags(self) -> list[dict]:
        return []

    def flow_values(self) -> dict[int, dict]:
        return start_values(self.spec, self.flow_rows, self.t0_ns, self.seen, self.point_hosts, self.offsets)
