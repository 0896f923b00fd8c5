"""A night's verdicts (pure): every declared check applied to every cell and candidate, from the trials' metric
values, with the statistics of analysis/stats (docs/statistics.md): relative checks as ratio of medians with a
bootstrap CI and an exact Mann-Whitney test, Benjamini-Hochberg across all of them; absolute checks against their
bound; trend checks over the candidate's nights. Also: how many more repetitions a cell needs, and the exit code.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.compare import METRIC_BY_KEY
from analysis.stats.defaults import MIN_EFFECT
from analysis.stats.sequential import more_repetitions
from analysis.stats.trend import trend
from analysis.stats.verdict import absolute, decide, estimate
from orchestrator.campaign.loader import Cell
from orchestrator.campaign.model import Campaign, Check
from orchestrator.campaign.schedule import samples

NO_DATA = "NO DATA"      # too few ok trials on a side: exit code 2
NOT_APPLICABLE = "N/A"   # the trials are there, the metric is undefined for the cell (Jain's index of one flow)
EXIT_PASS, EXIT_REGRESSION, EXIT_INFRA, EXIT_INCONCLUSIVE = 0, 1, 2, 3


@dataclass(frozen=True)
class VerdictRow:
    check_index: int
    cell_key: str
    cell_label: str
    variant: str
    metric: str
    kind: str
    verdict: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class History:
    """What the verdicts read: every night's trials of the campaign (oldest first), their metric values, and which
    night is tonight."""

    trials: Sequence[dict[str, Any]]
    values: dict[int, dict[str, float]]
    night_ids: Sequence[int]          # done nights and tonight, in night order
    tonight: int


def better_of(check: Check) -> str:
    declared = METRIC_BY_KEY[check.metric].better
    return declared or check.better or "higher"


def min_effect_of(check: Check) -> float:
    """The check's own minimum effect, else its metric kind's default (analysis/stats/defaults.py)."""
    kind = METRIC_BY_KEY[check.metric].kind
    return check.min_effect if check.min_effect is not None else MIN_EFFECT.get(kind, MIN_EFFECT["throughput"])


def _seed(base: int, *parts: object) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, (base, *parts))).encode()).digest()[:4], "big")


def _clean(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def baseline_samples(c: Campaign, per: dict, h: History, cell: str) -> list[float]:
    """Tonight's baseline values, or with `baseline.nights: N` those of its last N nights and tonight."""
    nights = [h.tonight] if c.baseline.nights is None else list(h.night_ids)[-(c.baseline.nights + 1):]
    return [v for n in nights for v in per.get((n, cell, c.baseline.variant), [])]


def _estimate_detail(e: Any, base: list[float], cand: list[float]) -> dict[str, Any]:
    return {"n_base": e.n_base, "n_cand": e.n_cand, "median_base": e.median_base, "median_cand": e.median_cand,
            "ratio": e.ratio, "ci": [e.ci_low, e.ci_high], "p": e.p_value, "test": e.method,
            "base": base, "cand": cand}


def judge(c: Campaign, cells: Sequence[Cell], h: History) -> list[VerdictRow]:
    rows: list[VerdictRow] = []
    rel: list[tuple[int, Cell, str, Any, dict[str, Any]]] = []
    by_metric = {m: samples(h.trials, h.values, m) for m in {ch.metric for ch in c.checks}}
    for i, check in enumerate(c.checks):
        per = by_metric[check.metric]
        for cell in cells:
            for variant in c.checked_variants(check):
                if variant not in cell.specs:
                    continue
                cand = _clean(per.get((h.tonight, cell.key, variant), []))
                seed = _seed(c.seed, i, cell.key, variant)
                if check.kind == "relative":
                    base = _clean(baseline_samples(c, per, h, cell.key))
                    if min(len(base), len(cand)) < 2:
                        rows.append(VerdictRow(i, cell.key, cell.label, variant, check.metric, check.kind,
                                               _missing(h, cell.key, variant), {"base": base, "cand": cand}))
                        continue
                    e = estimate(base, cand, alpha=check.alpha, seed=seed)
                    rel.append((i, cell, variant, e, _estimate_detail(e, base, cand)))
                elif check.kind == "absolute":
                    rows.append(_absolute(i, check, cell, variant, cand, seed, h))
                else:
                    rows.append(_trend(i, check, cell, variant, per, h, seed))
    if rel:
        decisions = decide([r[3] for r in rel], [better_of(c.checks[r[0]]) for r in rel],
                           [min_effect_of(c.checks[r[0]]) for r in rel], alpha=min(ch.alpha for ch in c.checks))
        for (i, cell, variant, _e, detail), d in zip(rel, decisions, strict=True):
            check = c.checks[i]
            rows.append(VerdictRow(i, cell.key, cell.label, variant, check.metric, check.kind, d.verdict,
                                   {**detail, "p_adjusted": d.p_adjusted, "improved": d.improved,
                                    "worse_by": list(d.worse_by), "min_effect": min_effect_of(check),
                                    "better": better_of(check)}))
    return sorted(rows, key=lambda r: (r.check_index, r.cell_label, r.variant))


