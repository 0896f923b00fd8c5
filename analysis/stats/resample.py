"""The numeric engines of the campaign statistics: the seeded, vectorised percentile bootstrap of a median
and of a ratio of medians, and the Mann-Whitney U test with the method chosen for the sample at hand.

Pure (NumPy/SciPy only). Every function takes its seed explicitly: the same inputs and seed give the same
numbers on every machine, so a nightly verdict can be recomputed from the stored samples.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

MAX_SAMPLES = 1000
"""Values per side at most: a campaign runs tens of repetitions per side, so more is a caller's mistake. It
also bounds the cost of one estimate (MAX_BOOT x MAX_SAMPLES draws at worst)."""
MAX_BOOT = 100_000
"""Bootstrap resamples at most (n_boot is clipped to it)."""
BOOT_CELLS = 40_000
"""Index-matrix cells per chunk: resamples are drawn in chunks of BOOT_CELLS // n rows. Chunks that stay in
the CPU cache make 10,000 resamples of 8 values ~2x faster than one big matrix, and memory stays bounded
whatever n_boot and n are. (Part of the reproducibility contract: changing it changes the random stream.)"""
EXACT_MAX_N = 100
"""Largest side for the exact Mann-Whitney distribution (SciPy computes it in ~10 ms at 100 + 100)."""
PERMUTATION_MAX_N = 20
"""With ties the exact null distribution SciPy tabulates is wrong (it assumes distinct values): up to this
many values per side the p-value comes from a permutation test of U (exhaustive when there are at most
PERMUTATIONS distinct arrangements, e.g. 7 + 7; else seeded random); above it the tie-corrected normal
approximation is good."""
PERMUTATIONS = 9_999


def clean(values: Sequence[float]) -> np.ndarray:
    """Finite float values (NaN and inf dropped: a repetition without the metric has no vote)."""
    a = np.asarray(values, dtype=float).ravel()
    a = a[np.isfinite(a)]
    if a.size > MAX_SAMPLES:
        raise ValueError(f"{a.size} values on one side: at most {MAX_SAMPLES} (MAX_SAMPLES)")
    return a


def _boot_medians(rng: np.random.Generator, x: np.ndarray, n_boot: int) -> np.ndarray:
    """n_boot medians of resamples (with replacement, size len(x)) of x, drawn chunk by chunk."""
    rows = max(1, BOOT_CELLS // x.size)
    out = np.empty(n_boot)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        idx = rng.integers(0, x.size, size=(stop - start, x.size))
        out[start:stop] = _row_medians(x[idx])
    return out


def _row_medians(v: np.ndarray) -> np.ndarray:
    """np.median(v, axis=1), by a full sort of each row: ~4x faster than np.median's partition for the
    short rows met here (its per-call overhead dominates), and the same numbers."""
    s = np.sort(v, axis=1)
    n = v.shape[1]
    return 0.5 * (s[:, (n - 1) // 2] + s[:, n // 2])


def _n_boot(n_boot: int) -> int:
    if n_boot < 100:
        raise ValueError(f"n_boot {n_boot}: at least 100 resamples for a percentile interval")
    return min(int(n_boot), MAX_BOOT)


def percentile_interval(samples: np.ndarray, alpha: float) -> tuple[float, float]:
    """The (alpha/2, 1 - alpha/2) percentiles of the bootstrap distribution (linear interpolation, as
    scipy.stats.bootstrap's method="percentile"). Infinite resamples (a zero baseline median) stay infinite."""
    finite = samples[~np.isnan(samples)]
    if finite.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(finite, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def ratio_of_medians_ci(base: np.ndarray, cand: np.ndarray, alpha: float, seed: int,
                        n_boot: int) -> tuple[float, float]:
    """Percentile bootstrap CI (level 1 - alpha) of median(cand) / median(base), each side resampled
    independently (two-sample bootstrap: the repetitions of the two variants are independent runs).

    Percentile rather than BCa: with 5-15 values the bootstrap distribution of a median is a handful of
    atoms, and BCa's jackknife acceleration of a median is then unstable (it jumps with one value); the
    percentile interval is the one whose behaviour the benchmark measured (docs/statistics.md)."""
    rng = np.random.default_rng(seed)
    n = _n_boot(n_boot)
    mb = _boot_medians(rng, base, n)
    mc = _boot_medians(rng, cand, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = mc / mb
    return percentile_interval(ratios, alpha)


def median_ci(x: np.ndarray, alpha: float, seed: int, n_boot: int) -> tuple[float, float]:
    """Percentile bootstrap CI (level 1 - alpha) of median(x)."""
    rng = np.random.default_rng(seed)
    return percentile_interval(_boot_medians(rng, x, _n_boot(n_boot)), alpha)


def mann_whitney(base: np.ndarray, cand: np.ndarray, seed: int) -> tuple[float, str]:
    """Two-sided Mann-Whitney U p-value of cand vs base, and the method used:
    "exact" (no ties, both sides <= EXACT_MAX_N: the exact null distribution of U),
    "permutation" (ties, both sides <= PERMUTATION_MAX_N: a permutation test of U, seeded),
    "asymptotic" (otherwise: normal approximation with tie and continuity corrections)."""
    pooled = np.concatenate([base, cand])
    ties = np.unique(pooled).size < pooled.size
    if not ties and max(base.size, cand.size) <= EXACT_MAX_N:
        method: object = "exact"
        name = "exact"
    elif ties and max(base.size, cand.size) <= PERMUTATION_MAX_N:
        method = stats.PermutationMethod(n_resamples=PERMUTATIONS, rng=np.random.default_rng(seed))
        name = "permutation"
    else:
        method = "asymptotic"
        name = "asymptotic"
    if np.unique(pooled).size == 1:
        return 1.0, name            # every value equal: no evidence of a difference (SciPy would give NaN)
    res = stats.mannwhitneyu(cand, base, alternative="two-sided", method=method)
    return float(min(1.0, res.pvalue)), name
