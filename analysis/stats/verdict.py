"""Campaign verdicts: one check (a metric of one cell), candidate variant vs baseline, each side one
steady-state value per repetition. Owns the estimate (ratio of medians, bootstrap CI, Mann-Whitney p),
the Benjamini-Hochberg adjustment across a campaign's checks, the three-way verdict rule, and the
absolute check (the candidate's median against a fixed bound).

The CI is a percentile bootstrap interval at level 1 - 2 alpha (ci_level: 90 % for alpha 0.05), so that each
verdict below is a one-sided test at alpha. The rule (docs/statistics.md), with the CI turned into relative
worse-ness w = (w_lo, w_hi), positive = worse
(better="higher": w = 1 - ratio; better="lower": w = ratio - 1):
- REGRESSION: BH-adjusted p < alpha AND w_lo > min_effect (the whole CI is worse than the minimum effect);
- PASS: w_hi <= min_effect (the CI's worse end is within the minimum effect); improved=True when also
  adjusted p < alpha and w_hi < -min_effect (significantly better by more than the minimum effect);
- INCONCLUSIVE: anything else, including a check without data (NaN estimate). More repetitions decide it.

Pure: NumPy/SciPy, no database, no manager.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

from analysis.stats.resample import clean, mann_whitney, median_ci, ratio_of_medians_ci

Better = Literal["higher", "lower"]
VerdictName = Literal["PASS", "REGRESSION", "INCONCLUSIVE"]
CheckKind = Literal["relative", "absolute"]

NAN = float("nan")
N_BOOT = 10_000
"""Default bootstrap resamples: the CI ends move by < 0.1 % of the ratio between seeds at 8 + 8 values
(docs/statistics.md), and one estimate costs ~2 ms."""
MIN_SIDE = 2
"""Fewer values than this on a side: no estimate (NaN fields, method "no data")."""


@dataclass(frozen=True)
class Estimate:
    """One check: candidate vs baseline samples (one value per repetition, NaNs dropped)."""
    n_base: int
    n_cand: int
    median_base: float
    median_cand: float
    ratio: float                  # median_cand / median_base
    ci_low: float                 # percentile bootstrap CI of the ratio, at `level` (default 1 - 2 alpha)
    ci_high: float
    p_value: float                # two-sided Mann-Whitney U of cand vs base
    method: str                   # "exact" / "permutation" / "asymptotic"; "no data"; "zero baseline"
    level: float = 0.90           # the CI's confidence level

    @property
    def ok(self) -> bool:
        """An estimate exists (enough data and a non-zero baseline median)."""
        return not math.isnan(self.ratio)


@dataclass(frozen=True)
class Decision:
    estimate: Estimate
    p_adjusted: float             # Benjamini-Hochberg across every check decided together
    verdict: VerdictName
    improved: bool                # significant and the whole CI better than min_effect (verdict PASS)
    worse_by: tuple[float, float]  # the CI as relative worse-ness, low <= high, positive = worse
    min_effect: float = NAN
    better: Better = "higher"


@dataclass(frozen=True)
class AbsoluteDecision:
    """Kind "absolute": the candidate's median against a fixed bound (no baseline, no p-value)."""
    n: int
    median: float
    ci_low: float                 # percentile bootstrap CI of the median (ci_level)
    ci_high: float
    threshold: float
    better: Better
    verdict: VerdictName
    worse_by: tuple[float, float]  # the CI relative to the bound, positive = on the bad side
    kind: CheckKind = "absolute"


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha {alpha}: must be in (0, 0.5)")


def ci_level(alpha: float, level: float | None = None) -> float:
    """The CI level used with `alpha`: 1 - 2 alpha unless given. Each end of a 1 - 2 alpha interval is a
    one-sided bound at 1 - alpha, and each verdict is a one-sided question (is the change worse than
    min_effect? is it within min_effect?), so each is then a test at level alpha: the two one-sided tests
    (TOST) of equivalence testing. A 1 - alpha interval would make both verdicts tests at alpha / 2."""
    lvl = 1.0 - 2.0 * alpha if level is None else float(level)
    if not 0.5 <= lvl < 1.0:
        raise ValueError(f"CI level {lvl}: must be in [0.5, 1)")
    return lvl


def _no_estimate(b: np.ndarray, c: np.ndarray, method: str, level: float) -> Estimate:
    med_b = float(np.median(b)) if b.size else NAN
    med_c = float(np.median(c)) if c.size else NAN
    return Estimate(b.size, c.size, med_b, med_c, NAN, NAN, NAN, NAN, method, level)


