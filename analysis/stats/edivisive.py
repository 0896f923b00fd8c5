"""E-Divisive change-point detection (Matteson & James, 2014), in NumPy: the energy statistic, its
permutation test, and the hierarchical bisection. tcplab's trend (analysis/stats/trend.py) runs it on one
value per night.

Why our own: the packaged implementation (signal-processing-algorithms 2.1.6) installs, but pins numpy < 2
(tcplab runs NumPy 2), setuptools < 71 at run time and pulls gevent; the algorithm itself is ~100 lines.

Energy statistic of a split of a segment x[0:T] at tau (left x[0:tau], right x[tau:T], sizes m and n):
    E(tau) = 2/(m n) sum |x_i - y_j|  -  1/C(m,2) sum_{i<k} |x_i - x_k|  -  1/C(n,2) sum_{j<k} |y_j - y_k|
    Q(tau) = m n / (m + n) * E(tau)
(exponent 1 on the distances; the right end is the segment's end, as in the common "kappa = T" variant).
Every split of a segment comes from one 2-D prefix sum of the distance matrix, so all taus (and a batch of
permutations) are one vectorised computation.

Bisection: each current segment proposes its best split (largest Q, both sides >= min_size); the best of
these is tested by permutation: the values are shuffled within every current segment, the best split is
searched again, and p = (1 + #{permuted max Q >= observed}) / (1 + R). Accepted while p < alpha.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PERMUTATIONS = 499
"""Default permutations per test: p-values resolve to 0.002, which is enough against alpha 0.05."""
MAX_PERMUTATIONS = 9_999
MAX_POINTS = 400
"""Series length at most (the caller keeps the most recent points); a distance matrix of 400^2 floats."""
BATCH_CELLS = 4_000_000
"""Distance-matrix cells per permutation batch (~32 MB of float64)."""
MAX_CHANGE_POINTS = 20
"""Bisection stops after this many accepted change points (bounds the number of permutation tests)."""


@dataclass(frozen=True)
class ChangePoint:
    index: int                    # the first point of the new segment
    q: float                      # energy statistic of the split that found it
    p_value: float                # its permutation p-value


def _prefix(d: np.ndarray) -> np.ndarray:
    """P[..., a, b] = sum of d[..., :a, :b] (zero-padded 2-D prefix sum)."""
    shape = d.shape[:-2] + (d.shape[-2] + 1, d.shape[-1] + 1)
    p = np.zeros(shape)
    p[..., 1:, 1:] = d.cumsum(axis=-2).cumsum(axis=-1)
    return p


def split_statistics(d: np.ndarray, min_size: int) -> np.ndarray:
    """Q(tau) for tau = min_size .. T - min_size of segments with distance matrices d (..., T, T); shape
    (..., T - 2 min_size + 1). Empty when the segment is shorter than 2 min_size."""
    t = d.shape[-1]
    if t < 2 * min_size:
        return np.empty(d.shape[:-2] + (0,))
    p = _prefix(d)
    tau = np.arange(min_size, t - min_size + 1)
    block = p[..., tau, tau]                      # sum over the left x left block (each pair twice)
    row = p[..., tau, t]                          # the left rows against everything
    total = p[..., t, t][..., None]
    cross = row - block
    right = total - 2 * row + block               # the right x right block (each pair twice)
    m = tau.astype(float)
    n = (t - tau).astype(float)
    within_left = (block / 2) / (m * (m - 1) / 2)
    within_right = (right / 2) / (n * (n - 1) / 2)
    energy = 2 * cross / (m * n) - within_left - within_right
    return m * n / (m + n) * energy


def _best_split(x: np.ndarray, bounds: list[tuple[int, int]], min_size: int) -> tuple[float, int]:
    """(Q, global index) of the best split over all segments; (-inf, -1) when none can split."""
    best_q, best_i = -np.inf, -1
    for start, stop in bounds:
        seg = x[start:stop]
        q = split_statistics(np.abs(seg[:, None] - seg[None, :]), min_size)
        if q.size and q.max() > best_q:
            best_q, best_i = float(q.max()), start + min_size + int(q.argmax())
    return best_q, best_i


def _permuted_max(x: np.ndarray, bounds: list[tuple[int, int]], min_size: int, rng: np.random.Generator,
                  permutations: int) -> np.ndarray:
    """The best split's Q under `permutations` shuffles within every segment (the null: no change inside
    any current segment)."""
    best = np.full(permutations, -np.inf)
    for start, stop in bounds:
        seg = x[start:stop]
        t = seg.size
        if t < 2 * min_size:
            rng.random((permutations, t))        # keep the stream independent of which segments split
            continue
        order = np.argsort(rng.random((permutations, t)), axis=1)
        rows = max(1, BATCH_CELLS // (t * t))
        for b0 in range(0, permutations, rows):
            s = seg[order[b0:b0 + rows]]                          # (batch, t)
            d = np.abs(s[:, :, None] - s[:, None, :])
            q = split_statistics(d, min_size).max(axis=1)
            best[b0:b0 + rows] = np.maximum(best[b0:b0 + rows], q)
    return best


def e_divisive(series: np.ndarray, alpha: float, seed: int, min_size: int = 2,
               permutations: int = PERMUTATIONS) -> tuple[list[ChangePoint], float]:
    """Significant change points of `series` (sorted by index), and the p-value of the first split that
    was NOT accepted (NaN when no further split was possible). Seeded: same series and seed, same result."""
    x = np.asarray(series, dtype=float)
    if x.ndim != 1 or not np.isfinite(x).all():
        raise ValueError("e_divisive needs a 1-D series of finite values")
    if x.size > MAX_POINTS:
        raise ValueError(f"{x.size} points: at most {MAX_POINTS} (MAX_POINTS); pass the most recent")
    if min_size < 2:
        raise ValueError("min_size must be >= 2 (a segment's within-distance needs a pair)")
    r = int(min(max(permutations, 19), MAX_PERMUTATIONS))
    rng = np.random.default_rng(seed)
    found: list[ChangePoint] = []
    edges = [0, x.size]
    rejected_p = float("nan")
    while len(found) < MAX_CHANGE_POINTS:
        bounds = list(zip(edges[:-1], edges[1:], strict=True))
        q_obs, idx = _best_split(x, bounds, min_size)
        if idx < 0:
            break
        null = _permuted_max(x, bounds, min_size, rng, r)
        # a tolerance: a permutation that reproduces the observed split must count as "as extreme" even
        # when summation order changes the last bits
        p = float((1 + np.count_nonzero(null >= q_obs * (1 - 1e-12))) / (1 + r))
        if p >= alpha:
            rejected_p = p
            break
        found.append(ChangePoint(idx, q_obs, p))
        edges = sorted(edges + [idx])
    return sorted(found, key=lambda c: c.index), rejected_p
