"""Benchmark: the campaign statistics (analysis/stats/) on simulated campaigns resampled from real runs.

Usage: .venv/bin/python bench/campaign_stats.py [--samples CSV] [--campaigns N] [--injected N] [--series N]
                                               [--n-boot N] [--seed S]

The samples are one value per run of the netns lab (tests/fixtures/campaign/netns_reps.csv: CUBIC, htb
20 Mbit/s, pfifo 100, a 1-flow and a 2-flow cell, 25 runs each). A simulated repetition draws one run per cell
from them (smoothed bootstrap, analysis/stats/simulate.py), in ABBA order, and every look decides all checks
together (BH) under the repetition policy of analysis/stats/sequential.py, as a campaign does.
Checks: goodput, queue delay median and p99 of both cells, Jain's index of the 2-flow cell (7 checks).
Figures printed:
1. A/A: both sides from the same runs, --campaigns campaigns (default 1000: 7,000 checks; the figures in
   docs/statistics.md ran 2000): false REGRESSION rate per check and per campaign (target <= 1 %), PASS share,
   repetitions per side run.
2. Injected 5 % change (candidate x 0.95 for goodput, x 1.05 for queue delay median and p99, one check at a
   time, --injected campaigns each): share decided (PASS or REGRESSION) with <= 8 per side, share REGRESSION
   (power), and the repetitions per side after which the verdict was decided for good.
3. Trend: --series series of nights (6 runs per night): a sustained 5 % step after 10 flat nights, detected
   after how many nights; false alarms on 20 flat nights evaluated every night.
The simulations use --n-boot resamples (default 2000, for time); the figure "verdict agreement" re-decides
200 campaigns' last looks with the recommended 10,000 to show that the verdicts do not depend on it.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from scipy import stats

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from analysis.compare import METRICS  # noqa: E402
from analysis.stats import defaults as D  # noqa: E402
from analysis.stats.sequential import MAX_REPS, MIN_REPS, STEP  # noqa: E402
from analysis.stats.simulate import CampaignResult, pool_draw, run_campaign  # noqa: E402
from analysis.stats.trend import trend  # noqa: E402
from analysis.stats.verdict import N_BOOT, decide, estimate  # noqa: E402

SAMPLES = REPO_ROOT / "tests/fixtures/campaign/netns_reps.csv"
CELLS = {"1": ["goodput", "queue delay median", "queue delay p99"],
         "2": ["goodput", "queue delay median", "queue delay p99", "Jain's index"]}
CHECKS = [(cell, metric) for cell, metrics in CELLS.items() for metric in metrics]
BY_NAME = {m.name: m for m in METRICS}          # the metrics' one declaration: direction and kind
BETTER = [BY_NAME[m].better for _, m in CHECKS]
MIN_EFFECT = [D.MIN_EFFECT[BY_NAME[m].kind] for _, m in CHECKS]
NIGHT_REPS = 6
FLAT_NIGHTS = 10


def load(path: Path) -> dict[str, dict[str, np.ndarray]]:
    with path.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return {cell: {m: np.array([float(r[m]) for r in rows if r["flows"] == cell]) for m in metrics}
            for cell, metrics in CELLS.items()}


def campaign_draw(pools: dict[str, dict[str, np.ndarray]], factor: dict[tuple[str, str], float] | None = None):
    factor = factor or {}
    draws = {cell: pool_draw([pools[cell][m] for m in metrics], [factor.get((cell, m), 1.0) for m in metrics])
             for cell, metrics in CELLS.items()}
    return lambda side, rng: np.concatenate([draws[cell](side, rng) for cell in CELLS])


def label(check: tuple[str, str]) -> str:
    return f"{check[0]}-flow {check[1]}"


def dist(values: list[int | None]) -> str:
    c = Counter("never" if v is None else v for v in values)
    keys = sorted((k for k in c if k != "never"), key=int) + (["never"] if "never" in c else [])
    return " ".join(f"{k}:{100 * c[k] / len(values):.0f}%" for k in keys)


def aa(pools, n: int, n_boot: int, seed: int) -> list[CampaignResult]:
    draw = campaign_draw(pools)
    res = [run_campaign(draw, BETTER, MIN_EFFECT, D.ALPHA, seed=seed + i, n_boot=n_boot) for i in range(n)]
    print(f"\n1. A/A: {n} campaigns x {len(CHECKS)} checks, both sides from the same runs")
    print(f"   {'check':34s} {'min_effect':>10s} {'REGRESSION':>10s} {'PASS':>6s} {'PASS@8':>7s} {'CV':>6s}")
    for j, check in enumerate(CHECKS):
        v = [r.decisions[j].verdict for r in res]
        pool = pools[check[0]][check[1]]
        print(f"   {label(check):34s} {MIN_EFFECT[j]:10.3f} {100 * v.count('REGRESSION') / n:9.2f}% "
              f"{100 * v.count('PASS') / n:5.1f}% {100 * np.mean([r.verdict_at(j, 8) == 'PASS' for r in res]):6.1f}% "
              f"{100 * pool.std(ddof=1) / pool.mean():5.2f}%")
    any_reg = np.mean([any(d.verdict == "REGRESSION" for d in r.decisions) for r in res])
    per_check = np.mean([d.verdict == "REGRESSION" for r in res for d in r.decisions])
    k = int(round(any_reg * n))
    upper = stats.binomtest(k, n).proportion_ci(0.95, method="exact").high
    print(f"   false REGRESSION: {100 * per_check:.3f} % of checks, {100 * any_reg:.2f} % of campaigns "
          f"(95 % upper bound {100 * upper:.2f} %; target <= 1 %)")
    print(f"   repetitions per side run: {dist([r.n_per_side for r in res])}; "
          f"campaigns ending with an INCONCLUSIVE check: "
          f"{100 * np.mean([any(d.verdict == 'INCONCLUSIVE' for d in r.decisions) for r in res]):.1f} %")
    return res


def aa_as_run(path: Path) -> None:
    """One real A/A campaign: the lab's runs in the order they ran, assigned to the sides in ABBA order."""
    with path.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    by_rep = {cell: sorted((r for r in rows if r["flows"] == cell), key=lambda r: int(r["repetition"]))
              for cell in CELLS}
    runs = iter(range(min(len(v) for v in by_rep.values())))

    def draw(side: str, rng: np.random.Generator) -> np.ndarray:
        k = next(runs)
        return np.array([float(by_rep[cell][k][m]) for cell, metrics in CELLS.items() for m in metrics])

    r = run_campaign(draw, BETTER, MIN_EFFECT, D.ALPHA, seed=1)
    verdicts = Counter(d.verdict for d in r.decisions)
    print(f"   the lab's own runs as one A/A campaign (repetition order, ABBA): {r.n_per_side} per side, "
          + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())))


