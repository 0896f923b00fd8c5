"""Result tables in the studies' shapes, built from RunAnalysis values (pure; writers in analysis/export.py).

A Table is a title, column names and rows of plain values (str, int, float, None), so one object is
rendered to HTML, CSV and Parquet alike. Runs are grouped by what the plan varied:
  - the AQM configuration (RunMeta.aqm): a varied queue (kind and mode, e.g. `red-ramp`), a param called
    `aqm`, else the leaf qdisc of the bottleneck chain in the run spec (`pfifo`);
  - the arm: params.arm, else the parameters that differ between runs of the same experiment
    (`cc=reno flows=2`), else the CC;
  - the column: the experiment (LS-AIMD: 1, 2, 3A … 4H).
Cells over repetitions show the mean of the per-run values; the long-form tables keep every run.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from analysis.metrics import STAT_FIELDS, Stats, summary_stats
from analysis.runstats import RunAnalysis

MISSING = "–"
STAT_ROWS = ("min", "max", "mean", "sd", "p95", "p99")
"""LS-AIMD queue-delay table rows, in the study's order."""


@dataclass(frozen=True)
class Table:
    """name: file stem (`runs` -> runs.csv); columns and rows hold plain values, None = no data."""

    name: str
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[object, ...], ...]
    note: str = ""


# ---------------------------------------------------------------------------- grouping labels

def _companions(params: dict) -> set[str]:
    """`rate_bit` beside `rate`: numeric companions of written values; the label shows what was written."""
    return {k for k in params if "_" in k and k.rsplit("_", 1)[0] in params}


def _text(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":")) if isinstance(value, dict | list) else str(value)


def arm_labels(results: Sequence[RunAnalysis]) -> dict[str, str]:
    """run_id -> arm label: params.arm, else `key=value` of the params that vary inside its experiment
    (the AQM configuration is a separate axis and left out), else the CC."""
    by_exp: dict[tuple[str, str], list[RunAnalysis]] = defaultdict(list)
    for r in results:
        by_exp[(r.data_meta.plan_name, r.data_meta.experiment)].append(r)
    out: dict[str, str] = {}
    for runs in by_exp.values():
        keys = sorted({k for r in runs for k in r.data_meta.params} - {"arm", "queue", "aqm"})
        keys = [k for k in keys if k not in set().union(*(_companions(r.data_meta.params) for r in runs))]
        varying = [k for k in keys if len({_text(r.data_meta.params.get(k)) for r in runs}) > 1]
        for r in runs:
            p = r.data_meta.params
            if p.get("arm"):
                out[r.run_id] = str(p["arm"])
            elif varying:
                out[r.run_id] = " ".join(f"{k}={_text(p.get(k))}" for k in varying)
            else:
                out[r.run_id] = r.row.cc or MISSING
    return out


def _mean(values: Sequence[float]) -> float | None:
    v = [x for x in values if x is not None and not math.isnan(x)]
    return float(np.mean(v)) if v else None


# ---------------------------------------------------------------------------- study tables

def qdelay_tables(results: Sequence[RunAnalysis]) -> list[Table]:
    """LS-AIMD Table 5.1 shape: one table per AQM configuration; columns = experiments; rows =
    {min, max, mean, sd, p95, p99} × arm; queue delay in µs over each run's analysis window; each cell
    the mean over repetitions ('–' where the arm did not run in that experiment)."""
    arms = arm_labels(results)
    groups: dict[str, list[RunAnalysis]] = defaultdict(list)
    for r in results:
        groups[r.data_meta.aqm].append(r)
    tables = []
    for aqm, runs in groups.items():
        exps = list(dict.fromkeys(r.data_meta.experiment for r in runs))
        arm_order = list(dict.fromkeys(arms[r.run_id] for r in runs))
        cells: dict[tuple[str, str], list[Stats]] = defaultdict(list)
        for r in runs:
            cells[(arms[r.run_id], r.data_meta.experiment)].append(r.qdelay)
        rows = []
        for stat in STAT_ROWS:
            for arm in arm_order:
                rows.append((stat, arm, *(_mean([getattr(s, stat) for s in cells.get((arm, e), [])])
                                          for e in exps)))
        reps = {len(v) for v in cells.values()}
        tables.append(Table(
            name=f"qdelay_{_slug(aqm)}", title=f"Queue delay (µs), AQM {aqm}",
            columns=("stat", "arm", *exps), rows=tuple(rows),
            note=f"per-packet sojourn at the bottleneck over each run's analysis window; cells are the mean "
                 f"over {'/'.join(map(str, sorted(reps)))} repetition(s)"))
    return tables


