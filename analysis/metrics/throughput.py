"""M-TPUT and M-UTIL: goodput, throughput bins and link utilisation (pure numpy).

Inputs are structured arrays whose field names follow orchestrator/storage/records.py (only the fields
a function names are required). Times are integer ns; bins are half-open [t0 + kΔ, t0 + (k+1)Δ).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.metrics.stats import Stats, summary_stats

SEQ_SPACE = 1 << 32
ETHERNET_HEADER = 14
"""Wire bytes = ip_len + 14: what htb counts (M-UTIL); no preamble, FCS or inter-frame gap."""


# ---------------------------------------------------------------------------- sequence space

def unwrap_seq(seq: np.ndarray) -> np.ndarray:
    """32-bit TCP sequence numbers as int64 offsets from the first one, wrap-arounds removed.

    Each step is taken as the signed 32-bit difference to the previous packet, so a flow may wrap any
    number of times and retransmissions (negative steps) stay below the front; this assumes
    consecutive packets are less than 2 GiB of sequence space apart, which TCP windows guarantee.
    """
    s = np.asarray(seq, dtype=np.int64)
    if s.size == 0:
        return s.copy()
    step = np.diff(s) % SEQ_SPACE
    step = np.where(step >= SEQ_SPACE // 2, step - SEQ_SPACE, step)
    out = np.empty_like(s)
    out[0] = 0
    np.cumsum(step, out=out[1:])
    return out


def signed_seq_diff(a: int | np.ndarray, b: int | np.ndarray) -> np.ndarray:
    """a − b in 32-bit sequence space, as a signed int64 in [−2^31, 2^31)."""
    d = (np.asarray(a, dtype=np.int64) - np.asarray(b, dtype=np.int64)) % SEQ_SPACE
    return np.where(d >= SEQ_SPACE // 2, d - SEQ_SPACE, d)


def by_time(packets: np.ndarray) -> np.ndarray:
    """Packets stably sorted by ts_ns."""
    return packets[np.argsort(packets["ts_ns"], kind="stable")]


def data_in_time_order(packets: np.ndarray) -> np.ndarray:
    """Packets with payload, stably sorted by time (SYN/FIN/pure ACKs carry no goodput)."""
    return by_time(packets[packets["payload_len"] > 0])


def goodput_advance(packets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per data packet: (ts_ns, bytes it advances the highest sequence number seen so far).

    `packets` are one flow's data direction (fields ts_ns, seq, payload_len). The front starts at the
    first data packet's seq; a packet counts only the bytes beyond the front, so retransmissions and
    duplicates count 0. Bytes of a hole (lost before this capture point) are counted when a later
    segment jumps the front over it: totals equal the unique bytes delivered, and the hole's bytes
    land in the bin of the jump, not the repair.
    """
    data = data_in_time_order(packets)
    if data.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    start = unwrap_seq(data["seq"])
    end = start + data["payload_len"].astype(np.int64)
    front_after = np.maximum.accumulate(end)
    front_before = np.concatenate(([0], front_after[:-1]))
    return data["ts_ns"].astype(np.int64), np.maximum(end - front_before, 0)


def is_retransmission(packets: np.ndarray) -> np.ndarray:
    """Per data packet in time order: True when it adds no new bytes (a retransmission or duplicate).

    Same order as `goodput_advance`; a segment that fills a hole lost upstream also counts as one."""
    _, adv = goodput_advance(packets)
    return adv == 0


@dataclass(frozen=True)
class Goodput:
    """M-TPUT goodput of one flow over its active span (first to last data packet)."""

    bytes: int
    first_ns: int
    last_ns: int

    @property
    def span_ns(self) -> int:
        return self.last_ns - self.first_ns

    @property
    def bits_per_s(self) -> float:
        """NaN when the span is empty (0 or 1 data packet): a rate over no time is undefined."""
        return self.bytes * 8e9 / self.span_ns if self.span_ns > 0 else math.nan


def flow_goodput(packets: np.ndarray) -> Goodput:
    """Goodput of one flow's data-direction packets (fields ts_ns, seq, payload_len)."""
    ts, adv = goodput_advance(packets)
    if ts.size == 0:
        return Goodput(bytes=0, first_ns=0, last_ns=0)
    return Goodput(bytes=int(adv.sum()), first_ns=int(ts.min()), last_ns=int(ts.max()))


def union_span_ns(intervals: Sequence[tuple[int, int]]) -> int:
    """Total length of the union of closed intervals [first, last] (overlaps counted once)."""
    total, cur_lo, cur_hi = 0, None, None
    for lo, hi in sorted(intervals):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def aggregate_goodput(flows: Sequence[Goodput]) -> float:
    """Aggregate goodput (bit/s) = Σ goodput bytes / union of the flows' active spans.

    The union (not the hull) so that a gap where no flow was active does not dilute the rate; flows
    without data are ignored. NaN when nothing was delivered over a non-empty span.
    """
    active = [g for g in flows if g.bytes > 0]
    span = union_span_ns([(g.first_ns, g.last_ns) for g in active])
    return sum(g.bytes for g in active) * 8e9 / span if span > 0 else math.nan


