"""G-ECN after the run: did each flow that asked for ECN negotiate and use it, as its packets show?

The pcap hot path builds no object per packet, so the evidence is a fold: `EcnTally` is handed every packet
chunk while the writer streams the captures into the database, and keeps six counters per (capture point,
source port, destination port) with numpy. Its findings are added to the run's flags before the run's
transaction commits.
"""
from __future__ import annotations

import numpy as np

from orchestrator.plan import RunSpec
from orchestrator.storage.records import PROTO_TCP
from schemas.flag import Flag

SYN, ACK, ECE, CWR = 0x02, 0x10, 0x40, 0x80
COUNTERS = ("syn", "syn_ecn", "synack", "synack_ece", "data", "data_ect")


def chunk_counts(chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per (src_port, dst_port) of a chunk's TCP packets: the ports (n x 2) and COUNTERS (n x 6)."""
    tcp = chunk[chunk["proto"] == PROTO_TCP]
    flags = tcp["tcp_flags"].astype(np.int32)
    data = tcp["payload_len"] > 0
    masks = (flags & (SYN | ACK) == SYN, flags & (SYN | ACK | ECE | CWR) == SYN | ECE | CWR,
             flags & (SYN | ACK) == SYN | ACK, flags & (SYN | ACK | ECE) == SYN | ACK | ECE,
             data, data & (tcp["ecn"] != 0))
    key = tcp["src_port"].astype(np.int64) << 16 | tcp["dst_port"].astype(np.int64)
    keys, inverse = np.unique(key, return_inverse=True)
    counts = np.stack([np.bincount(inverse, weights=m, minlength=keys.size) for m in masks], axis=1)
    return np.stack([keys >> 16, keys & 0xFFFF], axis=1), counts.astype(np.int64)


class EcnTally:
    """The packet fold for G-ECN: `observe` each (capture point, chunk), then `flags()`."""

    def __init__(self, spec: RunSpec, flow_rows: list[dict]) -> None:
        self.spec, self.flow_rows = spec, flow_rows
        self.totals: dict[tuple[str, int, int], np.ndarray] = {}

    def observe(self, point: str, chunk: np.ndarray) -> None:
        ports, counts = chunk_counts(chunk)
        for (sport, dport), row in zip(ports.tolist(), counts, strict=True):
            key = (point, sport, dport)
            self.totals[key] = self.totals[key] + row if key in self.totals else row

    def counts(self) -> list[dict]:
        return [{"point": p, "src_port": s, "dst_port": d, **dict(zip(COUNTERS, map(int, row), strict=True))}
                for (p, s, d), row in sorted(self.totals.items())]

    def flags(self) -> list[dict]:
        return [f.stored() for f in ecn_findings(self.spec, self.flow_rows, self.counts())]


def wants_ecn(spec: RunSpec) -> bool:
    """Some TCP flow asked for ECN: only then is the tally worth its pass over every packet."""
    return any(f.tool != "udp" and ecn_expected(spec, f) for f in spec.flows)


ECN_SETTING_CCS = frozenset({"dctcp", "prague"})   # CCs that request ECN themselves (tcp_ca_needs_ecn)
ECT_SHARE_MIN = 0.5   # Linux sends retransmissions not-ECT (RFC 3168 §6.1.5): a negotiated flow stays far above


def ecn_expected(spec: RunSpec, flow) -> bool:
    """The flow's sender asks for ECN: tcp_ecn = 1 on it, or a CC that sets ECN itself."""
    hp = spec.hosts.get(flow.src)
    return flow.cc in ECN_SETTING_CCS or (hp is not None and str(hp.sysctls.get("net.ipv4.tcp_ecn", "")).strip() == "1")


def ecn_findings(spec: RunSpec, flow_rows: list[dict], counts: list[dict]) -> list[Flag]:
    """G-ECN post, per flow that should use ECN, from the packets the capture points saw: the SYN carries
    ECE+CWR, the SYN-ACK ECE, and the data is ECN-capable (ECT or CE). A handshake no point captured is not
    judged; a SYN retried without ECE (tcp_ecn_fallback) is the failure this exists for."""
    ports = {r["flow_id"]: r.get("src_port") for r in flow_rows}
    out = []
    for f in spec.flows:
        if f.tool == "udp" or not ecn_expected(spec, f):
            continue
        to_dst = [c for c in counts if c["dst_port"] == f.port]
        if not to_dst:
            continue
        sport = ports.get(f.flow_id) or max(to_dst, key=lambda c: c["data"])["src_port"]
        fwd = [c for c in to_dst if c["src_port"] == sport]
        rev = [c for c in counts if c["src_port"] == f.port and c["dst_port"] == sport]
        problems = []
        if sum(c["syn"] for c in fwd) and not sum(c["syn_ecn"] for c in fwd):
            problems.append("its SYN carried no ECE+CWR")
        if sum(c["synack"] for c in rev) and not sum(c["synack_ece"] for c in rev):
            problems.append("the SYN-ACK carried no ECE")
        best = max(fwd, key=lambda c: c["data"], default=None)
        if best and best["data"] and best["data_ect"] / best["data"] < ECT_SHARE_MIN:
            problems.append(f"{best['data_ect'] / best['data']:.0%} of its data packets at {best['point']} were "
                            "ECN-capable")
        if problems:
            out.append(Flag(guard="G-ECN", host=f.src,
                            message=f"flow {f.flow_id} ({sport} -> {f.port}) did not use ECN: "
                               + "; ".join(problems) + " (check tcp_ecn on both ends and tcp_ecn_fallback=0)"))
    return out