def agreement(pools, res: list[CampaignResult], n_boot_sim: int) -> None:
    """Re-decide the last look of the first campaigns with the recommended n_boot: same verdicts?"""
    draw = campaign_draw(pools)
    same = total = 0
    for i, r in enumerate(res[:200]):
        rng = np.random.default_rng(10_000 + i)
        rows = np.array([draw("base", rng) for _ in range(2 * r.n_per_side)])
        base, cand = rows[: r.n_per_side], rows[r.n_per_side:]
        verdicts = []
        for nb in (n_boot_sim, N_BOOT):
            ests = [estimate(base[:, j], cand[:, j], D.ALPHA, seed=i, n_boot=nb) for j in range(len(CHECKS))]
            verdicts.append([d.verdict for d in decide(ests, BETTER, MIN_EFFECT, D.ALPHA)])
        same += sum(a == b for a, b in zip(*verdicts, strict=True))
        total += len(CHECKS)
    print(f"   verdict agreement n_boot {n_boot_sim} vs {N_BOOT}: {100 * same / total:.1f} % of {total} checks")


def injected(pools, n: int, n_boot: int, seed: int) -> None:
    print(f"\n2. Injected 5 % change in one check ({n} campaigns each; other checks A/A)")
    print(f"   {'changed check':34s} {'decided@8':>9s} {'REGR@8':>7s} {'REGR@end':>8s}  "
          "decided for good after n per side")
    for j, check in enumerate(CHECKS):
        if check[1] not in ("goodput", "queue delay median", "queue delay p99"):
            continue
        f = 0.95 if BETTER[j] == "higher" else 1.05
        draw = campaign_draw(pools, {check: f})
        res = [run_campaign(draw, BETTER, MIN_EFFECT, D.ALPHA, seed=seed + i, n_boot=n_boot) for i in range(n)]
        at8 = [r.verdict_at(j, 8) for r in res]
        print(f"   {label(check):34s} {100 * np.mean([v != 'INCONCLUSIVE' for v in at8]):8.1f}% "
              f"{100 * at8.count('REGRESSION') / n:6.1f}% "
              f"{100 * np.mean([r.decisions[j].verdict == 'REGRESSION' for r in res]):7.1f}%  "
              f"{dist([r.decided_at(j) for r in res])}")


