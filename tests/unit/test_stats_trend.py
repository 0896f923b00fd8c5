"""analysis/stats/trend.py and edivisive.py: the energy statistic against a direct computation, and seeded
nightly series (a sustained step is flagged within 3 nights, an outlier night or a small step is not)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.stats.edivisive import e_divisive, split_statistics
from analysis.stats.trend import trend


def _q_direct(x: np.ndarray, tau: int) -> float:
    a, b = x[:tau], x[tau:]
    m, n = a.size, b.size
    cross = np.abs(a[:, None] - b[None, :]).sum()
    wa = sum(abs(a[i] - a[k]) for i in range(m) for k in range(i + 1, m))
    wb = sum(abs(b[i] - b[k]) for i in range(n) for k in range(i + 1, n))
    e = 2 * cross / (m * n) - wa / (m * (m - 1) / 2) - wb / (n * (n - 1) / 2)
    return m * n / (m + n) * e


def test_energy_statistic_equals_direct_sums():
    x = np.random.default_rng(3).normal(size=13)
    q = split_statistics(np.abs(x[:, None] - x[None, :]), min_size=2)
    assert np.allclose(q, [_q_direct(x, t) for t in range(2, 12)])


def test_e_divisive_finds_two_steps_and_is_seeded():
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.normal(0, 1, 15), rng.normal(6, 1, 15), rng.normal(-4, 1, 15)])
    cps, _ = e_divisive(x, alpha=0.05, seed=1)
    assert {15, 30} <= {c.index for c in cps}
    assert all(c.p_value < 0.05 for c in cps)
    assert e_divisive(x, 0.05, seed=1) == (cps, _)


def _nights(rng, levels, reps=6, cv=0.004):
    return [rng.normal(level, cv * level, reps) for level in levels]


@pytest.mark.parametrize("seed", range(10))
def test_five_percent_step_flagged_within_three_nights(seed):
    rng = np.random.default_rng(seed)
    nights = _nights(rng, [19.0] * 7 + [19.0 * 0.95] * 3)
    early = trend(nights[:8], "higher", 0.02, 0.05, seed=seed)
    assert not early.regression                 # one night is not yet a level
    t = trend(nights, "higher", 0.02, 0.05, seed=seed)
    assert t.regression and t.change_points[-1] == 7 and t.last_good_night == 6
    assert t.step == pytest.approx(-0.05, abs=0.01) and t.p_value < 0.05


def test_delay_step_up_is_a_regression_and_down_is_not():
    rng = np.random.default_rng(2)
    up = trend(_nights(rng, [50.0] * 8 + [53.0] * 4, cv=0.01), "lower", 0.02, 0.05, seed=1)
    assert up.regression and up.last_good_night == 7
    down = trend(_nights(rng, [50.0] * 8 + [47.0] * 4, cv=0.01), "lower", 0.02, 0.05, seed=1)
    assert not down.regression and down.change_points == [8] and down.step < 0


@pytest.mark.parametrize("where", [5, 9])
def test_single_outlier_night_not_flagged(where):
    rng = np.random.default_rng(where)
    nights = _nights(rng, [19.0] * 10)
    nights[where] = nights[where] * 0.8
    t = trend(nights, "higher", 0.02, 0.05, seed=3)
    assert not t.regression and t.last_good_night is None


def test_step_below_min_effect_not_flagged():
    rng = np.random.default_rng(6)
    nights = _nights(rng, [19.0] * 10 + [19.0 * 0.99] * 5, cv=0.001)
    t = trend(nights, "higher", 0.02, 0.05, seed=1)
    assert not t.regression and t.change_points == []
    assert trend(nights, "higher", 0.005, 0.05, seed=1).regression   # the same step beyond a smaller bound


def test_flat_series_rarely_alarm():
    alarms = sum(trend(_nights(np.random.default_rng(s), [19.0] * 20), "higher", 0.02, 0.05, seed=s).regression
                 for s in range(40))
    assert alarms <= 1


def test_nights_without_data_are_skipped_and_indices_kept():
    rng = np.random.default_rng(1)
    nights = _nights(rng, [19.0] * 7 + [18.0] * 4)
    nights.insert(3, [math.nan])
    nights.insert(5, [])
    t = trend(nights, "higher", 0.02, 0.05, seed=1)
    assert t.regression and t.change_points == [9] and t.last_good_night == 8
    assert trend(nights[:3], "higher", 0.02, 0.05, seed=1).change_points == []