# ---------------------------------------------------------------------------- time series

def bin_sum(ts_ns: np.ndarray, values: np.ndarray, t0_ns: int, bin_ns: int,
            n_bins: int | None = None) -> np.ndarray:
    """Σ values per half-open bin [t0 + kΔ, t0 + (k+1)Δ), k = 0..n_bins-1.

    Samples before t0 or at/after the last bin's end are dropped. Without n_bins the bins reach just
    past the last sample.
    """
    if bin_ns <= 0:
        raise ValueError(f"bin width must be positive, got {bin_ns} ns")
    ts = np.asarray(ts_ns, dtype=np.int64)
    vals = np.asarray(values, dtype=float)
    # Integer floor division keeps ns exactness: float bins would misplace samples on bin edges.
    k = (ts - np.int64(t0_ns)) // np.int64(bin_ns)
    if n_bins is None:
        n_bins = int(k.max()) + 1 if k.size and k.max() >= 0 else 0
    keep = (k >= 0) & (k < n_bins)
    return np.bincount(k[keep], weights=vals[keep], minlength=n_bins)[:n_bins].astype(float)


@dataclass(frozen=True)
class BinnedSeries:
    """A rate per bin; bin k covers [t0_ns + k·bin_ns, t0_ns + (k+1)·bin_ns)."""

    t0_ns: int
    bin_ns: int
    values: np.ndarray

    @property
    def bin_start_s(self) -> np.ndarray:
        """Bin starts in seconds since t0 (for plotting)."""
        return np.arange(self.values.size) * (self.bin_ns / 1e9)


def wire_bytes(packets: np.ndarray) -> np.ndarray:
    return packets["ip_len"].astype(np.int64) + ETHERNET_HEADER


def throughput_series(packets: np.ndarray, t0_ns: int, bin_ns: int, n_bins: int | None = None,
                      kind: str = "goodput") -> BinnedSeries:
    """M-TPUT per bin in bit/s for one flow's data-direction packets.

    kind: "goodput" (bytes advancing the highest seq), "payload" (all TCP payload bytes, including
    retransmissions) or "wire" (ip_len + 14, what htb counts; M-UTIL).
    """
    if kind == "goodput":
        ts, nbytes = goodput_advance(packets)
    else:
        data = packets[packets["payload_len"] > 0]
        ts = data["ts_ns"]
        if kind == "payload":
            nbytes = data["payload_len"]
        elif kind == "wire":
            nbytes = wire_bytes(data)
        else:
            raise ValueError(f"unknown throughput kind {kind!r}")
    sums = bin_sum(ts, nbytes, t0_ns, bin_ns, n_bins)
    return BinnedSeries(t0_ns=t0_ns, bin_ns=bin_ns, values=sums * 8e9 / bin_ns)


# ---------------------------------------------------------------------------- M-UTIL

@dataclass(frozen=True)
class Utilisation:
    """M-UTIL over a window: per-bin fractions of the configured rate.

    `wire` counts ip_len + 14 (what the shaper counts, ≈ 1 when saturated); `payload` counts TCP
    payload only and is capped at SMSS/(MTU + 14) (1448/1514 = 0.956 with timestamps at MTU 1500)."""

    bin_ns: int
    wire: Stats
    payload: Stats
    min_10ms_wire: float      # the minimum 10 ms average (NaN when the window is shorter than 10 ms)


def utilisation(flows: Sequence[np.ndarray], rate_bit: float, start_ns: int, end_ns: int,
                bin_ns: int) -> Utilisation:
    """M-UTIL of all flows' packets (each downstream of the bottleneck) over whole bins inside
    [start_ns, end_ns): Σ bytes in bin × 8 / (R × Δ), summarised over bins, plus the minimum
    10 ms-average of wire utilisation."""
    if rate_bit <= 0:
        raise ValueError(f"rate must be positive, got {rate_bit}")
    data = [p[p["payload_len"] > 0] for p in flows]
    ts = np.concatenate([p["ts_ns"] for p in data]) if data else np.empty(0, np.int64)
    wire = np.concatenate([wire_bytes(p) for p in data]) if data else np.empty(0)
    payload = np.concatenate([p["payload_len"] for p in data]) if data else np.empty(0)

    def fractions(nbytes: np.ndarray, width: int) -> np.ndarray:
        n = max(0, (end_ns - start_ns) // width)     # whole bins only: a partial bin reads low
        return bin_sum(ts, nbytes, start_ns, width, n) * 8e9 / (rate_bit * width)

    ten = fractions(wire, 10_000_000)
    return Utilisation(bin_ns=bin_ns, wire=summary_stats(fractions(wire, bin_ns)),
                       payload=summary_stats(fractions(payload, bin_ns)),
                       min_10ms_wire=float(ten.min()) if ten.size else math.nan)