def estimate(base: Sequence[float], cand: Sequence[float], alpha: float, seed: int,
             n_boot: int = N_BOOT, level: float | None = None) -> Estimate:
    """Ratio of medians (cand / base) with its percentile bootstrap CI (level: ci_level(alpha, level), by
    default 1 - 2 alpha), and the two-sided Mann-Whitney p-value. NaNs are dropped; with fewer than MIN_SIDE
    values on a side, or a baseline median <= 0 (a ratio means nothing then: use an absolute check), the
    ratio, CI and p are NaN and `method` says why."""
    _check_alpha(alpha)
    lvl = ci_level(alpha, level)
    b, c = clean(base), clean(cand)
    if b.size < MIN_SIDE or c.size < MIN_SIDE:
        return _no_estimate(b, c, "no data", lvl)
    med_b, med_c = float(np.median(b)), float(np.median(c))
    if med_b <= 0:
        return _no_estimate(b, c, "zero baseline", lvl)
    lo, hi = ratio_of_medians_ci(b, c, 1.0 - lvl, seed, n_boot)
    p, method = mann_whitney(b, c, seed)
    return Estimate(b.size, c.size, med_b, med_c, med_c / med_b, lo, hi, p, method, lvl)


def benjamini_hochberg(p: Sequence[float]) -> np.ndarray:
    """BH-adjusted p-values (step-up, as scipy.stats.false_discovery_control(method="bh")); a NaN stays NaN
    and does not count among the tests (a check without data tests nothing)."""
    arr = np.asarray(p, dtype=float).ravel()
    out = np.full(arr.shape, np.nan)
    ok = ~np.isnan(arr)
    if ok.any():
        if ((arr[ok] < 0) | (arr[ok] > 1)).any():
            raise ValueError("p-values must lie in [0, 1]")
        out[ok] = stats.false_discovery_control(arr[ok], method="bh")
    return out


def worse_by(low: float, high: float, better: Better) -> tuple[float, float]:
    """A ratio interval as relative worse-ness (positive = worse), ordered low <= high."""
    if better == "higher":
        return 1.0 - high, 1.0 - low
    if better == "lower":
        return low - 1.0, high - 1.0
    raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")


def _rule(p_adj: float, w: tuple[float, float], min_effect: float, alpha: float) -> tuple[VerdictName, bool]:
    w_lo, w_hi = w
    if math.isnan(p_adj) or math.isnan(w_lo) or math.isnan(w_hi):
        return "INCONCLUSIVE", False
    significant = p_adj < alpha
    if significant and w_lo > min_effect:
        return "REGRESSION", False
    if w_hi <= min_effect:
        return "PASS", significant and w_hi < -min_effect
    return "INCONCLUSIVE", False


def decide(estimates: Sequence[Estimate], better: Sequence[Better], min_effect: Sequence[float],
           alpha: float) -> list[Decision]:
    """The verdict of every check, with BH over the whole list (pass every check of a campaign at once)."""
    _check_alpha(alpha)
    if not len(estimates) == len(better) == len(min_effect):
        raise ValueError(f"{len(estimates)} estimates, {len(better)} better, {len(min_effect)} min_effect")
    for m in min_effect:
        if not 0.0 <= m < 1.0:
            raise ValueError(f"min_effect {m}: a relative effect in [0, 1), e.g. 0.02 for 2 %")
    p_adj = benjamini_hochberg([e.p_value for e in estimates])
    out = []
    for e, b, m, pa in zip(estimates, better, min_effect, p_adj, strict=True):
        w = worse_by(e.ci_low, e.ci_high, b)
        verdict, improved = _rule(float(pa), w, m, alpha)
        out.append(Decision(e, float(pa), verdict, improved, w, m, b))
    return out


def absolute(cand: Sequence[float], threshold: float, better: Better, alpha: float, seed: int,
             n_boot: int = N_BOOT, level: float | None = None) -> AbsoluteDecision:
    """The candidate's median against a fixed bound: REGRESSION when the whole bootstrap CI of the median
    (ci_level: 1 - 2 alpha by default, so each side is a one-sided test at alpha) is on the bad side of the
    bound, PASS when it is all on the good side (or on the bound), INCONCLUSIVE when it straddles the bound
    or there are fewer than MIN_SIDE values."""
    _check_alpha(alpha)
    lvl = ci_level(alpha, level)
    c = clean(cand)
    if c.size < MIN_SIDE:
        med = float(np.median(c)) if c.size else NAN
        return AbsoluteDecision(c.size, med, NAN, NAN, threshold, better, "INCONCLUSIVE", (NAN, NAN))
    lo, hi = median_ci(c, 1.0 - lvl, seed, n_boot)
    scale = abs(threshold) if threshold else 1.0    # relative to the bound; a zero bound: absolute units
    if better == "lower":
        w = ((lo - threshold) / scale, (hi - threshold) / scale)
    elif better == "higher":
        w = ((threshold - hi) / scale, (threshold - lo) / scale)
    else:
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    verdict: VerdictName = "REGRESSION" if w[0] > 0 else "PASS" if w[1] <= 0 else "INCONCLUSIVE"
    return AbsoluteDecision(c.size, float(np.median(c)), lo, hi, threshold, better, verdict, w)
