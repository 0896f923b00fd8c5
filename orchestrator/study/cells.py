"""A study's cells and verdicts (pure): which runs fill a table cell, what they aggregate to, whether that
reproduces the paper's value, and which comparisons a testbed profile erases.

Verdicts, in the order they are decided:
- **not reproducible here**: the cell's arm is in a comparison the profile erased (its arms run identically
  on this testbed), or every run of the cell was refused (the reason is the preflight's);
- **not measured**: no run of the cell is stored complete yet, or the metric has no value in any (the runs'
  notes say why: e.g. no queue-delay rows without paired captures around the queue);
- **no paper value**: the paper printed none for the cell (the measured value is still shown);
- **within tolerance** / **out of tolerance**: |measured - paper| <= max(abs, rel x |paper|).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.engine.arm_identity import identical, why_same
from orchestrator.plan import RunSpec
from orchestrator.study.model import Comparison, Row, Table, Tolerance

NOT_REPRODUCIBLE = "not reproducible here"
NOT_MEASURED = "not measured"
NO_PAPER = "no paper value"
WITHIN = "within tolerance"
OUT = "out of tolerance"

@dataclass(frozen=True)
class Erased:
    """A comparison whose arms run identically on this testbed, and why."""

    comparison: str
    arms: tuple[str, ...]
    why: str


def erased_comparisons(comparisons: Iterable[Comparison], runs: Sequence[RunSpec]) -> list[Erased]:
    """The comparisons (of one plan, `runs` its selected runs as the profile adapted them) whose arms give
    identical runs in every cell where all ran: what the study compares is not on this testbed."""
    out = []
    for c in comparisons:
        cell = identical(runs, c.arms)
        if cell is not None:
            out.append(Erased(c.name, tuple(c.arms), f"arms {' and '.join(c.arms)} give identical runs: "
                              f"{why_same(c.arms, cell)}; the difference the study compares is not on this "
                              "testbed"))
    return out


def time_stretch(spec: RunSpec) -> float:
    """How much the profile stretched the path's times in this run: `keep: bdp` multiplies the rates by the
    run's scale factor f (recorded in its ProfileRef) and the path's times by 1/f, each a `time` substitution;
    1.0 when it stretched none. A queue delay measured in such a run is the study's times this."""
    if spec.profile is None or not any(x.kind == "time" for x in spec.substitutions):
        return 1.0
    return 1.0 / spec.profile.scale_factor


def aggregate(values: Sequence[float], statistic: str) -> float:
    """The repetitions' values (NaN left out) reduced by `statistic`; NaN when none (sd: fewer than 2)."""
    vals = [v for v in values if not math.isnan(v)]
    if statistic == "n":
        return float(len(vals))
    if not vals or (statistic == "sd" and len(vals) < 2):
        return math.nan
    return float({"mean": statistics.fmean, "median": statistics.median, "min": min, "max": max,
                  "sd": statistics.stdev}[statistic](vals))


def verdict(measured: float, paper: float | None, tol: Tolerance) -> str:
    if math.isnan(measured):
        return NOT_MEASURED
    if paper is None:
        return NO_PAPER
    return WITHIN if abs(measured - paper) <= max(tol.abs, tol.rel * abs(paper)) else OUT


@dataclass(frozen=True)
class CellResult:
    table: str
    row: str
    column: str
    paper: float | None
    measured: float
    runs: int                   # stored complete runs of the cell
    verdict: str
    why: str = ""


def cell_selector(table: Table, row: Row, column: str) -> tuple[str | None, str | None, str, str]:
    """(experiment, arm, metric, statistic) of one cell."""
    experiment, arm = row.experiment, row.arm
    statistic = row.statistic or table.statistic
    if table.columns.by == "experiment":
        experiment = column
    elif table.columns.by == "arm":
        arm = column
    else:
        statistic = column
    return experiment, arm, row.metric or table.metric, statistic


def cell_runs(specs: Iterable[RunSpec], experiment: str | None, arm: str | None) -> list[RunSpec]:
    return [s for s in specs if (experiment is None or s.experiment == experiment)
            and (arm is None or s.params.get("arm") == arm)]


def table_cells(table: Table, specs: Sequence[RunSpec], values: Mapping[str, Mapping[str, float]],
                refused: Mapping[str, str], erased: Sequence[Erased], time_metrics: frozenset[str] = frozenset()
                ) -> list[CellResult]:
    """Every cell of `table` in the paper's order. `specs`: the table's plan's selected runs; `values`: run id
    -> metric -> value of the runs stored complete; `refused`: run id -> why, of runs refused on this testbed;
    `time_metrics`: the metrics that are times of the path, divided by each run's time_stretch."""
    out = []
    for row in table.rows:
        tol = row.tolerance or table.tolerance
        for column, paper in zip(table.columns.values, row.paper, strict=True):
            experiment, arm, metric, statistic = cell_selector(table, row, column)
            runs = cell_runs(specs, experiment, arm)
            gone = next((e for e in erased if arm in e.arms), None)
            done = [(s, values[s.run_id]) for s in runs if s.run_id in values]
            unstretch = (lambda s: time_stretch(s)) if metric in time_metrics else (lambda s: 1.0)
            measured = aggregate([v.get(metric, math.nan) * table.scale / unstretch(s) for s, v in done], statistic)
            base = dict(table=table.id, row=row.label, column=column, paper=paper, measured=measured, runs=len(done))
            if gone is not None:
                out.append(CellResult(**base, verdict=NOT_REPRODUCIBLE, why=f"{gone.comparison}: {gone.why}"))
            elif not runs:
                out.append(CellResult(**base, verdict=NOT_MEASURED, why="the study selects no run for this cell"))
            elif all(s.run_id in refused for s in runs):
                out.append(CellResult(**base, verdict=NOT_REPRODUCIBLE, why=refused[runs[0].run_id]))
            else:
                v = verdict(measured, paper, tol)
                why = (f"{len(done)} of {len(runs)} runs stored" if v == NOT_MEASURED and len(done) < len(runs)
                       else f"{metric} has no value in its runs" if v == NOT_MEASURED else "")
                out.append(CellResult(**base, verdict=v, why=why))
    return out
