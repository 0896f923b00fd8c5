"""Application-layer latency of an app-limited flow (M-APPLAT, M-APPREAD): each logged write joined with the
receiver-side capture and the sink's read log. Pure array work: no Python object per packet or per write.

Mapping: a data packet's first payload byte has stream offset (seq − ISN − 1) mod 2^32, unwrapped along the
capture so a stream longer than 4 GiB keeps counting; the write at offset o arrives with the first captured
packet (in capture time) whose bytes [lo, lo + len) hold o. A write whose first packet was lost before the
capture point arrives with the retransmission that carried the byte: its latency includes the loss
recovery (what the application on the receiver waited), and `arrivals` counts every captured packet that
held the byte (> 1: it arrived again, e.g. a spurious retransmission or a copy that survived).
"""
from __future__ import annotations

import numpy as np

from orchestrator.ingest.applog import WRITE_LOG
from orchestrator.storage import records

SEQ_SPACE = 1 << 32
SYN, ACK = 0x02, 0x10
NONE = -1
UNOBSERVED = -1      # `arrivals` of a write made before the receiver-side capture started, not seen
MAX_PAIRS = 50_000_000      # (packet, write) pairs expanded at once: a packet covers few writes of a thin stream
# A capture without the SYN: the stream's first byte is taken as the lowest sequence number among the
# first ISN_WINDOW data packets (a retransmission of offset 0 comes within a few)
ISN_WINDOW = 64


def stream_offsets(seq: np.ndarray, isn: int) -> np.ndarray:
    """Stream offset of each packet's first payload byte (int64), in capture order: (seq − ISN − 1) mod 2^32,
    then unwrapped, each step between consecutive packets taken as the shorter way round sequence space."""
    rel = (seq.astype(np.int64) - (isn + 1)) % SEQ_SPACE
    if rel.size < 2:
        return rel
    step = np.diff(rel)
    step = np.where(step >= SEQ_SPACE // 2, step - SEQ_SPACE, step)
    step = np.where(step < -SEQ_SPACE // 2, step + SEQ_SPACE, step)
    return np.concatenate([rel[:1], rel[0] + np.cumsum(step)])


def isn_of(seq: np.ndarray, flags: np.ndarray, payload: np.ndarray) -> tuple[int | None, str]:
    """(ISN, how it was found) of one direction: the SYN's sequence number; without a SYN in the capture,
    one less than the lowest sequence number among the first data packets; (None, ...) without data."""
    syn = np.flatnonzero(((flags & SYN) != 0) & ((flags & ACK) == 0))
    if syn.size:
        return int(seq[syn[0]]), "syn"
    data = np.flatnonzero(payload > 0)[:ISN_WINDOW]
    if not data.size:
        return None, "no data packets"
    s0 = int(seq[data[0]])
    d = (seq[data].astype(np.int64) - s0) % SEQ_SPACE
    d = np.where(d >= SEQ_SPACE // 2, d - SEQ_SPACE, d)
    return (s0 + int(d.min()) - 1) % SEQ_SPACE, "lowest early data"


def first_arrivals(offsets: np.ndarray, lo: np.ndarray, length: np.ndarray,
                   ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each byte offset in `offsets` (ascending), the earliest ts of a packet [lo, lo + length) holding
    it (NONE if none) and how many packets held it."""
    n = offsets.size
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    a = np.searchsorted(offsets, lo, side="left")
    b = np.searchsorted(offsets, lo + length, side="left")
    counts = (b - a).astype(np.int64)
    total = int(counts.sum())
    if total > MAX_PAIRS:
        raise ValueError(f"{total} (packet, write) pairs: more than {MAX_PAIRS}; is this a thin stream?")
    starts = np.cumsum(counts) - counts
    pair_write = np.repeat(a, counts) + (np.arange(total) - np.repeat(starts, counts))
    np.minimum.at(first, pair_write, np.repeat(ts.astype(np.int64), counts))
    hits = np.bincount(pair_write, minlength=n).astype(np.int32)
    return np.where(hits > 0, first, NONE), hits


def first_reads(ends: np.ndarray, read_ts: np.ndarray, upto: np.ndarray) -> np.ndarray:
    """For each stream position `upto` (one past a write's last byte), the time of the first read whose
    cumulative end reached it (NONE if the sink never read that far)."""
    idx = np.searchsorted(ends, upto, side="left")
    ok = idx < ends.size
    out = np.full(upto.size, NONE, dtype=np.int64)
    out[ok] = read_ts[idx[ok]]
    return out


def app_writes(writes: np.ndarray, data: np.ndarray, isn: int | None, reads: np.ndarray | None,
               offsets_ns: tuple[int, int, int], capture_from_ns: int | None = None) -> np.ndarray:
    """records.APP_WRITE rows of one flow. `writes`: applog.WRITE_LOG rows; `data`: the flow's data packets
    at the receiver-side capture (ts_ns, seq, payload_len; capture order); `reads`: applog.READ_LOG rows of
    the sink, or None; offsets_ns: the clock offsets (host − manager) of the writer's host, the capture's host
    and the sink's host, removed before times of two hosts are subtracted; capture_from_ns: when the capture
    started (its host's clock): a write made before it that was not seen is UNOBSERVED (arrivals −1), not lost."""
    assert writes.dtype == WRITE_LOG
    n = writes.size
    out = np.zeros(n, dtype=records.APP_WRITE)
    out["write_index"] = np.arange(n, dtype=np.int32)
    for name in ("sched_ns", "t_ns", "len", "accepted"):
        out[name] = writes[name]
    out["stream_offset"] = writes["offset"]
    for name in records.APP_WRITE_NULLABLE:
        out[name] = NONE
    sent = np.flatnonzero(writes["accepted"] > 0)           # offsets of these strictly increase
    off_src, off_cap, off_dst = offsets_ns
    t_common = writes["t_ns"][sent].astype(np.int64) - off_src
    if isn is not None and data.size and sent.size:
        payload = data[data["payload_len"] > 0]
        lo = stream_offsets(payload["seq"], isn)
        arrive, hits = first_arrivals(writes["offset"][sent].astype(np.int64), lo,
                                      payload["payload_len"].astype(np.int64), payload["ts_ns"])
        out["arrive_ns"][sent] = arrive
        out["arrivals"][sent] = hits
        seen = arrive != NONE
        out["latency_ns"][sent[seen]] = (arrive[seen] - off_cap) - t_common[seen]
    if capture_from_ns is not None and sent.size:
        early = (out["arrivals"][sent] == 0) & (t_common < capture_from_ns - off_cap)
        out["arrivals"][sent[early]] = UNOBSERVED
    if reads is not None and reads.size and sent.size:
        upto = writes["offset"][sent].astype(np.int64) + writes["accepted"][sent]
        read = first_reads(reads["end"], reads["t_ns"], upto)
        out["read_ns"][sent] = read
        got = read != NONE
        out["read_latency_ns"][sent[got]] = (read[got] - off_dst) - t_common[got]
    return out