def _missing(h: History, cell: str, variant: str) -> str:
    """Why a side has fewer than 2 values tonight: too few ok trials (NO DATA), or a metric the cell's runs do not
    define (N/A: every ok trial's value is NaN)."""
    ok = sum(1 for t in h.trials if t["status"] == "ok" and t["campaign_run_id"] == h.tonight
             and t["cell_key"] == cell and t["variant"] == variant)
    return NOT_APPLICABLE if ok >= 2 else NO_DATA


def _absolute(i: int, check: Check, cell: Cell, variant: str, cand: list[float], seed: int, h: History
              ) -> VerdictRow:
    if len(cand) < 2:
        return VerdictRow(i, cell.key, cell.label, variant, check.metric, check.kind, _missing(h, cell.key, variant),
                          {"cand": cand})
    assert check.bound is not None
    d = absolute(cand, check.bound, better_of(check), check.alpha, seed)
    e = d.estimate
    return VerdictRow(i, cell.key, cell.label, variant, check.metric, check.kind, d.verdict,
                      {"median_cand": e.median_cand, "ci": [e.ci_low, e.ci_high], "bound": check.bound,
                       "better": better_of(check), "cand": cand})


def _trend(i: int, check: Check, cell: Cell, variant: str, per: dict, h: History, seed: int) -> VerdictRow:
    kept = [(n, s) for n in h.night_ids if (s := _clean(per.get((n, cell.key, variant), [])))]
    if len(kept) < 3:
        return VerdictRow(i, cell.key, cell.label, variant, check.metric, check.kind, NO_DATA,
                          {"nights": [n for n, _ in kept], "note": "fewer than 3 nights with values"})
    t = trend([s for _, s in kept], better_of(check), min_effect_of(check), check.alpha, seed)
    verdict = "REGRESSION" if t.regression else "PASS"
    last_good = kept[t.last_good_night][0] if t.last_good_night is not None else None
    return VerdictRow(i, cell.key, cell.label, variant, check.metric, check.kind, verdict,
                      {"nights": [n for n, _ in kept], "medians": [float(np.median(s)) for _, s in kept],
                       "change_points": [kept[j][0] for j in t.change_points], "step": t.step,
                       "p": t.p_value, "last_good_night_id": last_good, "min_effect": min_effect_of(check),
                       "better": better_of(check)})


def extra_repetitions(c: Campaign, rows: Sequence[VerdictRow], done: dict[tuple[str, str], int]) -> dict[str, int]:
    """Cell key -> repetitions more per side: the relative and absolute verdicts of a cell decide (one policy for
    the whole campaign: analysis/stats/sequential.py). `done`: (cell, variant) -> ok repetitions tonight."""
    by_cell: dict[str, list[str]] = {}
    for r in rows:
        if r.kind in ("relative", "absolute") and r.verdict not in (NO_DATA, NOT_APPLICABLE):
            by_cell.setdefault(r.cell_key, []).append(r.verdict)
    out = {}
    for cell, verdicts in by_cell.items():
        n = min((k for (ck, _v), k in done.items() if ck == cell), default=0)
        more = more_repetitions(n, verdicts, c.repetitions.min, c.repetitions.max)
        if more:
            out[cell] = more
    return out


def exit_code(rows: Sequence[VerdictRow], unfinished: int, strict: bool) -> int:
    """1 a regression (a finding outranks a broken night), 2 trials that never succeeded or a check without data
    (N/A, a metric the cell does not define, is not a failure), 3 inconclusive with --strict, else 0."""
    verdicts = {r.verdict for r in rows}
    if "REGRESSION" in verdicts:
        return EXIT_REGRESSION
    if unfinished or NO_DATA in verdicts:
        return EXIT_INFRA
    if strict and "INCONCLUSIVE" in verdicts:
        return EXIT_INCONCLUSIVE
    return EXIT_PASS
