"""The nightly trend of one check: change points over nights, whether the newest level is a sustained
regression, and the last good night.

The unit is a night: each night contributes the median of its repetitions. Repetitions of one night share
that night's conditions (the machine's load, the build), so treating them as independent points would make
one odd night look like a significant change; a permutation test that shuffles nights is valid.

Rule (docs/statistics.md):
1. E-Divisive (analysis/stats/edivisive.py) on the night medians, segments of >= MIN_SEGMENT nights,
   permutation test at alpha, seeded.
2. Minimum magnitude: a change point whose adjacent segment medians differ by less than min_effect
   (relative) is dropped and its segments merged, smallest first, until every remaining step is >= min_effect.
3. regression = there is a change point, the last segment (the newest level) is worse than the segment
   before it by more than min_effect (the step), it has >= MIN_SEGMENT nights, and every one of its nights is
   worse than the previous level by at least SUSTAIN_FRACTION * min_effect (sustained to the last night:
   a level that came back, or a last segment made of one good and one outlying night, is not a regression).
4. last_good_night = the night before the regressing level began.

Pure: NumPy only (via edivisive), no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.stats.edivisive import MAX_POINTS, PERMUTATIONS, e_divisive
from analysis.stats.verdict import Better

MIN_SEGMENT = 2
"""Nights per level at least: one night is an outlier until the next night confirms it."""
SUSTAIN_FRACTION = 0.5
"""Each night of the newest level must be worse than the previous level by this share of min_effect: a
margin for night-to-night noise that still refuses a level made of one normal and one outlying night."""
MAX_NIGHTS = MAX_POINTS
"""Only the most recent nights are analysed (indices still count from the first night given)."""


@dataclass(frozen=True)
class Trend:
    change_points: list[int]          # night indices (into the nights given) where a new level starts
    step: float                       # relative change of the last segment vs the one before (NaN if none)
    regression: bool                  # the newest level is a sustained step worse than min_effect
    last_good_night: int | None       # the night before the regressing level began (None: no regression)
    p_value: float                    # permutation p of the newest change point (else of the rejected split)
    levels: tuple[float, ...] = ()    # the median of each segment, oldest first


def _worse(ratio: float, better: Better) -> float:
    """Relative worse-ness of a level ratio new/old (positive = worse)."""
    return 1.0 - ratio if better == "higher" else ratio - 1.0


def _merge_small(series: np.ndarray, cps: list[int], min_effect: float) -> list[int]:
    """Drop the change point with the smallest adjacent-level change while it is below min_effect."""
    cps = sorted(cps)
    while cps:
        edges = [0, *cps, series.size]
        meds = [float(np.median(series[a:b])) for a, b in zip(edges[:-1], edges[1:], strict=True)]
        changes = [abs(meds[i + 1] / meds[i] - 1.0) if meds[i] else math.inf for i in range(len(cps))]
        smallest = int(np.argmin(changes))
        if changes[smallest] >= min_effect:
            break
        del cps[smallest]
    return cps


def trend(nights: Sequence[Sequence[float]], better: Better, min_effect: float, alpha: float,
          seed: int, permutations: int = PERMUTATIONS) -> Trend:
    """The trend of a check over nights (oldest first; each night its per-repetition values). Nights
    without a finite value are skipped (an infrastructure failure is not a level)."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    if not 0.0 <= min_effect < 1.0:
        raise ValueError(f"min_effect {min_effect}: a relative effect in [0, 1)")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha {alpha}: must be in (0, 0.5)")
    index, medians = [], []
    for i, night in enumerate(nights):
        v = np.asarray(night, dtype=float).ravel()
        v = v[np.isfinite(v)]
        if v.size:
            index.append(i)
            medians.append(float(np.median(v)))
    index, medians = index[-MAX_NIGHTS:], medians[-MAX_NIGHTS:]
    series = np.asarray(medians)
    none = Trend([], math.nan, False, None, math.nan,
                 (float(np.median(series)),) if series.size else ())
    if series.size < 2 * MIN_SEGMENT:
        return none
    found, rejected_p = e_divisive(series, alpha, seed, min_size=MIN_SEGMENT, permutations=permutations)
    p_of = {c.index: c.p_value for c in found}
    cps = _merge_small(series, list(p_of), min_effect)
    if not cps:
        return Trend([], math.nan, False, None, rejected_p, none.levels)
    edges = [0, *cps, series.size]
    levels = tuple(float(np.median(series[a:b])) for a, b in zip(edges[:-1], edges[1:], strict=True))
    last, prev = levels[-1], levels[-2]
    step = last / prev - 1.0 if prev else math.nan
    start = cps[-1]
    tail = series[start:]
    regression = bool(
        prev and _worse(last / prev, better) > min_effect and tail.size >= MIN_SEGMENT
        and all(_worse(v / prev, better) >= SUSTAIN_FRACTION * min_effect for v in tail))
    return Trend(change_points=[index[c] for c in cps], step=step, regression=regression,
                 last_good_night=index[start - 1] if regression else None,
                 p_value=p_of[start], levels=levels)
