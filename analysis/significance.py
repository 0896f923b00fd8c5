"""Significance over repetitions (M-STAT, transperf-style run-vs-run diff): Welch's t-test and the
95 % t-interval, implemented here because scipy is not a dependency.

The Student t tail is computed from the regularized incomplete beta function,
    P(|T| > t) = I_{ν/(ν+t²)}(ν/2, 1/2),
with I_x(a, b) evaluated by the Lentz continued fraction (Numerical Recipes §6.4), accurate to ~1e-12
for the degrees of freedom met here. The two-sided p-value of Welch's test uses the
Welch–Satterthwaite degrees of freedom. Pure functions, no I/O.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_EPS = 1e-15
_TINY = 1e-300
_MAX_ITER = 500


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction for I_x(a, b) (modified Lentz); converges fast for x < (a+1)/(a+b+2)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_ITER + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if a <= 0 or b <= 0:
        raise ValueError(f"betainc needs a, b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    front = math.exp(log_front)
    # use the symmetry I_x(a,b) = 1 − I_{1−x}(b,a) where the fraction converges faster
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with df degrees of freedom (df may be fractional)."""
    if df <= 0 or math.isnan(df) or math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The t value with P(T ≤ t) = p (0.5 < p < 1), by bisection on t_two_sided_p (monotone in t)."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"t_quantile needs 0.5 < p < 1, got {p}")
    target = 2.0 * (1.0 - p)
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > target:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_two_sided_p(mid, df) > target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class WelchResult:
    """Welch's unequal-variance t-test of mean(b) − mean(a). p is two-sided; NaN when either side has
    fewer than two values or both variances are zero (no spread: the test is undefined)."""

    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    diff: float
    t: float
    df: float
    p: float


def welch_t_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> WelchResult:
    """Welch's t-test; NaN values are dropped first."""
    xa = np.asarray(a, dtype=float)
    xb = np.asarray(b, dtype=float)
    xa, xb = xa[~np.isnan(xa)], xb[~np.isnan(xb)]
    na, nb = int(xa.size), int(xb.size)
    ma = float(xa.mean()) if na else math.nan
    mb = float(xb.mean()) if nb else math.nan
    nan = math.nan
    if na < 2 or nb < 2:
        return WelchResult(na, nb, ma, mb, mb - ma, nan, nan, nan)
    va, vb = float(xa.var(ddof=1)) / na, float(xb.var(ddof=1)) / nb
    se2 = va + vb
    if se2 == 0.0:
        return WelchResult(na, nb, ma, mb, mb - ma, nan, nan, nan)
    t = (mb - ma) / math.sqrt(se2)
    df = se2 * se2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    return WelchResult(na, nb, ma, mb, mb - ma, t, df, t_two_sided_p(t, df))


def t_interval(values: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of the `level` t-interval of the mean (M-STAT across repetitions); the
    bounds are NaN with fewer than two values."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    half = t_quantile(0.5 + level / 2.0, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half