def summary_by_arm(results: Sequence[RunAnalysis], name: str, title: str,
                   value: Callable[[RunAnalysis], list[float]], note: str) -> Table:
    """Per experiment × arm: n, mean, median, sd (population), min, max of per-run (or per-flow) values
    (Paced Chirping's utilisation and convergence tables)."""
    arms = arm_labels(results)
    groups: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in results:
        key = (r.data_meta.experiment, r.data_meta.aqm, arms[r.run_id])
        groups[key] += [v for v in value(r) if v is not None and not math.isnan(v)]
    rows = []
    for (exp, aqm, arm), vals in groups.items():
        s = summary_stats(vals)       # M-STAT: the project's one percentile method, population sd
        rows.append((exp, aqm, arm, s.n, *((s.mean, s.median, s.sd, s.min, s.max) if s.n else (None,) * 5)))
    return Table(name=name, title=title, columns=("experiment", "aqm", "arm", "n", "mean", "median", "sd", "min",
                                                    "max"), rows=tuple(rows), note=note)


def utilisation_table(results: Sequence[RunAnalysis]) -> Table:
    return summary_by_arm(
        results, "utilisation", "Link utilisation (%, wire bytes, 100 ms bins)",
        lambda r: [100 * r.utilisation.wire.mean] if r.utilisation else [],
        "per run: mean over 100 ms bins of wire bytes × 8 / (rate × Δ) in the analysis window")


def convergence_table(results: Sequence[RunAnalysis]) -> Table:
    return summary_by_arm(
        results, "convergence", "Convergence time (base RTTs; 100 ms bins when no RTT is stated)",
        lambda r: [f.convergence_rtts for f in r.flows],
        "per flow, over the whole run: from its first packet to the first bin where it is within 80-120 % of "
        "the fair share and every running flow stays there for 10 bins; censored flows are left out")


# ---------------------------------------------------------------------------- per-run and per-flow tables

def _stats_cols(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}_{f}" for f in STAT_FIELDS)


def _stats_vals(s: Stats) -> tuple[float, ...]:
    """The value fields in STAT_FIELDS order (NaN becomes None where the row is _clean-ed)."""
    return tuple(getattr(s, f) for f in STAT_FIELDS)


WINDOW_NOTE = ("every value over the run's analysis window (docs/metrics.md#analysis-window): `window` is its rule, "
               "`window_start_s` its start after T0, `window_s` its length; the runs table of `tcplab run` and "
               "`tcplab table` uses the same window")


def runs_table(results: Sequence[RunAnalysis]) -> Table:
    """One row per run: identity, window, goodput, utilisation, queue delay, fairness, drops."""
    arms = arm_labels(results)
    rows = []
    for r in results:
        meta, u = r.data_meta, r.utilisation
        rows.append((r.run_id, meta.plan_name, meta.experiment, meta.aqm, arms[r.run_id],
                     meta.repetition, r.row.cc, r.row.rate_bit, r.row.flows, r.window.rule,
                     (r.window.start_ns - r.t0_ns) / 1e9 if r.t0_ns is not None else None,
                     r.window.length_ns / 1e9, r.row.goodput_bps,
                     u.wire.mean if u else None, u.payload.mean if u else None, u.min_10ms_wire if u else None,
                     *_stats_vals(r.qdelay), r.jain, r.ratio.geometric_mean if r.ratio else None,
                     r.ratio.toggling if r.ratio else None, r.qdisc_drop_rate, r.row.drops, r.row.mean_cwnd,
                     "; ".join(r.notes)))
    cols = ("run_id", "plan", "experiment", "aqm", "arm", "repetition", "cc", "rate_bit", "flows", "window",
            "window_start_s", "window_s", "goodput_bps", "util_wire", "util_payload", "util_min_10ms",
            *_stats_cols("qdelay_us"), "jain", "rate_ratio", "toggling", "qdisc_drop_rate", "drops",
            "mean_cwnd", "notes")
    return Table("runs_detail", "Runs", cols, tuple(_clean(row) for row in rows), note=WINDOW_NOTE)


