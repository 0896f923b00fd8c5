"""G-ACK after the run: did each receiver acknowledge as the plan's `ack_policy` asked, as its packets show?

M-ACKRATIO (docs/metrics.md) per flow: data segments the sender sent divided by the pure ACKs the receiver
sent back, both counted at one capture point that sees the two directions, over the flow's steady part (the
run's analysis window, without the flow's first STARTUP_S: Linux quick-acks at the start of a connection).
Like G-ECN it is a fold over the packet chunks the writer streams (`AckTally.observe`), numpy only; the
ratio is stored in flow.ack_ratio and a ratio outside what the policy expects is a flag naming the receiver.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.plan import RunSpec
from orchestrator.storage.records import PROTO_TCP
from schemas.flag import Flag

FIN, SYN, RST, ACK = 0x01, 0x02, 0x04, 0x10
STARTUP_S = 1.0          # skipped at each flow's start (quick-ack mode, slow start) when the flow is longer
PER_SEGMENT_MAX = 1.5    # below the delayed ACK's 2; Linux acks a backlog of segments once (tcp_backlog_ack_defer)
STRETCH_TOLERANCE = 0.25  # delayed (2) and stretch (k): k x (1 +- this)


def expected_range(mode: str, segments_per_ack: int) -> tuple[float, float]:
    """The M-ACKRATIO a policy gives: per_segment ~1, delayed ~2 (Linux's delayed ACK covers two full
    segments), stretch ~segments_per_ack."""
    if mode == "per_segment":
        return 0.0, PER_SEGMENT_MAX
    k = 2 if mode == "delayed" else segments_per_ack
    return k * (1 - STRETCH_TOLERANCE), k * (1 + STRETCH_TOLERANCE)


def chunk_counts(chunk: np.ndarray, windows: dict[int, tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
    """Per (src_port, dst_port) of a chunk's TCP packets inside their flow's window: [data segments, pure ACKs].
    `windows`: the flows' server ports -> (start_ns, end_ns); a data segment is the flow's when it goes to the
    port, an ACK when it comes from it."""
    tcp = chunk[chunk["proto"] == PROTO_TCP]
    if not tcp.size or not windows:
        return {}
    data = tcp["payload_len"] > 0
    flags = tcp["tcp_flags"].astype(np.int32)
    pure_ack = ~data & (flags & ACK != 0) & (flags & (SYN | FIN | RST) == 0)
    service = np.where(data, tcp["dst_port"], tcp["src_port"])
    ports = np.array(sorted(windows), dtype=np.int64)
    bounds = np.array([windows[p] for p in ports.tolist()], dtype=np.int64)
    at = np.clip(np.searchsorted(ports, service), 0, ports.size - 1)
    inside = (ports[at] == service) & (tcp["ts_ns"] >= bounds[at, 0]) & (tcp["ts_ns"] < bounds[at, 1])
    keep = inside & (data | pure_ack)
    key = tcp["src_port"][keep].astype(np.int64) << 16 | tcp["dst_port"][keep].astype(np.int64)
    keys, inverse = np.unique(key, return_inverse=True)
    counts = np.stack([np.bincount(inverse, weights=m, minlength=keys.size)
                       for m in (data[keep], pure_ack[keep])], axis=1).astype(np.int64)
    return {(int(k >> 16), int(k & 0xFFFF)): row for k, row in zip(keys.tolist(), counts, strict=True)}


@dataclass(frozen=True)
class AckRatio:
    flow_id: int
    point: str
    src_port: int
    data_segments: int
    pure_acks: int

    @property
    def ratio(self) -> float:
        return self.data_segments / self.pure_acks


def flow_windows(spec: RunSpec, t0_ns: int, window: tuple[int, int]) -> dict[int, tuple[int, int]]:
    """Server port -> the flow's steady part: its span within the run's window, less its first STARTUP_S
    when it is longer than that (else the whole span)."""
    out = {}
    for f in spec.flows:
        start, end = t0_ns + int(f.start_s * 1e9), t0_ns + int((f.start_s + f.duration_s) * 1e9)
        lo, hi = max(start, window[0]), min(end, window[1])
        steady = max(lo, start + int(STARTUP_S * 1e9))
        out[f.port] = (steady, hi) if steady < hi else (start, end)
    return out


def ack_ratios(spec: RunSpec, flow_rows: list[dict], totals: dict[tuple[str, int, int], np.ndarray]
               ) -> dict[int, AckRatio | None]:
    """Per flow the receivers of the policy serve: M-ACKRATIO at the point nearest the receiver (a capture on
    the receiver, else the one with the most ACKs) that saw both its data and its ACKs; None when none did."""
    ports = {r["flow_id"]: r.get("src_port") for r in flow_rows}
    out: dict[int, AckRatio | None] = {}
    for f in spec.flows:
        if f.tool == "udp" or spec.ack_policy is None or f.dst not in spec.ack_policy.hosts:
            continue
        seen = [AckRatio(f.flow_id, point, sport, int(row[0]), int(totals.get((point, f.port, sport), [0, 0])[1]))
                for (point, sport, dport), row in totals.items() if dport == f.port and row[0] > 0]
        if ports.get(f.flow_id):
            seen = [s for s in seen if s.src_port == ports[f.flow_id]]
        both = [s for s in seen if s.pure_acks > 0]
        if not both:
            out[f.flow_id] = None
            continue
        out[f.flow_id] = max(both, key=lambda s: (s.point.startswith(f"{f.dst}:"), s.data_segments, s.pure_acks))
    return out


def ack_findings(spec: RunSpec, ratios: dict[int, AckRatio | None]) -> list[Flag]:
    a = spec.ack_policy
    if a is None:
        return []
    lo, hi = expected_range(a.mode, a.segments_per_ack)
    want = f"<= {hi:g}" if a.mode == "per_segment" else f"{lo:g}..{hi:g}"
    by_id = {f.flow_id: f for f in spec.flows}
    out = []
    for flow_id, r in sorted(ratios.items()):
        f = by_id[flow_id]
        if r is None:
            out.append(Flag(guard="G-ACK", host=f.dst, message=f"flow {flow_id}: ack_policy {a.mode}/{a.mechanism} "
                            "not checked: no capture point saw both its data and the receiver's ACKs"))
        elif not lo <= r.ratio <= hi:
            out.append(Flag(guard="G-ACK", host=f.dst, message=f"flow {flow_id} ({r.src_port} -> {f.port}) at "
                            f"{r.point}: {r.ratio:.2f} data segments per ACK ({r.data_segments} / {r.pure_acks}), "
                            f"ack_policy {a.mode}/{a.mechanism} expects {want}"))
    return out


class AckTally:
    """The packet fold for G-ACK and M-ACKRATIO: `observe` each (capture point, chunk), then `flags()` and
    `flow_values()` (flow_id -> {"ack_ratio": ...}) for the flow rows."""

    def __init__(self, spec: RunSpec, flow_rows: list[dict], t0_ns: int, window: tuple[int, int]) -> None:
        self.spec, self.flow_rows = spec, flow_rows
        self.windows = flow_windows(spec, t0_ns, window)
        self.totals: dict[tuple[str, int, int], np.ndarray] = {}

    def observe(self, point: str, chunk: np.ndarray) -> None:
        for (sport, dport), row in chunk_counts(chunk, self.windows).items():
            key = (point, sport, dport)
            self.totals[key] = self.totals[key] + row if key in self.totals else row

    def ratios(self) -> dict[int, AckRatio | None]:
        return ack_ratios(self.spec, self.flow_rows, self.totals)

    def flags(self) -> list[dict]:
        return [f.stored() for f in ack_findings(self.spec, self.ratios())]

    def flow_values(self) -> dict[int, dict[str, float]]:
        return {flow_id: {"ack_ratio": round(r.ratio, 4)} for flow_id, r in self.ratios().items() if r is not None}
