"""Seeded simulation of one campaign cell under the repetition policy: the benchmark
(bench/campaign_stats.py) and the unit tests run campaigns through this, so what they measure is the
policy of analysis/stats/sequential.py and the rule of analysis/stats/verdict.py, nothing re-implemented.

A campaign here is a set of checks decided together (Benjamini-Hochberg over all of them); each repetition
of a side yields one value per check (e.g. goodput and queue delay of the same run), drawn by the caller.

Pure, no I/O.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.stats.sequential import MAX_REPS, MIN_REPS, abba_order, more_repetitions
from analysis.stats.verdict import N_BOOT, Better, Decision, decide, estimate

Draw = Callable[[str, np.random.Generator], np.ndarray]
"""draw(side, rng) -> one value per check for one repetition of side ("base" or "cand")."""


@dataclass(frozen=True)
class CampaignResult:
    decisions: list[Decision]     # at the last look
    n_per_side: int               # repetitions per side run in all
    looks: int                    # how many times the verdicts were computed
    history: tuple[tuple[int, tuple[str, ...]], ...] = ()   # (n per side, every check's verdict) per look

    def verdict_at(self, check: int, n_per_side: int) -> str:
        """Check's verdict at the last look with at most n_per_side repetitions per side ("" before any)."""
        seen = [v[check] for n, v in self.history if n <= n_per_side]
        return seen[-1] if seen else ""

    def decided_at(self, check: int) -> int | None:
        """Repetitions per side from which the check's verdict was decided and stayed so to the end."""
        first = None
        for n, v in self.history:
            if v[check] == "INCONCLUSIVE":
                first = None
            elif first is None:
                first = n
        return first


def run_campaign(draw: Draw, better: Sequence[Better], min_effect: Sequence[float], alpha: float, seed: int,
                 min_reps: int = MIN_REPS, max_reps: int = MAX_REPS, n_boot: int = N_BOOT) -> CampaignResult:
    """Run repetitions in ABBA order, look after each batch more_repetitions asked for, stop when it says 0."""
    rng = np.random.default_rng(seed)
    values: dict[str, list[np.ndarray]] = {"base": [], "cand": []}
    decisions: list[Decision] = []
    n, looks, rounds = 0, 0, 0
    history: list[tuple[int, tuple[str, ...]]] = []
    while (k := more_repetitions(n, [d.verdict for d in decisions], min_reps, max_reps)) > 0:
        for _ in range(k):
            for side in abba_order(rounds):
                values[side].append(np.asarray(draw(side, rng), dtype=float))
            rounds += 1
        n += k
        base, cand = np.array(values["base"]), np.array(values["cand"])
        # one seed per look and check, derived from the campaign's: a look is reproducible on its own
        ests = [estimate(base[:, j], cand[:, j], alpha, seed=seed * 1000 + looks * 37 + j, n_boot=n_boot)
                for j in range(base.shape[1])]
        decisions = decide(ests, better, min_effect, alpha)
        looks += 1
        history.append((n, tuple(d.verdict for d in decisions)))
    return CampaignResult(decisions, n, looks, tuple(history))


def pool_draw(pools: Sequence[np.ndarray], factor_cand: Sequence[float] | None = None) -> Draw:
    """A draw that resamples whole repetitions (rows) from real per-repetition samples: pools[j] is check j's
    column (rows = runs, so metrics of one run stay together). Both sides draw from the same pool (an A/A
    campaign) unless factor_cand multiplies the candidate's values per check (an injected change).

    Smoothed, variance-preserving bootstrap: a drawn row gets Gaussian kernel noise (Silverman's bandwidth
    per column) and is shrunk back toward the column mean so the variance stays the sample's,
        x = mean + (row - mean + h eps) / sqrt(1 + h^2 / s^2).
    Why: a plain bootstrap from 25 runs puts the very same value on both sides of a campaign, and those
    ties are an artefact no real campaign has (they would also force the slow permutation p-value)."""
    table = np.column_stack([np.asarray(p, dtype=float) for p in pools])
    table = table[np.isfinite(table).all(axis=1)]
    if table.shape[0] < 2:
        raise ValueError("pool_draw needs at least 2 complete rows")
    factors = np.ones(table.shape[1]) if factor_cand is None else np.asarray(factor_cand, dtype=float)
    mean = table.mean(axis=0)
    sd = table.std(axis=0, ddof=1)
    iqr = np.subtract(*np.percentile(table, [75, 25], axis=0))
    spread = np.where(iqr > 0, np.minimum(sd, iqr / 1.34), sd)
    h = 0.9 * spread * table.shape[0] ** -0.2
    with np.errstate(divide="ignore", invalid="ignore"):
        shrink = np.where(sd > 0, 1.0 / np.sqrt(1.0 + (h / sd) ** 2), 1.0)

    def draw(side: str, rng: np.random.Generator) -> np.ndarray:
        row = table[rng.integers(0, table.shape[0])]
        row = mean + (row - mean + h * rng.standard_normal(row.size)) * shrink
        return row * factors if side == "cand" else row

    return draw
