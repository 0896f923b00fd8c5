"""The repetition policy of a campaign cell: in which order the two variants run, and how many more
repetitions per side to run after a look at the verdicts. The campaign executor and the benchmark
(bench/campaign_stats.py) both call these functions, so the policy that was measured is the one that runs.

- Order ABBA: round 0 runs the baseline then the candidate, round 1 the candidate then the baseline, and so
  on. A slow drift of the testbed (temperature, a neighbour's load) then hits both sides equally over every
  pair of rounds instead of always favouring the side that runs first.
- Looks: first MIN_REPS per side (the smallest sample whose exact Mann-Whitney p-value can survive
  Benjamini-Hochberg over a campaign's checks); then, while any check is INCONCLUSIVE and fewer than MAX_REPS
  per side have run, STEP more per side. STEP = 2 is one whole ABBA block, so every look sees both orders
  equally often, and it is small enough that a check decided at 8 does not run to 10.

Pure, no I/O.
"""
from __future__ import annotations

from collections.abc import Sequence

from analysis.stats.verdict import VerdictName

MIN_REPS = 6
"""Repetitions per side before the first look. With 6 + 6 fully separated values the exact two-sided
Mann-Whitney p is 2 / C(12, 6) = 0.0022, so one real regression survives BH at alpha 0.05 among up to ~23
checks; with 5 + 5 (p = 0.0079) only among 6."""
MAX_REPS = 12
"""Repetitions per side at most (the INCONCLUSIVE that remains is reported as such). 12 + 12 costs 24 runs
per cell; at 8 + 8 the benchmark already decides > 95 % of 5 % changes (docs/statistics.md)."""
STEP = 2
"""Repetitions per side added per look: one ABBA block."""
CAP_REPS = 200
"""A hard bound on max_reps whatever the campaign file says (a cell is never run more often)."""


def abba_order(round_index: int) -> tuple[str, str]:
    """The order of the two variants in round `round_index` (0-based): ("base", "cand") in even rounds,
    ("cand", "base") in odd ones. A round is one repetition per side; rounds count from 0 over the whole
    cell, across looks (k more repetitions per side = the next k rounds)."""
    if round_index < 0:
        raise ValueError(f"round_index {round_index}: must be >= 0")
    return ("base", "cand") if round_index % 2 == 0 else ("cand", "base")


def more_repetitions(n_per_side: int, verdicts: Sequence[VerdictName], min_reps: int = MIN_REPS,
                     max_reps: int = MAX_REPS) -> int:
    """How many more repetitions per side to run now; 0 = stop.
    Below min_reps: up to min_reps (verdicts are not looked at: too few values to decide anything).
    Else, while any verdict is INCONCLUSIVE and n_per_side < max_reps: min(STEP, max_reps - n_per_side)."""
    if n_per_side < 0:
        raise ValueError(f"n_per_side {n_per_side}: must be >= 0")
    if not 1 <= min_reps <= max_reps <= CAP_REPS:
        raise ValueError(f"need 1 <= min_reps ({min_reps}) <= max_reps ({max_reps}) <= {CAP_REPS}")
    if n_per_side < min_reps:
        return min_reps - n_per_side
    if n_per_side >= max_reps or "INCONCLUSIVE" not in verdicts:
        return 0
    return min(STEP, max_reps - n_per_side)
