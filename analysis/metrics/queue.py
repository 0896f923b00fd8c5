"""M-QDELAY, M-QLEN, M-MARK, M-DROP: queue delay, backlog, CE marking and drop rates (pure numpy).

Per-packet queue delay comes from the `qdelay` table (paired captures on the aqm host, M-QDELAY (b);
fields ts_in_ns, sojourn_ns, dropped, ce, payload_len); backlog and drop counters from `qdisc_sample`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.metrics.stats import Stats, percentile, summary_stats
from analysis.metrics.throughput import bin_sum
from analysis.metrics.windows import in_window

CE = 3
"""IP ECN codepoint CE; 1 = ECT(1), 2 = ECT(0), 0 = not ECN-capable."""


# ---------------------------------------------------------------------------- M-QDELAY

def delivered_sojourns(qdelay: np.ndarray, start_ns: int | None = None,
                       end_ns: int | None = None) -> np.ndarray:
    """Sojourn times (ns) of data packets that left the queue, entering it within [start, end].

    Dropped packets have no sojourn; pure ACKs and SYNs (payload 0) are not data and excluded."""
    keep = (qdelay["dropped"] == 0) & (qdelay["payload_len"] > 0)
    keep &= in_window(qdelay["ts_in_ns"], start_ns, end_ns)
    return qdelay["sojourn_ns"][keep].astype(np.int64)


def qdelay_stats(qdelay: np.ndarray, start_ns: int | None = None, end_ns: int | None = None) -> Stats:
    """M-STAT of per-packet queue delay in µs over the packets that entered the queue in the window."""
    return summary_stats(delivered_sojourns(qdelay, start_ns, end_ns) / 1e3)


def binned_mean(ts_ns: np.ndarray, values: np.ndarray, t0_ns: int, bin_ns: int,
                n_bins: int | None = None) -> np.ndarray:
    """Mean of values per half-open bin from t0; NaN for a bin without samples."""
    sums = bin_sum(ts_ns, values, t0_ns, bin_ns, n_bins)
    counts = bin_sum(ts_ns, np.ones(np.shape(ts_ns)), t0_ns, bin_ns, sums.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), math.nan)


def qdelay_series(qdelay: np.ndarray, t0_ns: int, bin_ns: int, n_bins: int | None = None) -> np.ndarray:
    """Mean queue delay (µs) per bin of arrival time at the queue; NaN where no packet arrived."""
    keep = (qdelay["dropped"] == 0) & (qdelay["payload_len"] > 0)
    return binned_mean(qdelay["ts_in_ns"][keep], qdelay["sojourn_ns"][keep] / 1e3, t0_ns, bin_ns, n_bins)


# ---------------------------------------------------------------------------- M-QLEN, M-DROP (qdisc)

@dataclass(frozen=True)
class BacklogStats:
    """Backlog over a window: sample mean and p99 of bytes and packets, drops counted in the window."""

    samples: int
    mean_bytes: float
    p99_bytes: float
    mean_packets: float
    p99_packets: float
    drops: int


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


def qdisc_drop_rate(samples: np.ndarray, start_ns: int | None = None, end_ns: int | None = None) -> float:
    """M-DROP per qdisc: Δdropped / Δ(sent + dropped) between the first and last sample in the window
    (fields ts_ns, packets, drops; counters since qdisc creation). NaN when nothing was offered."""
    w = samples[in_window(samples["ts_ns"], start_ns, end_ns)]
    if w.size < 2:
        return math.nan
    w = w[np.argsort(w["ts_ns"], kind="stable")]
    dropped = int(w["drops"][-1] - w["drops"][0])
    sent = int(w["packets"][-1] - w["packets"][0])
    return dropped / (sent + dropped) if sent + dropped > 0 else math.nan


# ---------------------------------------------------------------------------- per flow: M-MARK, M-DROP

@dataclass(frozen=True)
class SignalRates:
    """Congestion signals of one flow in a window, packet-weighted.

    ce_fraction: CE / ECN-capable data packets seen downstream of the AQM (M-MARK; NaN when none were
    ECN-capable). aqm_marked / aqm_dropped: fraction of the data packets entering the queue that the
    AQM marked CE or dropped (from the paired captures; NaN without qdelay rows)."""

    data_packets: int
    ecn_capable: int
    ce: int
    ce_fraction: float
    queue_packets: int
    aqm_marked: float
    aqm_dropped: float


def signal_rates(downstream: np.ndarray, qdelay: np.ndarray, start_ns: int | None = None,
                 end_ns: int | None = None) -> SignalRates:
    """M-MARK and M-DROP of one flow: `downstream` are its packets after the bottleneck (fields ts_ns,
    payload_len, ecn); `qdelay` its rows at the queue ingress (ts_in_ns, payload_len, ce, dropped)."""
    d = downstream[(downstream["payload_len"] > 0) & in_window(downstream["ts_ns"], start_ns, end_ns)]
    capable = int(np.count_nonzero(d["ecn"] != 0))
    ce = int(np.count_nonzero(d["ecn"] == CE))
    q = qdelay[(qdelay["payload_len"] > 0) & in_window(qdelay["ts_in_ns"], start_ns, end_ns)]
    n = int(q.size)
    return SignalRates(
        data_packets=int(d.size), ecn_capable=capable, ce=ce,
        ce_fraction=ce / capable if capable else math.nan, queue_packets=n,
        aqm_marked=int(np.count_nonzero(q["ce"])) / n if n else math.nan,
        aqm_dropped=int(np.count_nonzero(q["dropped"])) / n if n else math.nan)
