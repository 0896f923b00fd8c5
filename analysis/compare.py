"""`tcplab compare A B`: two selections of runs side by side, per-metric differences and Welch's t-test
over repetitions (the unit is a run: per-packet samples of one run are autocorrelated and would make any
difference look significant).

`compare_results` is pure (analysed runs in, ComparisonRow values out); `compare` adds the DB reading
and `format_comparison` the rich table.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from rich.table import Table
from sqlalchemy.engine import Engine

from analysis.load import iter_runs
from analysis.runstats import RunAnalysis, analyse
from analysis.select import Selection, select
from analysis.significance import welch_t_test
from analysis.stats.defaults import MetricKind
from analysis.summary import fmt_num, render_plain

SIGNIFICANCE = 0.05


def _flows_mean(r: RunAnalysis, get: Callable) -> float:
    vals = [v for v in (get(f) for f in r.flows) if not math.isnan(v)]
    return float(np.mean(vals)) if vals else math.nan


@dataclass(frozen=True)
class MetricDef:
    key: str                      # the name campaign checks use (docs/campaigns.md#metrics)
    name: str
    unit: str
    better: Literal["higher", "lower"] | None   # declared once here; None: a campaign check must say
    kind: MetricKind | None                    # its default minimum effect in a campaign (analysis/stats/defaults)
    value: Callable[[RunAnalysis], float]
    scale: float = 1.0            # display factor (bit/s -> Mbit/s)


METRICS: tuple[MetricDef, ...] = (
    MetricDef("goodput", "goodput", "Mbit/s", "higher", "throughput", lambda r: r.row.goodput_bps, 1e-6),
    MetricDef("utilisation_wire", "utilisation (wire)", "%", "higher", "throughput",
              lambda r: r.utilisation.wire.mean if r.utilisation else math.nan, 100),
    MetricDef("utilisation_payload", "utilisation (payload)", "%", "higher", "throughput",
              lambda r: r.utilisation.payload.mean if r.utilisation else math.nan, 100),
    MetricDef("qdelay_mean", "queue delay mean", "ms", "lower", "delay", lambda r: r.qdelay.mean, 1e-3),
    MetricDef("qdelay_median", "queue delay median", "ms", "lower", "delay", lambda r: r.qdelay.median, 1e-3),
    MetricDef("qdelay_p99", "queue delay p99", "ms", "lower", "delay", lambda r: r.qdelay.p99, 1e-3),
    MetricDef("rtt_median", "RTT median (timestamps)", "ms", "lower", "delay",
              lambda r: _flows_mean(r, lambda f: f.rtt.median), 1e-3),
    MetricDef("srtt_mean", "srtt mean (tcp_probe)", "ms", "lower", "delay",
              lambda r: _flows_mean(r, lambda f: f.srtt.mean), 1e-3),
    MetricDef("cwnd_mean", "cwnd mean", "segments", None, None, lambda r: _flows_mean(r, lambda f: f.cwnd.mean)),
    MetricDef("jain", "Jain's index", "", "higher", "fairness", lambda r: r.jain),
    MetricDef("drop_rate", "drop rate (qdisc)", "%", "lower", "count", lambda r: r.qdisc_drop_rate, 100),
    MetricDef("ce_fraction", "CE fraction", "%", None, None, lambda r: _flows_mean(r, lambda f: f.signals.ce_fraction),
              100),
    MetricDef("data_packets", "data packets past the bottleneck", "per run", None, None,
              lambda r: float(sum(f.signals.data_packets for f in r.flows)) if r.flows else math.nan),
    MetricDef("cwnd_collapse", "reductions that collapsed cwnd (M-CWNDCOLLAPSE)", "%", "lower", None,
              lambda r: _flows_mean(r, lambda f: f.reductions.collapsed_share), 100),
    MetricDef("retransmissions", "retransmissions", "per run", "lower", "count",
              lambda r: float(sum(f.retransmissions for f in r.flows))),
)
METRIC_BY_KEY = {m.key: m for m in METRICS}
"""What compare shows, one value per run each (flow metrics are averaged over the run's flows)."""


@dataclass(frozen=True)
class ComparisonRow:
    metric: str
    unit: str
    a: tuple[float, ...]          # per-run values, display units
    b: tuple[float, ...]
    mean_a: float
    mean_b: float
    diff: float                   # mean_b − mean_a
    rel: float                    # diff / |mean_a|
    t: float
    df: float
    p: float                      # Welch two-sided; NaN with < 2 runs on a side or no spread


def compare_results(a: Sequence[RunAnalysis], b: Sequence[RunAnalysis]) -> list[ComparisonRow]:
    rows = []
    for metric in METRICS:
        va = tuple(metric.value(r) * metric.scale for r in a)
        vb = tuple(metric.value(r) * metric.scale for r in b)
        w = welch_t_test(va, vb)
        rel = w.diff / abs(w.mean_a) if w.mean_a and not math.isnan(w.mean_a) else math.nan
        rows.append(ComparisonRow(metric.name, metric.unit, va, vb, w.mean_a, w.mean_b, w.diff, rel, w.t, w.df, w.p))
    return rows


def format_comparison(sel_a: Selection, sel_b: Selection, rows: Sequence[ComparisonRow], width: int = 160) -> str:
    """Plain text (no colour codes) so it can be piped and tested."""
    table = Table(title=f"A = {sel_a.label} ({len(sel_a.run_ids)} runs)   B = {sel_b.label} "
                        f"({len(sel_b.run_ids)} runs)")
    for header, right in (("metric", False), ("unit", False), ("A mean", True), ("B mean", True),
                          ("B − A", True), ("B − A %", True), ("Welch p", True), ("", False)):
        table.add_column(header, justify="right" if right else "left")
    for r in rows:
        verdict = "" if math.isnan(r.p) else ("significant" if r.p < SIGNIFICANCE else "n.s.")
        table.add_row(r.metric, r.unit, *(fmt_num(v, ".4g") for v in (r.mean_a, r.mean_b, r.diff)),
                      fmt_num(100 * r.rel, "+.1f"), fmt_num(r.p, ".3g"), verdict)
    few = min(len(sel_a.run_ids), len(sel_b.run_ids)) < 2
    note = (f"Welch's t-test over runs (two-sided, α = {SIGNIFICANCE}); "
            + ("no test: a side has fewer than 2 runs (repetitions)." if few else "each run is one sample."))
    return render_plain(table, width) + note + "\n"


def compare(engine: Engine, selector_a: str, selector_b: str) -> tuple[Selection, Selection, list[ComparisonRow]]:
    """Resolve both selectors (SelectorError if either names no run), analyse their runs, compare."""
    sel_a, sel_b = select(engine, selector_a), select(engine, selector_b)
    # a run in both selections is loaded and analysed once
    ids = list(dict.fromkeys(sel_a.run_ids + sel_b.run_ids))
    done = {r.run_id: r for r in (analyse(d) for d in iter_runs(engine, ids, detail=True))}
    return sel_a, sel_b, compare_results([done[i] for i in sel_a.run_ids], [done[i] for i in sel_b.run_ids])


def metric_values(r: RunAnalysis) -> dict[str, float]:
    """Every metric of one analysed run in its display unit: a campaign trial's one value per metric."""
    return {m.key: float(m.value(r) * m.scale) for m in METRICS}


def run_metric_values(engine: Engine, run_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """run id -> metric key -> value, for the stored runs among `run_ids` (each loaded and analysed once)."""
    return {d.meta.run_id: metric_values(analyse(d)) for d in iter_runs(engine, list(run_ids), detail=True)}
