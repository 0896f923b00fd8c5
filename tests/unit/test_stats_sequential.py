"""analysis/stats/sequential.py (ABBA order, repetitions per look) and seeded campaign simulations through
analysis/stats/simulate.py: A/A campaigns rarely regress, a 5 % change is decided within 8 per side."""
from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from analysis.stats.sequential import MAX_REPS, MIN_REPS, STEP, abba_order, more_repetitions
from analysis.stats.simulate import pool_draw, run_campaign

ROOT = Path(__file__).resolve().parents[2]


def test_abba_alternates():
    assert [abba_order(i) for i in range(4)] == [("base", "cand"), ("cand", "base")] * 2
    with pytest.raises(ValueError):
        abba_order(-1)


def test_more_repetitions():
    assert more_repetitions(0, [], 6, 12) == 6
    assert more_repetitions(4, ["PASS"], 6, 12) == 2          # below the minimum verdicts do not count
    assert more_repetitions(6, ["PASS", "REGRESSION"], 6, 12) == 0
    assert more_repetitions(6, ["PASS", "INCONCLUSIVE"], 6, 12) == STEP
    assert more_repetitions(11, ["INCONCLUSIVE"], 6, 12) == 1
    assert more_repetitions(12, ["INCONCLUSIVE"], 6, 12) == 0
    assert more_repetitions(MIN_REPS, ["INCONCLUSIVE"]) == min(STEP, MAX_REPS - MIN_REPS)
    with pytest.raises(ValueError):
        more_repetitions(0, [], 8, 6)


# netns-like noise (tests/fixtures/campaign/netns_reps.csv): goodput ~0.3 % CV, queue delay ~1.5 % CV (a 5 %
# change can be decided within 8 per side when the per-repetition CV is below ~2 %: docs/statistics.md)
GOODPUT = np.random.default_rng(1).normal(19.1, 0.06, 50)
QDELAY = np.random.default_rng(2).normal(55.0, 0.8, 50)
BETTER = ["higher", "lower"]
MIN_EFFECT = [0.02, 0.025]


def test_aa_campaigns_rarely_regress():
    draw = pool_draw([GOODPUT, QDELAY])
    results = [run_campaign(draw, BETTER, MIN_EFFECT, 0.05, seed=s, n_boot=2000) for s in range(150)]
    regress = sum(any(d.verdict == "REGRESSION" for d in r.decisions) for r in results)
    assert regress <= 2
    assert all(MIN_REPS <= r.n_per_side <= MAX_REPS for r in results)


@pytest.mark.parametrize(("factors", "metric"), [((0.95, 1.0), 0), ((1.0, 1.05), 1)])
def test_five_percent_change_is_decided_within_eight(factors, metric):
    draw = pool_draw([GOODPUT, QDELAY], factor_cand=factors)
    results = [run_campaign(draw, BETTER, MIN_EFFECT, 0.05, seed=s, n_boot=2000) for s in range(60)]
    at8 = [r.verdict_at(metric, 8) for r in results]
    assert sum(v != "INCONCLUSIVE" for v in at8) >= 0.9 * len(results)
    assert at8.count("REGRESSION") >= 0.9 * len(results)
    assert all(r.decided_at(metric) is not None for r in results)


def test_campaign_is_reproducible():
    draw = pool_draw([GOODPUT, QDELAY], factor_cand=(0.98, 1.0))
    a = run_campaign(draw, BETTER, MIN_EFFECT, 0.05, seed=5, n_boot=500)
    b = run_campaign(draw, BETTER, MIN_EFFECT, 0.05, seed=5, n_boot=500)
    assert a == b


def _fixture_columns(cell: str, metrics: list[str]) -> list[np.ndarray]:
    path = Path(__file__).resolve().parents[1] / "fixtures/campaign/netns_reps.csv"
    with path.open() as f:
        rows = [r for r in csv.DictReader(line for line in f if not line.startswith("#")) if r["flows"] == cell]
    assert len(rows) >= 20
    return [np.array([float(r[m]) for r in rows]) for m in metrics]


def test_real_netns_samples_aa_and_injected():
    """The lab's own per-run values (tests/fixtures/campaign/): A/A never regresses, 5 % less goodput does."""
    cols = _fixture_columns("2", ["goodput", "queue delay p99"])
    aa = [run_campaign(pool_draw(cols), BETTER, MIN_EFFECT, 0.05, seed=s, n_boot=1000) for s in range(60)]
    assert not any(d.verdict == "REGRESSION" for r in aa for d in r.decisions)
    hit = [run_campaign(pool_draw(cols, factor_cand=(0.95, 1.0)), BETTER, MIN_EFFECT, 0.05, seed=s, n_boot=1000)
           for s in range(30)]
    assert all(r.verdict_at(0, 8) == "REGRESSION" for r in hit)


def test_benchmark_runs_and_prints_its_figures(capsys):
    spec = importlib.util.spec_from_file_location("campaign_stats", ROOT / "bench/campaign_stats.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--campaigns", "10", "--injected", "4", "--series", "2", "--n-boot", "500"]) == 0
    out = capsys.readouterr().out
    for needle in ("false REGRESSION", "decided@8", "flagged after k nights", "verdict agreement"):
        assert needle in out
