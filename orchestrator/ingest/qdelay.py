"""Per-packet queue delay from paired captures on the aqm host (docs/metrics.md#m-qdelay, method (b)).

Pure and vectorised: `pair(ingress, egress)` takes the packets seen on the aqm's ingress interface
(toward the senders) and on its egress interface (toward the receivers), both records.PACKET arrays
of one capture clock, already restricted to the direction that crosses the bottleneck, and returns one
records.QDELAY row per ingress packet.

Matching key: (protocol, addresses, ports, seq, IP-ID, payload length, TSval). TSval is not in the
M-QDELAY definition, but it separates a retransmission from its original where the IP-ID cannot
(IPv6 has none). Packets whose key occurs several times on one side (true duplicates) are matched in
order: the k-th occurrence at the ingress with the k-th at the egress, and only if t_out >= t_in.
Keys are hashed to 64 bits for sorting; every matched pair is then checked field by field, so a hash
collision can only lose a match (counted as a drop), never make a wrong one.

sojourn = t_out - t_in - d_fwd - netem, where d_fwd is the idle forwarding latency (given, else the
run minimum of t_out - t_in, which assumes the queue was empty at least once) and netem the emulated
delay on that path (0 when there is none; subtracted before the minimum is taken). Unmatched ingress
packets are drops. `ce` marks packets that leave with CE and did not arrive with it (marked by the
AQM). Algorithm notes: docs/ingest.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestrator.storage import records

_KEY_FIELDS = ("proto", "ipv", "src_port", "dst_port", "seq", "ip_id", "payload_len", "tsval")
_P = np.uint64(0x100000001B3)


@dataclass(frozen=True)
class QdelayResult:
    rows: np.ndarray | Any    # records.QDELAY, one per ingress packet, in ingress order (an array, or
    #                           qdelay_stream.Spool: the same rows as re-iterable chunks)
    matched: int
    dropped: int
    ce: int
    unmatched_egress: int     # egress packets with no ingress partner (capture loss, or not from ingress)
    d_fwd_ns: int
    d_fwd_source: str         # "given" | "run-minimum"
    netem_ns: int

    def summary(self, ingress: str, egress: str) -> dict:
        """The qdelay_pair table row (without run_id)."""
        return {"ingress": ingress, "egress": egress, "d_fwd_ns": self.d_fwd_ns, "d_fwd_source": self.d_fwd_source,
                "netem_ns": self.netem_ns, "matched": self.matched, "dropped": self.dropped, "ce": self.ce,
                "unmatched_egress": self.unmatched_egress}


def _addresses(pkts: np.ndarray) -> tuple[str, ...]:
    """Address fields, where the arrays have them (a caller that split by direction may drop them)."""
    return tuple(n for n in ("src_addr", "dst_addr") if n in (pkts.dtype.names or ()))


def _words(col: np.ndarray) -> np.ndarray:
    """A V16 address column as (n, 2) uint64."""
    return np.ascontiguousarray(col).view(np.uint64).reshape(-1, 2)


def key_hash(pkts: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each packet's matching key (FNV-style multiply-add over the key fields)."""
    h = np.full(pkts.size, 0xCBF29CE484222325, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name in _KEY_FIELDS:
            h = (h ^ pkts[name].astype(np.uint64)) * _P
        for name in _addresses(pkts):
            w = _words(pkts[name])
            h = (h ^ w[:, 0]) * _P
            h = (h ^ w[:, 1]) * _P
    return h


def _same_key(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ok = np.ones(a.size, dtype=bool)
    for name in (*_KEY_FIELDS, *_addresses(a)):
        ok &= a[name] == b[name]
    return ok


def _occurrence(sorted_keys: np.ndarray) -> np.ndarray:
    """For a sorted array, each element's index among the equal elements before it (0, 1, ...)."""
    n = sorted_keys.size
    idx = np.arange(n)
    start = np.zeros(n, dtype=np.int64)
    if n:
        new = np.concatenate([[True], sorted_keys[1:] != sorted_keys[:-1]])
        start = np.maximum.accumulate(np.where(new, idx, 0))
    return idx - start


def match(ingress: np.ndarray, egress: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (ingress, egress) of the accepted pairs: the k-th occurrence of a key at the ingress
    with the k-th at the egress, where t_out >= t_in and the keys are equal field by field."""
    hi, he = key_hash(ingress), key_hash(egress)
    oi = np.lexsort((ingress["ts_ns"], hi))
    oe = np.lexsort((egress["ts_ns"], he))
    hi_s, he_s = hi[oi], he[oe]
    rank = _occurrence(hi_s)
    first = np.searchsorted(he_s, hi_s, side="left")
    count = np.searchsorted(he_s, hi_s, side="right") - first
    has = rank < count
    i_rows = oi[has]
    e_rows = oe[first[has] + rank[has]]
    ok = (egress["ts_ns"][e_rows] >= ingress["ts_ns"][i_rows]) & _same_key(ingress[i_rows], egress[e_rows])
    return i_rows[ok], e_rows[ok]


def qdelay_rows(ingress: np.ndarray, egress: np.ndarray, i_rows: np.ndarray, e_rows: np.ndarray,
          conn_in: np.ndarray | int, netem_ns: int) -> np.ndarray:
    """QDELAY rows of the ingress packets with the raw delay t_out - t_in - netem in sojourn_ns."""
    out = np.zeros(ingress.size, dtype=records.QDELAY)
    out["conn_id"] = conn_in
    out["ts_in_ns"] = ingress["ts_ns"]
    out["payload_len"] = ingress["payload_len"]
    out["dropped"] = 1
    out["ts_out_ns"] = -1
    out["sojourn_ns"] = -1
    t_out = egress["ts_ns"][e_rows]
    out["dropped"][i_rows] = 0
    out["ts_out_ns"][i_rows] = t_out
    out["sojourn_ns"][i_rows] = t_out - ingress["ts_ns"][i_rows] - int(netem_ns)
    out["ce"][i_rows] = (egress["ecn"][e_rows] == 3) & (ingress["ecn"][i_rows] != 3)
    return out


def resolve_d_fwd(given_ns: int | None, raw_min_ns: int | None) -> tuple[int, str]:
    """(d_fwd, d_fwd_source): the given latency, else the run minimum of the raw delays (0 if none)."""
    if given_ns is not None:
        return int(given_ns), "given"
    return (raw_min_ns if raw_min_ns is not None else 0), "run-minimum"


def pair(ingress: np.ndarray, egress: np.ndarray, conn_in: np.ndarray | None = None,
         d_fwd_ns: int | None = None, netem_ns: int = 0) -> QdelayResult:
    """Match every ingress packet with its egress copy; see the module docstring.

    conn_in: conn id of each ingress packet (the QDELAY conn_id column); zeros if not given.
    """
    i_rows, e_rows = match(ingress, egress)
    out = qdelay_rows(ingress, egress, i_rows, e_rows, conn_in if conn_in is not None else 0, netem_ns)
    raw = out["sojourn_ns"][i_rows]
    d_fwd, source = resolve_d_fwd(d_fwd_ns, int(raw.min()) if raw.size else None)
    out["sojourn_ns"][i_rows] = raw - d_fwd
    matched = int(i_rows.size)
    return QdelayResult(rows=out, matched=matched, dropped=int(ingress.size - matched), ce=int(out["ce"].sum()),
                        unmatched_egress=int(egress.size - matched), d_fwd_ns=d_fwd, d_fwd_source=source,
                        netem_ns=int(netem_ns))


def direction(pkts: np.ndarray, src: np.void, dst: np.void) -> np.ndarray:
    """Mask of packets from address `src` to address `dst` (V16 values, see addr.packed)."""
    return (pkts["src_addr"] == src) & (pkts["dst_addr"] == dst)
