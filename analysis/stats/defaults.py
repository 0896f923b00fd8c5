"""The recommended defaults of campaign statistics, in one place for the campaign file's schema and the
benchmark (bench/campaign_stats.py measured them; docs/statistics.md gives the figures and the reasons).

min_effect is relative (0.02 = 2 %) and set per metric kind (each metric names its kind and better direction once,
in analysis/compare.py METRICS): half-way between the per-repetition noise a
kind shows on the netns lab and the 5 % change a campaign must catch, so that an unchanged variant PASSes
and a 5 % change REGRESSes after about as many repetitions.
"""
from __future__ import annotations

from typing import Literal

from analysis.stats.edivisive import PERMUTATIONS
from analysis.stats.sequential import MAX_REPS, MIN_REPS
from analysis.stats.verdict import N_BOOT

MetricKind = Literal["throughput", "delay", "fairness", "count"]

ALPHA = 0.05
"""False discovery rate across a campaign's checks (BH), and the level of each one-sided verdict."""
MIN_EFFECT: dict[MetricKind, float] = {
    "throughput": 0.02,   # goodput, utilisation: ~0.1 % run-to-run on the netns lab; 2 % is a real loss
    "delay": 0.025,       # queue delay, RTT: 0.3-2.6 % run-to-run; 2.5 % = half the 5 % target
    "fairness": 0.025,    # Jain's index: ~3.6 % run-to-run with 2 flows over 5 s
    "count": 0.10,        # retransmissions, drops: 13-15 % run-to-run; prefer an absolute bound
}
__all__ = ["ALPHA", "MAX_REPS", "MIN_EFFECT", "MIN_REPS", "MetricKind", "N_BOOT", "PERMUTATIONS"]
