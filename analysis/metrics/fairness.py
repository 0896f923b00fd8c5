"""M-JAIN, M-RATIO and M-CONV: fairness and convergence over per-flow throughput bins (pure numpy).

Inputs are a (flows × bins) matrix of throughput in bit/s on common bins, and a same-shaped boolean
matrix saying whether each flow was running during the whole bin (from its SYN or first data packet
to its last), so that a flow that has not started or has finished is not counted as starving.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

FAIR_LO, FAIR_HI = 0.8, 1.2
"""M-CONV: a flow is converged while its throughput is within 80-120 % of its fair share."""
HOLD_BINS = 10
"""M-CONV: the fair-share condition must hold, on average, for 10 one-RTT bins."""


def jain_index(rates: np.ndarray) -> float:
    """J = (Σx)² / (n · Σx²) over the rates given; J ∈ [1/n, 1]; NaN for no flows or all zero."""
    x = np.asarray(rates, dtype=float)
    denom = x.size * float(np.sum(x * x))
    return float(np.sum(x)) ** 2 / denom if denom > 0 else math.nan


def jain_series(tput: np.ndarray, running: np.ndarray, min_flows: int = 2) -> np.ndarray:
    """M-JAIN per bin over the flows running during the whole bin; NaN for bins with fewer than
    min_flows (one flow is trivially fair). The window value is the nanmean of this series."""
    tput = np.asarray(tput, dtype=float)
    running = np.asarray(running, dtype=bool)
    x = np.where(running, tput, 0.0)              # jain_index of each column's running flows, all at once
    n = running.sum(axis=0)
    denom = n * np.sum(x * x, axis=0)
    ok = (n >= min_flows) & (denom > 0)
    out = np.full(tput.shape[1], math.nan)
    out[ok] = np.sum(x, axis=0)[ok] ** 2 / denom[ok]
    return out


@dataclass(frozen=True)
class RateRatio:
    """M-RATIO: geometric mean of x_late / x_early over bins where both ran and sent; `toggling`
    when the leader changed (ln r changed sign), in which case only Jain's index is meaningful."""

    geometric_mean: float
    toggling: bool
    bins: int


def rate_ratio(late: np.ndarray, early: np.ndarray) -> RateRatio:
    """M-RATIO over bins given for the two flows (both running); bins where either sent nothing are
    skipped (ln 0 is undefined)."""
    late, early = np.asarray(late, float), np.asarray(early, float)
    ok = (late > 0) & (early > 0)
    if not ok.any():
        return RateRatio(math.nan, False, 0)
    ln = np.log(late[ok] / early[ok])
    toggling = bool((ln > 0).any() and (ln < 0).any())
    return RateRatio(float(np.exp(ln.mean())), toggling, int(ok.sum()))


def convergence_bin(tput: np.ndarray, running: np.ndarray, new_flow: int, start_bin: int,
                    rate_bit: float, hold: int = HOLD_BINS) -> int | None:
    """M-CONV: the first bin k ≥ start_bin where the new flow's throughput is within [0.8, 1.2] × fair
    share and every flow running in bin k, averaged over bins k … k+hold−1, is within [0.8, 1.2] × fair
    share. Fair share = rate / number of flows running in bin k. None: not reached (censored at the end).
    Bins are one base RTT wide; the caller converts k − start_bin to RTTs and seconds."""
    tput = np.asarray(tput, dtype=float)
    running = np.asarray(running, dtype=bool)
    n_k = tput.shape[1] - hold + 1                 # bins k with a full hold window after them
    if n_k <= max(start_bin, 0):
        return None
    run = running[:, :n_k]
    count = run.sum(axis=0)
    with np.errstate(divide="ignore"):
        fair = rate_bit / count                    # every candidate bin has the new flow running: count ≥ 1
    lo, hi = FAIR_LO * fair, FAIR_HI * fair
    held = sliding_window_view(tput, hold, axis=1).mean(axis=-1)[:, :n_k]   # mean over bins k … k+hold−1
    own = tput[new_flow, :n_k]
    ok = run[new_flow] & (lo <= own) & (own <= hi) & np.all(~run | ((held >= lo) & (held <= hi)), axis=0)
    ok[:max(start_bin, 0)] = False
    hits = np.flatnonzero(ok)
    return int(hits[0]) if hits.size else None


def running_matrix(spans_ns: list[tuple[int, int] | None], t0_ns: int, bin_ns: int, n_bins: int) -> np.ndarray:
    """(flows × bins) True where the flow's span [first, last] covers the whole bin."""
    out = np.zeros((len(spans_ns), n_bins), dtype=bool)
    starts = t0_ns + np.arange(n_bins, dtype=np.int64) * bin_ns
    for i, span in enumerate(spans_ns):
        if span is not None:
            out[i] = (starts >= span[0]) & (starts + bin_ns <= span[1])
    return out
