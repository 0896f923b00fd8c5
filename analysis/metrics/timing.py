"""M-RTT (a), M-FCT, M-GAP and M-APPLAT: per-packet timing of one connection at one capture (pure numpy).

`data` are the connection's packets from the sender, `acks` those from the receiver, both seen at
the same capture point on the sender side (one clock: no G-CLOCK needed). Fields follow
records.PACKET: ts_ns, seq, ack, payload_len, tcp_flags, tsval, tsecr (TS option absent = -1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.metrics.throughput import by_time, data_in_time_order, is_retransmission, signed_seq_diff, unwrap_seq

SYN, ACK_FLAG = 0x02, 0x10


# ---------------------------------------------------------------------------- M-RTT (a)

def rtt_from_timestamps(data: np.ndarray, acks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RTT samples (ack_ts_ns, rtt_ns) from TCP timestamps at the sender-side capture.

    For each TSval v carried by data, RTT = t(first ACK whose TSecr = v) − t(first data packet carrying
    v). Values v carried by any retransmission are skipped (the echo may belong to either copy). Several
    segments share one TSval (the clock ticks in ms), so there is one sample per distinct echoed v.
    """
    d = by_time(data[(data["payload_len"] > 0) & (data["tsval"] >= 0)])
    a = by_time(acks[acks["tsecr"] >= 0])
    if d.size == 0 or a.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    tainted = np.unique(d["tsval"][is_retransmission(d)])
    vals, first = np.unique(d["tsval"], return_index=True)      # first occurrence in time order
    sent_ns = d["ts_ns"][first]
    clean = ~np.isin(vals, tainted)
    vals, sent_ns = vals[clean], sent_ns[clean]
    echoed, first_ack = np.unique(a["tsecr"], return_index=True)
    ack_ns = a["ts_ns"][first_ack]
    if vals.size == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    pos = np.minimum(np.searchsorted(vals, echoed), vals.size - 1)
    hit = vals[pos] == echoed
    rtt = ack_ns[hit] - sent_ns[pos[hit]]
    ok = rtt >= 0                          # an echo before the send is a capture artefact
    order = np.argsort(ack_ns[hit][ok], kind="stable")
    return ack_ns[hit][ok][order].astype(np.int64), rtt[ok][order].astype(np.int64)


# ---------------------------------------------------------------------------- M-FCT

@dataclass(frozen=True)
class Completion:
    """M-FCT of one connection: first SYN (a `bulk` flow: its first data packet) to the first ACK covering the
    final data byte (one capture).

    censored: no ACK covers the final byte (the flow did not complete inside the capture); fct_ns is then
    the time from the start to the last packet seen, a lower bound."""

    syn_ns: int | None       # the start: the first SYN, or a pre-connected flow's first data packet
    done_ns: int | None
    fct_ns: float
    censored: bool
    data_bytes: int


def flow_completion(data: np.ndarray, acks: np.ndarray, from_first_data: bool = False) -> Completion:
    """M-FCT; `data` and `acks` may include the handshake (SYN in either direction counts). `from_first_data`:
    the flow was connected before its start (`bulk`), so it starts with its first data packet, not its SYN."""
    both = np.concatenate([data[["ts_ns", "tcp_flags"]], acks[["ts_ns", "tcp_flags"]]]) \
        if data.size + acks.size else np.empty(0, [("ts_ns", "i8"), ("tcp_flags", "i2")])
    syns = both["ts_ns"][(both["tcp_flags"] & SYN) != 0]
    syn = int(syns.min()) if syns.size else None
    d = data_in_time_order(data)
    if from_first_data:
        syn = int(d["ts_ns"][0]) if d.size else None
    if syn is None or d.size == 0:
        return Completion(syn, None, math.nan, True, 0)
    start = unwrap_seq(d["seq"])
    final_end = int((start + d["payload_len"]).max())
    a = by_time(acks[(acks["tcp_flags"] & ACK_FLAG) != 0])
    last_seen = int(max(d["ts_ns"].max(), a["ts_ns"].max() if a.size else 0))
    if a.size:
        # ack numbers in the data's unwrapped space: offset of the first ack, then its own unwrapping
        acked = int(signed_seq_diff(a["ack"][0], d["seq"][0])) + unwrap_seq(a["ack"])
        covering = np.flatnonzero(acked >= final_end)
        if covering.size:
            done = int(a["ts_ns"][covering[0]])
            return Completion(syn, done, float(done - syn), False, final_end)
    return Completion(syn, None, float(last_seen - syn), True, final_end)


# ---------------------------------------------------------------------------- M-GAP

@dataclass(frozen=True)
class Gaps:
    """M-GAP of one connection: gaps (ns) between consecutive first transmissions of data, and the
    retransmissions kept apart (their count and the payload sizes of all data packets, for thin streams)."""

    gaps_ns: np.ndarray
    retransmissions: int
    payload_sizes: np.ndarray


def inter_packet_gaps(data: np.ndarray) -> Gaps:
    """Δt between consecutive data packets that carry new bytes; retransmissions are counted, not
    gapped, so a loss episode does not split one gap into two."""
    d = data_in_time_order(data)
    retx = is_retransmission(d)
    first = d["ts_ns"][~retx].astype(np.int64)
    return Gaps(gaps_ns=np.diff(first), retransmissions=int(retx.sum()),
                payload_sizes=d["payload_len"].astype(np.int64))


# ---------------------------------------------------------------------------- M-APPLAT

@dataclass(frozen=True)
class WriteLatency:
    """Per application write: send latency (first transmission of a segment holding its last byte −
    write time) and delivery latency (first ACK above that byte − write time), ns; NaN if never seen."""

    send_ns: np.ndarray
    delivery_ns: np.ndarray


def write_latency(writes: np.ndarray, isn: int, data: np.ndarray, acks: np.ndarray) -> WriteLatency:
    """M-APPLAT. `writes` fields t_ns, offset, len (the application's log, sender clock); the write's
    last byte has seq ISN + 1 + offset + len − 1. `data`/`acks` are the sender-side capture."""
    n = writes.size
    send = np.full(n, math.nan)
    deliver = np.full(n, math.nan)
    last_byte = writes["offset"].astype(np.int64) + writes["len"].astype(np.int64) - 1   # offset from ISN+1
    d = data_in_time_order(data)
    if d.size:
        lo = signed_seq_diff(d["seq"], isn + 1)          # segment's first byte, relative to ISN+1
        hi = lo + d["payload_len"].astype(np.int64)      # one past its last byte
        for i, b in enumerate(last_byte):
            hit = np.flatnonzero((lo <= b) & (b < hi))   # first transmission = earliest in time order
            if hit.size:
                send[i] = d["ts_ns"][hit[0]] - writes["t_ns"][i]
    a = by_time(acks[(acks["tcp_flags"] & ACK_FLAG) != 0])
    if a.size:
        acked = np.maximum.accumulate(signed_seq_diff(a["ack"], isn + 1))   # cumulative ACK front
        idx = np.searchsorted(acked, last_byte, side="right")              # first ack > last byte
        ok = idx < a.size
        deliver[ok] = a["ts_ns"][idx[ok]] - writes["t_ns"][ok]
    return WriteLatency(send_ns=send, delivery_ns=deliver)
