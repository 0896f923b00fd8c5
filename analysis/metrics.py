"""Pure metric maths over numpy arrays (EXPERIMENTS.md §6): goodput, throughput bins, backlog, cwnd.

Nothing here touches the database, files or plots: inputs are structured arrays whose field names
follow orchestrator/ingest/records.py (only the fields a function names are required, so callers may
pass a narrowed dtype), outputs are numbers, small dataclasses or arrays. Times are integer ns.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SEQ_SPACE = 1 << 32
PERCENTILE_METHOD = "linear"
"""M-STAT: linear interpolation between closest ranks (Hyndman & Fan type 7), recorded with results."""


# ---------------------------------------------------------------------------- M-STAT

def percentile(values: np.ndarray | Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; NaN if empty.

    The one percentile helper of the analysis package, so every table states the same method.
    """
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    return float(np.percentile(arr, q, method=PERCENTILE_METHOD))


@dataclass(frozen=True)
class Stats:
    """M-STAT distribution summary; sd is the population sd (ddof=0)."""

    n: int
    min: float
    mean: float
    median: float
    sd: float
    p95: float
    p99: float
    max: float


def summary_stats(values: np.ndarray | Sequence[float]) -> Stats:
    """M-STAT summary of a sample; all-NaN fields (n=0) for an empty sample."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        nan = math.nan
        return Stats(0, nan, nan, nan, nan, nan, nan, nan)
    return Stats(n=int(arr.size), min=float(arr.min()), mean=float(arr.mean()),
                 median=percentile(arr, 50), sd=float(arr.std()), p95=percentile(arr, 95),
                 p99=percentile(arr, 99), max=float(arr.max()))


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


def _data_in_time_order(packets: np.ndarray) -> np.ndarray:
    """Packets with payload, stably sorted by time (SYN/FIN/pure ACKs carry no goodput)."""
    data = packets[packets["payload_len"] > 0]
    return data[np.argsort(data["ts_ns"], kind="stable")]


def goodput_advance(packets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per data packet: (ts_ns, bytes it advances the highest sequence number seen so far).

    `packets` are one flow's data direction (fields ts_ns, seq, payload_len). The front starts at the
    first data packet's seq; a packet counts only the bytes beyond the front, so retransmissions and
    duplicates count 0. Bytes of a hole (lost before this capture point) are counted when a later
    segment jumps the front over it: totals equal the unique bytes delivered, and the hole's bytes
    land in the bin of the jump, not the repair.
    """
    data = _data_in_time_order(packets)
    if data.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    start = unwrap_seq(data["seq"])
    end = start + data["payload_len"].astype(np.int64)
    front_after = np.maximum.accumulate(end)
    front_before = np.concatenate(([0], front_after[:-1]))
    return data["ts_ns"].astype(np.int64), np.maximum(end - front_before, 0)


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
            nbytes = data["ip_len"].astype(np.int64) + 14
        else:
            raise ValueError(f"unknown throughput kind {kind!r}")
    sums = bin_sum(ts, nbytes, t0_ns, bin_ns, n_bins)
    return BinnedSeries(t0_ns=t0_ns, bin_ns=bin_ns, values=sums * 8e9 / bin_ns)


# ---------------------------------------------------------------------------- qdisc (M-QLEN, M-DROP)

@dataclass(frozen=True)
class BacklogStats:
    """Backlog over a window: sample mean and p99 of bytes and packets, drops counted in the window."""

    samples: int
    mean_bytes: float
    p99_bytes: float
    mean_packets: float
    p99_packets: float
    drops: int


def in_window(ts_ns: np.ndarray, start_ns: int | None, end_ns: int | None) -> np.ndarray:
    """Boolean mask of ts in [start, end]; a None bound is open."""
    ts = np.asarray(ts_ns)
    mask = np.ones(ts.shape, dtype=bool)
    if start_ns is not None:
        mask &= ts >= start_ns
    if end_ns is not None:
        mask &= ts <= end_ns
    return mask


def backlog_stats(samples: np.ndarray, start_ns: int | None = None,
                  end_ns: int | None = None) -> BacklogStats:
    """M-QLEN/M-DROP summary of one qdisc's time-ordered samples (fields ts_ns, backlog_bytes, qlen,
    drops) within [start_ns, end_ns].

    Samples are taken at a fixed interval, so the sample mean is the time average. `drops` is a
    counter since qdisc creation: the window's drops are last − first sample in the window.
    """
    w = samples[in_window(samples["ts_ns"], start_ns, end_ns)]
    w = w[np.argsort(w["ts_ns"], kind="stable")]
    if w.size == 0:
        nan = math.nan
        return BacklogStats(0, nan, nan, nan, nan, 0)
    b = w["backlog_bytes"].astype(float)
    q = w["qlen"].astype(float)
    return BacklogStats(samples=int(w.size), mean_bytes=float(b.mean()), p99_bytes=percentile(b, 99),
                        mean_packets=float(q.mean()), p99_packets=percentile(q, 99),
                        drops=int(w["drops"][-1] - w["drops"][0]))


# ---------------------------------------------------------------------------- M-CWND

def probe_mask(probe: np.ndarray, sport: int | None = None, dport: int | None = None) -> np.ndarray:
    """tcp_probe events of one connection seen at its sender: local port sport, remote port dport."""
    mask = np.ones(probe.shape, dtype=bool)
    if sport is not None:
        mask &= probe["sport"] == sport
    if dport is not None:
        mask &= probe["dport"] == dport
    return mask


def mean_cwnd(probe: np.ndarray, sport: int | None = None, dport: int | None = None) -> float:
    """Mean snd_cwnd (segments) over a flow's tcp_probe events (one per incoming ACK); NaN if none."""
    cwnd = probe["snd_cwnd"][probe_mask(probe, sport, dport)]
    return float(cwnd.mean()) if cwnd.size else math.nan
