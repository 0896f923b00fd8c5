"""M-STAT: distribution summaries, quantile sketches and box-plot statistics (pure numpy).

The one place percentiles are computed, so every table and plot states the same method.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PERCENTILE_METHOD = "linear"
"""M-STAT: linear interpolation between closest ranks (Hyndman & Fan type 7), recorded with results."""

SKETCH_POINTS = 1001
"""Quantiles kept per run for CDFs and pooled box plots (every 0.1 %): enough to draw a smooth CDF and
read p99 back within one sketch step, small enough to keep for hundreds of runs."""


def percentile(values: np.ndarray | Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks; NaN if empty."""
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

    def scaled(self, factor: float) -> Stats:
        """The same summary in another unit (e.g. ns -> µs with factor 1e-3); n is unchanged."""
        return Stats(self.n, *(getattr(self, f) * factor for f in STAT_FIELDS))


STAT_FIELDS = ("min", "mean", "median", "sd", "p95", "p99", "max")
"""The value fields of Stats, in table order."""


def summary_stats(values: np.ndarray | Sequence[float]) -> Stats:
    """M-STAT summary of a sample; all-NaN fields (n=0) for an empty sample. NaNs are ignored."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        nan = math.nan
        return Stats(0, nan, nan, nan, nan, nan, nan, nan)
    return Stats(n=int(arr.size), min=float(arr.min()), mean=float(arr.mean()),
                 median=percentile(arr, 50), sd=float(arr.std()), p95=percentile(arr, 95),
                 p99=percentile(arr, 99), max=float(arr.max()))


def quantile_sketch(values: np.ndarray | Sequence[float], points: int = SKETCH_POINTS) -> np.ndarray:
    """`points` quantiles at probabilities linspace(0, 1, points) (same method as `percentile`);
    empty for an empty sample. A CDF is the sketch against those probabilities."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return np.empty(0)
    return np.quantile(arr, np.linspace(0.0, 1.0, points), method=PERCENTILE_METHOD)


@dataclass(frozen=True)
class BoxStats:
    """One box of a box plot: quartiles, whiskers at the furthest data within 1.5 IQR of the box."""

    q1: float
    median: float
    q3: float
    whisker_lo: float
    whisker_hi: float
    n: int


def box_stats(values: np.ndarray | Sequence[float]) -> BoxStats:
    """Tukey box (the Paced Chirping plots' convention): Q1-Q3, whiskers at the most extreme samples
    within 1.5 IQR of the quartiles. NaN fields for an empty sample."""
    arr = np.sort(np.asarray(values, dtype=float))
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        nan = math.nan
        return BoxStats(nan, nan, nan, nan, nan, 0)
    q1, med, q3 = (percentile(arr, q) for q in (25, 50, 75))
    iqr = q3 - q1
    inside = arr[(arr >= q1 - 1.5 * iqr) & (arr <= q3 + 1.5 * iqr)]
    return BoxStats(q1=q1, median=med, q3=q3, whisker_lo=float(inside.min()), whisker_hi=float(inside.max()),
                    n=int(arr.size))
