"""Synthetic captures for benchmarks and tests, written vectorised (numpy), never a packet at a time.

`write_bottleneck_pcap` writes what tcpdump -s 128 --time-stamp-precision nano would record on the aqm
host's egress toward the receivers of N bulk TCP flows through a bottleneck of rate R: full-size data
segments back to back (1514 B frames, NOP NOP TS options, ECT(0) with a share of CE marks, per-flow
IP-IDs, an occasional retransmission) and one ACK per two segments from each receiver. Optionally it
also writes the matching aqm *ingress* capture (the same data packets `standing_ns` + `d_fwd_ns`
earlier, plus packets dropped by the queue, plus the ACKs `d_fwd_ns` later), with the true sojourn
of every data packet, so the paired-capture queue delay can be checked against a known answer.

Every record is built as one row of a 144-byte structured array whose fields are the on-wire
headers (big-endian) behind a pcap record header; ACK rows are cut to 66 captured bytes by boolean
masking of the row bytes, which concatenates variable-length records without a Python loop.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

FRAME = 1514            # Ethernet frame of a full-size segment (MTU 1500)
MSS = 1448              # 1500 - 20 IP - 32 TCP (with timestamps)
SNAPLEN = 128
ACK_CAPLEN = 14 + 20 + 32
CHUNK = 250_000         # data packets per generated chunk (bounds memory)

REC = np.dtype([
    ("ts_sec", "<u4"), ("ts_nsec", "<u4"), ("incl", "<u4"), ("orig", "<u4"),
    ("eth_dst", "V6"), ("eth_src", "V6"), ("eth_type", ">u2"),
    ("vihl", "u1"), ("tos", "u1"), ("tot_len", ">u2"), ("ip_id", ">u2"), ("frag", ">u2"),
    ("ttl", "u1"), ("proto", "u1"), ("ip_csum", ">u2"), ("src", ">u4"), ("dst", ">u4"),
    ("sport", ">u2"), ("dport", ">u2"), ("seq", ">u4"), ("ack", ">u4"), ("doff", "u1"), ("flags", "u1"),
    ("win", ">u2"), ("tcp_csum", ">u2"), ("urg", ">u2"),
    ("nop1", "u1"), ("nop2", "u1"), ("ts_kind", "u1"), ("ts_len", "u1"), ("tsval", ">u4"), ("tsecr", ">u4"),
    ("payload", "V62"),
])
assert REC.itemsize == 16 + SNAPLEN
PCAP_HEADER = (np.array([0xA1B23C4D], "<u4").tobytes() + np.array([2, 4], "<u2").tobytes()
               + np.array([0, 0, 262144, 1], "<u4").tobytes())  # ns magic, v2.4, Ethernet

SENDER = 0x0A000302      # 10.0.3.2 (server side)
RECEIVER = 0x0A000102    # 10.0.1.2 (client side)


@dataclass(frozen=True)
class Truth:
    """What the synthetic ingress/egress pair contains (for checking the pairing)."""

    data_packets: int          # data packets at the egress
    dropped: int               # data packets only at the ingress
    acks: int
    sojourn_ns: np.ndarray     # true queue sojourn of each egress data packet (without d_fwd)
    d_fwd_ns: int


class _Flows:
    """Per-flow counters carried across chunks: next seq, IP-ID, data packets sent, ACK IP-ID."""

    def __init__(self, n: int, rng: np.random.Generator) -> None:
        self.seq = rng.integers(0, 2**32, n).astype(np.int64)
        self.ip_id = rng.integers(0, 2**16, n).astype(np.int64)
        self.sent = np.zeros(n, dtype=np.int64)
        self.ack_id = rng.integers(0, 2**16, n).astype(np.int64)
        self.ts_base = rng.integers(0, 2**31, n).astype(np.int64)


def _rank_within(flow: np.ndarray, nflows: int) -> tuple[np.ndarray, np.ndarray]:
    """For each row, how many earlier rows of the chunk have the same flow; and per-flow counts."""
    order = np.argsort(flow, kind="stable")
    counts = np.bincount(flow, minlength=nflows)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(flow.size, dtype=np.int64)
    rank[order] = np.arange(flow.size) - np.repeat(starts, counts)
    return rank, counts


def _records(n: int) -> np.ndarray:
    r = np.zeros(n, REC)
    r["eth_dst"] = np.frombuffer(b"\x02\x00\x00\x00\x01\x02", "V6")[0]
    r["eth_src"] = np.frombuffer(b"\x02\x00\x00\x00\x02\x01", "V6")[0]
    r["eth_type"], r["vihl"], r["frag"], r["ttl"], r["proto"] = 0x0800, 0x45, 0x4000, 63, 6
    r["doff"], r["win"] = 0x80, 501
    r["nop1"], r["nop2"], r["ts_kind"], r["ts_len"] = 1, 1, 8, 10
    return r


def _stamp(r: np.ndarray, t_ns: np.ndarray) -> None:
    r["ts_sec"], r["ts_nsec"] = t_ns // 1_000_000_000, t_ns % 1_000_000_000


def _data_rows(t: np.ndarray, flow: np.ndarray, seq: np.ndarray, ip_id: np.ndarray, tsval: np.ndarray,
               ecn: np.ndarray, base_port: int) -> np.ndarray:
    r = _records(t.size)
    _stamp(r, t)
    r["incl"], r["orig"], r["tot_len"] = SNAPLEN, FRAME, FRAME - 14
    r["tos"], r["ip_id"], r["src"], r["dst"] = ecn, ip_id & 0xFFFF, SENDER, RECEIVER
    r["sport"], r["dport"] = 40000 + flow, base_port + flow
    r["seq"], r["ack"], r["flags"] = seq & 0xFFFFFFFF, 1, 0x18
    r["tsval"], r["tsecr"] = tsval & 0xFFFFFFFF, 7
    return r


def _ack_rows(t: np.ndarray, flow: np.ndarray, ack: np.ndarray, ip_id: np.ndarray, tsecr: np.ndarray,
              base_port: int) -> np.ndarray:
    r = _records(t.size)
    _stamp(r, t)
    r["incl"], r["orig"], r["tot_len"] = ACK_CAPLEN, ACK_CAPLEN, ACK_CAPLEN - 14
    r["ip_id"], r["src"], r["dst"] = ip_id & 0xFFFF, RECEIVER, SENDER
    r["sport"], r["dport"] = base_port + flow, 40000 + flow
    r["seq"], r["ack"], r["flags"] = 1, ack & 0xFFFFFFFF, 0x10
    r["tsval"], r["tsecr"] = 9, tsecr & 0xFFFFFFFF
    return r


def _write(fh, parts: list[np.ndarray], t: np.ndarray) -> None:
    """Append records in time order, each cut to 16 + its captured length."""
    rows = np.empty(sum(p.size for p in parts), REC)  # np.concatenate would make the dtype native-endian
    at = 0
    for p in parts:
        rows[at:at + p.size] = p
        at += p.size
    rows = rows[np.argsort(t, kind="stable")]
    mat = rows.view(np.uint8).reshape(rows.size, REC.itemsize)
    keep = np.arange(REC.itemsize) < (16 + rows["incl"].astype(np.int64))[:, None]
    fh.write(mat[keep].tobytes())


def write_bottleneck_pcap(path: Path, data_packets: int, flows: int = 16, rate_bit: float = 600e6,
                          seed: int = 0, t0_ns: int = 1_732_170_000_000_000_000, base_port: int = 5201,
                          ingress_path: Path | None = None, standing_ns: int = 2_000_000,
                          d_fwd_ns: int = 15_000, drop_share: float = 0.002, ce_share: float = 0.01,
                          retrans_share: float = 0.001) -> Truth:
    """Write the egress capture (and, with ingress_path, the ingress one); see the module docstring."""
    rng = np.random.default_rng(seed)
    st = _Flows(flows, rng)
    gap = FRAME * 8 / rate_bit * 1e9
    sojourns, n_drop, n_ack, done = [], 0, 0, 0
    with open(path, "wb") as eg, (open(ingress_path, "wb") if ingress_path else open("/dev/null", "wb")) as ig:
        eg.write(PCAP_HEADER)
        ig.write(PCAP_HEADER)
        while done < data_packets:
            n = min(CHUNK, data_packets - done)
            k = np.arange(done, done + n)
            t = t0_ns + (k * gap).astype(np.int64) + rng.integers(0, int(gap) // 4, n)
            flow = rng.integers(0, flows, n)
            rank, counts = _rank_within(flow, flows)
            nth = st.sent[flow] + rank
            seq = st.seq[flow] + nth * MSS
            rtx = rng.random(n) < retrans_share          # resend an earlier segment instead
            seq[rtx] -= MSS * rng.integers(1, 50, int(rtx.sum()))
            ip_id = st.ip_id[flow] + nth
            tsval = st.ts_base[flow] + (t - t0_ns) // 1_000_000
            ecn = np.where(rng.random(n) < ce_share, 3, 2)
            data = _data_rows(t, flow, seq, ip_id, tsval, ecn, base_port)
            is_ack = (nth % 2) == 1
            a = np.flatnonzero(is_ack)
            na = a.size
            t_ack = t[a] + 3_000
            acks = _ack_rows(t_ack, flow[a], seq[a] + MSS, st.ack_id[flow[a]] + nth[a] // 2, tsval[a], base_port)
            _write(eg, [data, acks], np.concatenate([t, t_ack]))
            if ingress_path is not None:
                soj = standing_ns + rng.integers(0, int(gap) // 4, n)
                t_in = t - soj - d_fwd_ns
                ing = data.copy()
                _stamp(ing, t_in)
                ing["tos"] = 2                           # CE marks happen in the queue
                drop = rng.random(n) < drop_share        # lost in the queue: at the ingress only
                lost = data[drop].copy()
                t_lost = t_in[drop] + 1
                _stamp(lost, t_lost)
                lost["ip_id"] = (ip_id[drop] + 30_000) & 0xFFFF
                lost["tos"] = 2
                t_ack_in = t_ack + d_fwd_ns
                ack_in = acks.copy()
                _stamp(ack_in, t_ack_in)
                _write(ig, [ing, lost, ack_in], np.concatenate([t_in, t_lost, t_ack_in]))
                sojourns.append(soj)
                n_drop += int(drop.sum())
            st.sent += counts
            n_ack += na
            done += n
    soj_all = np.concatenate(sojourns) if sojourns else np.zeros(0, np.int64)
    return Truth(data_packets=data_packets, dropped=n_drop, acks=n_ack, sojourn_ns=soj_all, d_fwd_ns=d_fwd_ns)
