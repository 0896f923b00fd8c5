"""M-CWND, M-CWNDCOLLAPSE and M-ALPHA: sender TCP state series from tcp_probe and ss samples (pure numpy).

tcp_probe events (records.TCP_PROBE fields) come one per incoming ACK; ss samples (M-SS) one per poll.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.metrics.stats import Stats, summary_stats
from analysis.metrics.windows import in_window

SSTHRESH_UNSET = 2**31 - 1
"""tcp_probe reports ssthresh ≥ 2^31 − 1 while slow start has not ended (TCP_INFINITE_SSTHRESH)."""
DCTCP_ALPHA_SCALE = 1024
"""Stock DCTCP keeps alpha in units of 1/1024 (M-ALPHA); 20-bit and upscaled variants differ."""


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


@dataclass(frozen=True)
class CwndSeries:
    """One connection's sender state over time: t in ns, cwnd and ssthresh in segments (ssthresh NaN
    while unset), srtt in µs. `slow_start_end_ns`: first event with ssthresh set (G-WINDOW), or None."""

    ts_ns: np.ndarray
    cwnd: np.ndarray
    ssthresh: np.ndarray
    srtt_us: np.ndarray
    slow_start_end_ns: int | None


def cwnd_series(probe: np.ndarray, sport: int | None = None, dport: int | None = None) -> CwndSeries:
    """M-CWND series of one connection, time-ordered. Store every event; downsample only to plot."""
    p = probe[probe_mask(probe, sport, dport)]
    p = p[np.argsort(p["ts_ns"], kind="stable")]
    ss = p["ssthresh"].astype(float)
    unset = ss >= SSTHRESH_UNSET
    ss[unset] = math.nan
    first_set = np.flatnonzero(~unset)
    return CwndSeries(ts_ns=p["ts_ns"].astype(np.int64), cwnd=p["snd_cwnd"].astype(float), ssthresh=ss,
                      srtt_us=p["srtt_us"].astype(float),
                      slow_start_end_ns=int(p["ts_ns"][first_set[0]]) if first_set.size else None)


COLLAPSE_BELOW = 0.5
"""M-CWNDCOLLAPSE: a reduction episode collapsed when cwnd fell below this share of the ssthresh it set."""


@dataclass(frozen=True)
class Reductions:
    """M-CWNDCOLLAPSE of one connection: its window reductions and how many of them collapsed the window."""

    episodes: int
    collapsed: int
    lowest_share: float      # the smallest min-cwnd / ssthresh of any episode (NaN: no episode)
    validations: int = 0     # ssthresh raised to 3/4 cwnd by cwnd validation: the sender was not cwnd-limited

    @property
    def collapsed_share(self) -> float:
        return self.collapsed / self.episodes if self.episodes else math.nan


def reduction_episodes(ssthresh: np.ndarray, cwnd: np.ndarray, below: float = COLLAPSE_BELOW) -> Reductions:
    """Per ACK (time order) ssthresh (NaN while unset) and cwnd of one connection. A reduction is an ACK at which
    ssthresh changed to a value below the previous ACK's cwnd: a CE echo, a loss, an RTO, slow start's end
    (unset counts as infinite) -- a DCTCP reduction after cwnd grew may set ssthresh above the last one, so
    a change and not only a decrease counts. Not one: cwnd validation (RFC 2861), which raises ssthresh to
    exactly 3/4 of cwnd when the sender did not use its window (counted apart, `validations`). Its episode lasts
    until the next reduction; it collapsed when cwnd fell below `below` x the ssthresh it set: a reduction that
    should take the window down to ssthresh took it far lower (the PRR bug of Linux 5.9 with TSO bursts)."""
    ss = np.where(np.isnan(ssthresh), np.inf, ssthresh)
    before = cwnd[:-1].astype(np.int64)
    changed = ss[1:] != ss[:-1]
    validation = changed & (ss[1:] > ss[:-1]) & (ss[1:] == (before >> 1) + (before >> 2))
    starts = np.flatnonzero(changed & (ss[1:] < before) & ~validation) + 1
    if not starts.size:
        return Reductions(0, 0, math.nan, int(validation.sum()))
    lowest = np.minimum.reduceat(cwnd, starts)
    share = lowest / ssthresh[starts]
    return Reductions(int(starts.size), int((share < below).sum()), float(share.min()), int(validation.sum()))


def last_per_bin(ts_ns: np.ndarray, values: np.ndarray, t0_ns: int, bin_ns: int, n_bins: int) -> np.ndarray:
    """The last value at or before the end of each bin (a step signal such as cwnd, downsampled for a
    plot without inventing values between events); NaN before the first event."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    ends = np.int64(t0_ns) + (np.arange(n_bins, dtype=np.int64) + 1) * np.int64(bin_ns)
    idx = np.searchsorted(ts, ends, side="left") - 1
    vals = np.asarray(values, dtype=float)
    out = np.full(n_bins, math.nan)
    seen = idx >= 0
    out[seen] = vals[idx[seen]]
    return out


# ---------------------------------------------------------------------------- M-ALPHA

def alpha_fraction(raw: np.ndarray, scale: int = DCTCP_ALPHA_SCALE) -> np.ndarray:
    """DCTCP alpha as a fraction in [0, 1]: the ss/module value A divided by the variant's scale."""
    if scale <= 0:
        raise ValueError(f"alpha scale must be positive, got {scale}")
    return np.asarray(raw, dtype=float) / scale


@dataclass(frozen=True)
class AlphaSummary:
    """DCTCP alpha over a window: the sample summary and the time-weighted mean (each sample holds
    until the next one, so irregular polling does not bias the mean)."""

    samples: Stats
    time_weighted_mean: float


def alpha_summary(ts_ns: np.ndarray, alpha: np.ndarray, start_ns: int | None = None,
                  end_ns: int | None = None) -> AlphaSummary:
    """Summary of (ts_ns, alpha) samples (alpha already a fraction) inside [start, end]."""
    ts = np.asarray(ts_ns, dtype=np.int64)
    a = np.asarray(alpha, dtype=float)
    order = np.argsort(ts, kind="stable")
    ts, a = ts[order], a[order]
    keep = in_window(ts, start_ns, end_ns) & ~np.isnan(a)
    ts, a = ts[keep], a[keep]
    if ts.size >= 2 and ts[-1] > ts[0]:
        weighted = float(np.sum(a[:-1] * np.diff(ts)) / (ts[-1] - ts[0]))
    else:
        weighted = float(a[0]) if a.size == 1 else math.nan
    return AlphaSummary(samples=summary_stats(a), time_weighted_mean=weighted)
