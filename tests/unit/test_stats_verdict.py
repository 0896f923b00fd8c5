"""analysis/stats/verdict.py against SciPy (Mann-Whitney, BH, bootstrap) and the verdict rule's edges."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from analysis.stats.verdict import Estimate, absolute, benjamini_hochberg, decide, estimate

BASE = [19.02, 18.95, 19.11, 18.87, 19.20, 19.05, 18.99]
CAND = [18.60, 18.81, 18.72, 18.93, 18.55, 18.70, 18.79, 18.66]


def test_exact_mann_whitney_equals_scipy():
    e = estimate(BASE, CAND, alpha=0.05, seed=1)
    assert e.method == "exact"
    assert e.p_value == pytest.approx(stats.mannwhitneyu(CAND, BASE, method="exact").pvalue, rel=1e-12)
    overlap = [19.0, 18.9, 19.1, 18.8, 19.3]
    e2 = estimate(BASE, overlap, alpha=0.05, seed=1)
    assert e2.p_value == pytest.approx(stats.mannwhitneyu(overlap, BASE, method="exact").pvalue, rel=1e-12)
    assert e2.p_value > 0.05 > e.p_value


def test_ties_use_an_exhaustive_permutation_of_u():
    base, cand = [3.0, 4, 4, 5, 6], [5.0, 6, 6, 7, 8]
    e = estimate(base, cand, alpha=0.05, seed=1)
    assert e.method == "permutation"
    # every split of the pooled values (252 of them): the two-sided p of U, counted by hand
    pooled = np.array(base + cand)
    u_obs = stats.mannwhitneyu(cand, base).statistic
    us = []
    for idx in itertools.combinations(range(10), 5):
        c = pooled[list(idx)]
        b = np.delete(pooled, list(idx))
        us.append(stats.mannwhitneyu(c, b).statistic)
    us = np.array(us)
    p = min(1.0, 2 * min(np.mean(us >= u_obs - 1e-9), np.mean(us <= u_obs + 1e-9)))
    assert e.p_value == pytest.approx(p, rel=1e-9)


def test_large_samples_with_ties_are_asymptotic():
    rng = np.random.default_rng(4)
    base, cand = rng.integers(0, 5, 30).astype(float), rng.integers(0, 5, 30).astype(float) + 1
    e = estimate(base, cand, alpha=0.05, seed=1)
    assert e.method == "asymptotic"
    assert e.p_value == pytest.approx(stats.mannwhitneyu(cand, base, method="asymptotic").pvalue)


def test_bh_equals_scipy_and_nan_passes_through():
    rng = np.random.default_rng(7)
    p = rng.uniform(0, 0.2, 25)
    assert np.allclose(benjamini_hochberg(p), stats.false_discovery_control(p, method="bh"))
    with_nan = np.insert(p, [3, 10], np.nan)
    adj = benjamini_hochberg(with_nan)
    assert np.isnan(adj[3]) and np.isnan(adj[11])
    assert np.allclose(adj[~np.isnan(adj)], stats.false_discovery_control(p, method="bh"))
    assert np.isnan(benjamini_hochberg([np.nan])).all()
    with pytest.raises(ValueError):
        benjamini_hochberg([0.5, 1.5])


def test_bootstrap_ci_close_to_scipy_percentile():
    rng = np.random.default_rng(11)
    base = rng.lognormal(np.log(19), 0.02, 8)
    cand = rng.lognormal(np.log(18.5), 0.02, 8)
    e = estimate(base, cand, alpha=0.05, seed=3, n_boot=40_000, level=0.95)
    assert e.level == 0.95
    default = estimate(base, cand, alpha=0.05, seed=3, n_boot=40_000)
    assert default.level == pytest.approx(0.90)            # 1 - 2 alpha: each end a one-sided 95 % bound
    assert e.ci_low < default.ci_low <= default.ci_high < e.ci_high

    def ratio(b, c, axis=-1):
        return np.median(c, axis=axis) / np.median(b, axis=axis)

    ref = stats.bootstrap((base, cand), ratio, n_resamples=40_000, method="percentile", confidence_level=0.95,
                          rng=np.random.default_rng(5), vectorized=True).confidence_interval
    width = ref.high - ref.low
    assert e.ci_low == pytest.approx(ref.low, abs=0.05 * width)
    assert e.ci_high == pytest.approx(ref.high, abs=0.05 * width)
    assert e.ci_low <= e.ratio <= e.ci_high


def test_estimate_is_seeded_and_drops_nans():
    a = estimate(BASE + [math.nan], CAND, alpha=0.05, seed=9)
    b = estimate(BASE, CAND, alpha=0.05, seed=9)
    assert a == b and a.n_base == len(BASE)
    c = estimate(BASE, CAND, alpha=0.05, seed=10)
    assert (c.ci_low, c.ci_high) != (b.ci_low, b.ci_high)
    assert c.ci_low == pytest.approx(b.ci_low, rel=0.005)


def test_too_little_data_and_zero_baseline_give_nan_fields():
    e = estimate([1.0, math.nan], CAND, alpha=0.05, seed=1)
    assert e.method == "no data" and not e.ok and math.isnan(e.ratio) and math.isnan(e.p_value)
    assert e.n_base == 1 and e.median_base == 1.0
    z = estimate([0.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0], alpha=0.05, seed=1)
    assert z.method == "zero baseline" and math.isnan(z.ratio)
    d = decide([e, z], ["higher", "lower"], [0.02, 0.02], alpha=0.05)
    assert [x.verdict for x in d] == ["INCONCLUSIVE", "INCONCLUSIVE"]
    assert math.isnan(d[0].p_adjusted)


def _est(ratio: float, lo: float, hi: float, p: float) -> Estimate:
    return Estimate(8, 8, 1.0, ratio, ratio, lo, hi, p, "exact")


@pytest.mark.parametrize(("better", "lo", "hi", "p", "verdict", "improved"), [
    ("higher", 0.93, 0.97, 0.001, "REGRESSION", False),      # whole CI more than 2 % lower
    ("higher", 0.96, 0.99, 0.001, "INCONCLUSIVE", False),    # significant, but the CI reaches within 2 %
    ("higher", 0.93, 0.97, 0.2, "INCONCLUSIVE", False),      # CI beyond, but not significant
    ("higher", 0.985, 1.03, 0.5, "PASS", False),             # worse end within 2 %
    ("higher", 1.03, 1.08, 0.001, "PASS", True),             # significantly better by more than 2 %
    ("higher", 1.03, 1.08, 0.2, "PASS", False),              # better but not significant: PASS, not improved
    ("lower", 1.03, 1.07, 0.001, "REGRESSION", False),       # delay up by more than 2 %
    ("lower", 0.93, 0.97, 0.001, "PASS", True),
    ("lower", 0.99, 1.03, 0.5, "INCONCLUSIVE", False),
])
def test_rule(better, lo, hi, p, verdict, improved):
    (d,) = decide([_est((lo + hi) / 2, lo, hi, p)], [better], [0.02], alpha=0.05)
    assert (d.verdict, d.improved) == (verdict, improved)
    assert d.worse_by[0] <= d.worse_by[1]


def test_bh_applies_across_the_checks_given_together():
    regressing = _est(0.95, 0.93, 0.97, 0.02)
    flat = _est(1.0, 0.99, 1.01, 0.9)
    assert decide([regressing], ["higher"], [0.02], 0.05)[0].verdict == "REGRESSION"
    many = decide([regressing] + [flat] * 9, ["higher"] * 10, [0.02] * 10, 0.05)
    assert many[0].p_adjusted == pytest.approx(0.2)
    assert many[0].verdict == "INCONCLUSIVE"


def test_decide_checks_its_arguments():
    with pytest.raises(ValueError):
        decide([_est(1, 1, 1, 0.5)], ["higher", "lower"], [0.02], 0.05)
    with pytest.raises(ValueError):
        decide([_est(1, 1, 1, 0.5)], ["higher"], [2.0], 0.05)
    with pytest.raises(ValueError):
        decide([_est(1, 1, 1, 0.5)], ["up"], [0.02], 0.05)


def test_absolute():
    delays = [4.1, 4.3, 3.9, 4.0, 4.2, 4.4, 4.05]
    assert absolute(delays, 5.0, "lower", 0.05, seed=1).verdict == "PASS"
    assert absolute(delays, 3.5, "lower", 0.05, seed=1).verdict == "REGRESSION"
    assert absolute(delays, 4.1, "lower", 0.05, seed=1).verdict == "INCONCLUSIVE"
    assert absolute(delays, 3.5, "higher", 0.05, seed=1).verdict == "PASS"
    r = absolute(delays, 5.0, "higher", 0.05, seed=1)
    assert r.verdict == "REGRESSION" and r.worse_by[0] > 0
    assert absolute([1.0], 5.0, "lower", 0.05, seed=1).verdict == "INCONCLUSIVE"
