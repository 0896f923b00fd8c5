"""Which trials a night still needs, in which order (pure): repetitions up to each cell's target per variant,
variants alternated ABBA across repetitions (drift over the night hits both sides alike), a failed try retried
as a new attempt up to `repetitions.attempts`, and samples read back per (cell, variant) from settled trials.

Inputs are plain trial rows (dicts as stored in table `trial`); outputs are rows to insert. A slot is (cell,
variant, repetition): it is done when one of its attempts is ok, refused (the testbed cannot run it: trying again
changes nothing) or out of attempts.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from analysis.stats.sequential import abba_order
from orchestrator.campaign import cells as cellmod
from orchestrator.campaign.loader import Cell

RETRYABLE = ("failed", "infra-error")
Slot = tuple[str, str, int]   # cell key, variant, repetition


def variant_order(variants: Sequence[str], repetition: int) -> list[str]:
    """ABBA (analysis/stats/sequential.py, the policy the benchmark measured): the baseline first on even
    repetitions, last on odd ones; with several candidates they keep their order between the baseline's turns."""
    return list(variants) if abba_order(repetition)[0] == "base" else list(reversed(variants))


@dataclass(frozen=True)
class SlotState:
    ok: bool
    attempts: int
    last_status: str
    open: bool         # a pending or running attempt exists


def slot_states(trials: Iterable[dict[str, Any]]) -> dict[Slot, SlotState]:
    grouped: dict[Slot, list[dict[str, Any]]] = {}
    for t in trials:
        grouped.setdefault((t["cell_key"], t["variant"], t["repetition"]), []).append(t)
    out = {}
    for slot, ts in grouped.items():
        ts.sort(key=lambda t: t["attempt"])
        out[slot] = SlotState(any(t["status"] == "ok" for t in ts), len(ts), ts[-1]["status"],
                              any(t["status"] in ("pending", "running") for t in ts))
    return out


def new_trials(campaign: str, night_id: int, night: int, cells: Sequence[Cell], variants: Sequence[str],
               targets: dict[tuple[str, str], int], existing: Sequence[dict[str, Any]], max_attempts: int,
               seeds: dict[tuple[str, int], int], plan_sha: dict[int, str]) -> list[dict[str, Any]]:
    """Rows for every slot below its target that has no attempt yet, and a next attempt for each slot whose
    last attempt failed (attempts left); ordered by repetition, cell, then ABBA over `variants`."""
    states = slot_states(existing)
    seq = max((t["seq"] for t in existing), default=-1) + 1
    top = max(targets.values(), default=0)
    out = []
    for rep in range(top):
        for cell in cells:
            for variant in variant_order([v for v in variants if v in cell.specs], rep):
                if rep >= targets.get((cell.key, variant), 0):
                    continue
                st = states.get((cell.key, variant, rep))
                if st is None:
                    attempt = 0
                elif not st.ok and not st.open and st.last_status in RETRYABLE and st.attempts < max_attempts:
                    attempt = st.attempts
                else:
                    continue
                run_id = cellmod.trial_run_id(campaign, night, cell.key, variant, rep, attempt)
                spec = cellmod.trial_spec(cell.specs[variant], run_id, rep, seeds[(cell.key, rep)])
                out.append({"campaign_run_id": night_id, "seq": seq, "cell_key": cell.key, "cell_label": cell.label,
                            "plan_sha256": plan_sha[cell.plan_index], "variant": variant, "repetition": rep,
                            "attempt": attempt, "run_id": run_id, "spec": spec.model_dump(mode="json")})
                seq += 1
    return out


def samples(trials: Iterable[dict[str, Any]], values: dict[int, dict[str, float]], metric: str
            ) -> dict[tuple[int, str, str], list[float]]:
    """(night id, cell key, variant) -> one value per ok repetition (NaN values left out), in repetition order."""
    best: dict[tuple[int, str, str, int], float] = {}
    for t in trials:
        if t["status"] != "ok":
            continue
        v = values.get(t["id"], {}).get(metric, math.nan)
        if not math.isnan(v):
            best[(t["campaign_run_id"], t["cell_key"], t["variant"], t["repetition"])] = v
    out: dict[tuple[int, str, str], list[float]] = {}
    for (night, cell, variant, _rep), v in sorted(best.items()):
        out.setdefault((night, cell, variant), []).append(v)
    return out


def unfinished(trials: Iterable[dict[str, Any]], max_attempts: int) -> list[Slot]:
    """Slots without an ok attempt whose tries are used up or which were refused: what exit code 2 reports."""
    return sorted(slot for slot, st in slot_states(trials).items()
                  if not st.ok and not st.open and (st.last_status not in RETRYABLE or st.attempts >= max_attempts))