def night_values(pool: np.ndarray, rng: np.random.Generator, nights: int, factor: np.ndarray) -> list[np.ndarray]:
    draw = pool_draw([pool])
    return [np.array([draw("base", rng)[0] for _ in range(NIGHT_REPS)]) * factor[k] for k in range(nights)]


def trends(pools, n: int, seed: int) -> None:
    print(f"\n3. Trend: {n} series per check, {NIGHT_REPS} runs per night, min_effect as above, alpha {D.ALPHA}")
    print(f"   {'check':34s} {'5 % step after 10 flat nights: flagged after k nights':54s} {'flat 20 nights':>16s}")
    for j, check in enumerate(CHECKS):
        if check[1] not in ("goodput", "queue delay median", "queue delay p99"):
            continue
        pool = pools[check[0]][check[1]]
        f = 0.95 if BETTER[j] == "higher" else 1.05
        first: list[int | None] = []
        alarms_any = alarms = evals = 0
        for i in range(n):
            rng = np.random.default_rng(seed + i)
            factor = np.array([1.0] * FLAT_NIGHTS + [f] * 6)
            nights = night_values(pool, rng, len(factor), factor)
            hit = None
            for k in range(1, 7):
                t = trend(nights[:FLAT_NIGHTS + k], BETTER[j], MIN_EFFECT[j], D.ALPHA, seed=i)
                if t.regression and t.last_good_night == FLAT_NIGHTS - 1:
                    hit = k
                    break
            first.append(hit)
            flat = night_values(pool, rng, 20, np.ones(20))
            flags = [trend(flat[:m], BETTER[j], MIN_EFFECT[j], D.ALPHA, seed=i).regression for m in range(4, 21)]
            alarms += sum(flags)
            evals += len(flags)
            alarms_any += any(flags)
        within3 = np.mean([h is not None and h <= 3 for h in first])
        print(f"   {label(check):34s} {dist(first):40s} <=3: {100 * within3:5.1f}% "
              f"{100 * alarms / evals:5.2f}%/night {100 * alarms_any / n:4.1f}%/series")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=Path, default=SAMPLES)
    ap.add_argument("--campaigns", type=int, default=1000)
    ap.add_argument("--injected", type=int, default=200)
    ap.add_argument("--series", type=int, default=100)
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    pools = load(args.samples)
    print(f"campaign statistics benchmark: samples {args.samples.name} "
          f"({', '.join(f'{c}-flow {len(next(iter(p.values())))} runs' for c, p in pools.items())})")
    print(f"alpha {D.ALPHA} (BH across the {len(CHECKS)} checks; CI level {1 - 2 * D.ALPHA:.2f}); "
          f"min_effect {D.MIN_EFFECT}; reps per side {MIN_REPS}..{MAX_REPS} step {STEP} (ABBA); "
          f"n_boot {args.n_boot} in the simulations")
    t0 = time.perf_counter()
    res = aa(pools, args.campaigns, args.n_boot, args.seed)
    aa_as_run(args.samples)
    agreement(pools, res, args.n_boot)
    t1 = time.perf_counter()
    injected(pools, args.injected, args.n_boot, args.seed + 100_000)
    t2 = time.perf_counter()
    trends(pools, args.series, args.seed + 200_000)
    t3 = time.perf_counter()
    print(f"\ntime: A/A {t1 - t0:.0f} s, injected {t2 - t1:.0f} s, trend {t3 - t2:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