def flows_table(results: Sequence[RunAnalysis]) -> Table:
    """One row per flow: goodput, RTT (timestamps and srtt), cwnd, marks, drops, FCT, gaps, alpha."""
    rows = []
    for r in results:
        for f in r.flows:
            c = f.completion
            rows.append((r.run_id, f.flow_id, f.cc, f.src_port, f.dst_port, f.goodput_bps, *_stats_vals(f.qdelay),
                         f.rtt.n, f.rtt.median, f.rtt.p95, f.srtt.mean, f.cwnd.mean, f.cwnd.max,
                         f.signals.ce_fraction, f.signals.aqm_marked, f.signals.aqm_dropped, f.retransmissions,
                         c.fct_ns / 1e9, c.censored, f.gaps_us.median, f.gaps_us.p99,
                         f.alpha.time_weighted_mean if f.alpha else None, f.convergence_s, f.convergence_rtts,
                         f.start_skew_ns / 1e6 if f.start_skew_ns is not None else None))
    cols = ("run_id", "flow_id", "cc", "src_port", "dst_port", "goodput_bps", *_stats_cols("qdelay_us"),
            "rtt_samples", "rtt_median_us", "rtt_p95_us", "srtt_mean_us", "cwnd_mean", "cwnd_max",
            "ce_fraction", "aqm_marked", "aqm_dropped", "retransmissions", "fct_s", "fct_censored",
            "gap_median_us", "gap_p99_us", "dctcp_alpha_mean", "convergence_s", "convergence_rtts",
            "start_skew_ms")
    return Table("flows", "Flows", cols, tuple(_clean(row) for row in rows),
                 note="goodput, queue delay, RTT, srtt, cwnd, marks, drops, gaps and DCTCP alpha over each run's "
                      "analysis window (runs_detail: window); FCT and convergence over the whole run, from the "
                      "flow's first packet; start_skew_ms: the flow's first SYN minus its scheduled start "
                      "(M-STARTSKEW)")


def series_tables(results: Sequence[RunAnalysis]) -> list[Table]:
    """Long-form time series: per-flow throughput for every bin width, queue delay and cwnd per 10 ms,
    and the queue-delay CDF (quantile sketch) of each run."""
    tput, qd, cw, cdf = [], [], [], []
    for r in results:
        for width, per_flow in r.throughput.items():
            for flow, values in per_flow.items():
                tput += [(r.run_id, flow, width / 1e6, k * width / 1e9, v) for k, v in enumerate(values.tolist())]
        qd += [_clean((r.run_id, k * 0.01, v)) for k, v in enumerate(r.qdelay_series_us.tolist())]
        for flow, values in r.cwnd_series.items():
            cw += [_clean((r.run_id, flow, k * 0.01, v)) for k, v in enumerate(values.tolist())]
        n = r.qdelay_sketch_us.size
        cdf += [(r.run_id, i / (n - 1), v) for i, v in enumerate(r.qdelay_sketch_us.tolist())] if n > 1 else []
    whole = "the whole run, t_s from T0 (not cut to the analysis window)"
    return [Table("throughput_series", "Per-flow goodput", ("run_id", "flow_id", "bin_ms", "t_s", "goodput_bps"),
                  tuple(tput), note=whole),
            Table("qdelay_series", "Queue delay, mean per 10 ms", ("run_id", "t_s", "qdelay_us"), tuple(qd),
                  note=whole),
            Table("cwnd_series", "cwnd, last value per 10 ms", ("run_id", "flow_id", "t_s", "cwnd"), tuple(cw),
                  note=whole),
            Table("qdelay_cdf", "Queue delay CDF (quantile sketch)", ("run_id", "probability", "qdelay_us"),
                  tuple(cdf), note="per-packet sojourn over each run's analysis window")]


def _clean(row: tuple) -> tuple:
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in row)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_") or "none"
