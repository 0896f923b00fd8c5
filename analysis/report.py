"""The HTML report and its CSV/Parquet tables for a selection of runs (effects at the edge).

`build_report` is pure (analysed runs in, page text and tables out); `write_report` loads runs one at a
time from the DB (analysis/load.py), analyses each (analysis/runstats.py), keeps only summaries and
downsampled series, and writes out_dir/report.html (self-contained: PNGs embedded as data URIs),
out_dir/runs.csv (the run table) and out_dir/tables/<name>.csv (+ .parquet when pyarrow is installed).
What every table and plot means: docs/reports.md.
"""
from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from sqlalchemy.engine import Engine

from analysis import metrics
from analysis.events import event_marks
from analysis.export import parquet_available, write_tables
from analysis.kernel_cost import cost_table, is_timing_run, load_costs
from analysis.load import iter_runs
from analysis.plots import Panel, RunSeries, backlog_png, box_png, cdf_png, throughput_png, timeseries_png
from analysis.rundata import RunData
from analysis.runstats import SERIES_BIN_NS, RunAnalysis, analyse
from analysis.summary import COLUMNS, CSV_FIELDS, RunRow, csv_record, fmt_rate, table_cells, window_rules
from analysis.tables import (
    Table,
    arm_labels,
    convergence_table,
    flows_table,
    qdelay_tables,
    runs_table,
    series_tables,
    utilisation_table,
)
from analysis.thinstream import ThinStreamStats, latency_curves, run_thin_streams, thin_stream_table

DEFAULT_BIN_NS = 100_000_000   # 100 ms: the timer-based default of M-TPUT
MAX_RUN_PANELS = 24
"""Per-run figures draw at most this many runs (one panel each); the CSVs hold every run."""
TABLES_DIR = "tables"


def run_title(row: RunRow) -> str:
    """A panel title from run metadata, e.g. 'q-reno-20 — reno, 20 Mbit/s, 1 flow'."""
    flows = f"{row.flows} flow{'s' if row.flows != 1 else ''}"
    return f"{row.run_id} — {row.cc or '?'}, {fmt_rate(row.rate_bit)}, {flows}"


def series_t0(data: RunData) -> int | None:
    """The run's t0 (manager start command), else its earliest packet or qdisc sample."""
    if data.meta.t0_ns is not None:
        return data.meta.t0_ns
    firsts = [int(p["ts_ns"].min()) for p in data.packets.values() if p.size]
    if data.qdisc.size:
        firsts.append(int(data.qdisc["ts_ns"].min()))
    return min(firsts) if firsts else None


def run_series(data: RunData, row: RunRow, bin_ns: int = DEFAULT_BIN_NS) -> RunSeries:
    """Binned per-flow goodput and the backlog series of one loaded run, times relative to t0.

    All flows of a run share the same bins (up to the last data packet of any flow), so the lines
    line up; packets before t0 fall outside the bins and are not drawn.
    """
    t0 = series_t0(data)
    title = run_title(row)
    if t0 is None:
        return RunSeries(run_id=row.run_id, title=title, rate_bit=row.rate_bit)
    lasts = [int(p["ts_ns"].max()) for p in data.packets.values() if p.size]
    n_bins = max(0, (max(lasts) - t0) // bin_ns + 1) if lasts else 0
    throughput = {}
    for f in data.flows:
        pkts = data.packets.get(f.flow_id)
        if pkts is not None and pkts.size:
            throughput[f"flow {f.flow_id} ({f.cc})"] = metrics.throughput_series(pkts, t0, bin_ns, n_bins)
    q = data.qdisc
    kind = str(q["kind"][0]) if q.size else ""
    return RunSeries(run_id=row.run_id, title=title, rate_bit=row.rate_bit, throughput=throughput,
                     backlog_t_s=(q["ts_ns"] - t0) / 1e9, backlog_bytes=q["backlog_bytes"].astype(float),
                     qdisc_label=f"{kind} {data.qdisc_handle}" if data.qdisc_handle else "",
                     events=event_marks(data.events, t0))


# ---------------------------------------------------------------------------- HTML pieces

def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def fmt_cell(value: object) -> str:
    """A table value for people: '–' for no data, floats to a precision that suits their size."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        mag = abs(value)
        return f"{value:.0f}" if mag >= 100 else f"{value:.2f}" if mag >= 1 else f"{value:.4f}"
    return str(value)


def table_html(t: Table, link: str | None = None) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "\n".join("<tr>" + "".join(
        f'<td class="{"num" if isinstance(v, int | float) and not isinstance(v, bool) else ""}">'
        f"{html.escape(fmt_cell(v))}</td>" for v in row) + "</tr>" for row in t.rows)
    note = f'<p class="note">{html.escape(t.note)}' if t.note else '<p class="note">'
    note += f' <a href="{html.escape(link)}">{html.escape(link)}</a></p>' if link else "</p>"
    return (f'<h3>{html.escape(t.title)}</h3>\n{note}\n<table class="{t.name}"><thead><tr>{head}</tr></thead>'
            f"<tbody>\n{body}\n</tbody></table>")


def _compact(t: Table, keep: Sequence[str]) -> Table:
    """The same table with only some columns (the HTML shows fewer than the CSV holds)."""
    idx = [t.columns.index(c) for c in keep]
    return Table(t.name, t.title, tuple(keep), tuple(tuple(r[i] for i in idx) for r in t.rows), t.note)


@dataclass(frozen=True)
class Figure:
    heading: str
    png: bytes
    alt: str


def figures(results: Sequence[RunAnalysis], series: Sequence[RunSeries], bin_ns: int) -> list[Figure]:
    """Every plot of the report, in page order."""
    shown = list(series[:MAX_RUN_PANELS])
    shown_results = list(results[:MAX_RUN_PANELS])
    if not shown:
        return []
    out = [Figure(f"Per-flow goodput over time ({bin_ns / 1e6:g} ms bins)", throughput_png(shown),
                  "per-flow goodput over time"),
           Figure("Bottleneck backlog over time", backlog_png(shown), "backlog over time")]
    step = SERIES_BIN_NS / 1e9
    marks = {s.run_id: s.events for s in shown}
    qd_panels = [Panel(run_title(r.row), {"queue delay": (np.arange(r.qdelay_series_us.size) * step,
                                                          r.qdelay_series_us / 1e3)}, marks.get(r.run_id, ()))
                 for r in shown_results]
    out.append(Figure("Queue delay over time (mean per 10 ms, per-packet sojourn)",
                      timeseries_png(qd_panels, "queue delay (ms)"), "queue delay over time"))
    cw_panels = [Panel(run_title(r.row), {f"flow {k}": (np.arange(v.size) * step, v)
                                          for k, v in r.cwnd_series.items()}, marks.get(r.run_id, ()))
                 for r in shown_results]
    out.append(Figure("cwnd over time (tcp_probe, last value per 10 ms)",
                      timeseries_png(cw_panels, "cwnd (segments)", steps=True), "cwnd over time"))
    out.append(Figure("Queue delay CDF (analysis window)",
                      cdf_png({r.run_id: r.qdelay_sketch_us / 1e3 for r in results}, "queue delay (ms)",
                              "per-packet queue delay"), "queue delay CDF"))
    arms = arm_labels(results)
    several_aqms = len({r.data_meta.aqm for r in results}) > 1
    pooled: dict[str, list[np.ndarray]] = {}
    for r in results:
        m = r.data_meta
        label = f"{m.experiment} {arms[r.run_id]}" + (f" {m.aqm}" if several_aqms else "")
        pooled.setdefault(label, []).append(r.qdelay_sketch_us / 1e3)
    boxes = {k: metrics.box_stats(np.concatenate(v)) for k, v in pooled.items()}
    out.append(Figure("Queue delay across the matrix (experiment × arm, repetitions pooled)",
                      box_png(boxes, "queue delay (ms)", "queue delay per experiment and arm"),
                      "queue delay box plot"))
    return out


def timing_section(kernel_cost: Table | None, timing_runs: Sequence[str]) -> str:
    """The timing runs (G-PROBE): left out of every performance table; their kernel cost table (M-KCOST)."""
    if not timing_runs:
        return ""
    listed = ", ".join(html.escape(r) for r in timing_runs)
    note = (f'<p class="note">{len(timing_runs)} timing run(s) (G-PROBE: they traced the kernel, which slows what '
            f"it times) are left out of every performance table and plot: {listed}.</p>")
    return f"<h2>Timing runs</h2>\n{note}\n" + (table_html(kernel_cost, f"{TABLES_DIR}/{kernel_cost.name}.csv")
                                               if kernel_cost is not None else "")


def build_report(results: Sequence[RunAnalysis], series: Sequence[RunSeries], title: str = "tcplab report",
                 bin_ns: int = DEFAULT_BIN_NS, generated: str | None = None, kernel_cost: Table | None = None,
                 timing_runs: Sequence[str] = (), thin: Sequence[ThinStreamStats] = ()) -> tuple[str, list[Table]]:
    """(page HTML, tables to write). Pure apart from the clock when `generated` is not given. `timing_runs`
    (G-PROBE) are not in `results`; `kernel_cost` is their cost table; `thin`: the app-limited flows."""
    rows = [r.row for r in results]
    head = "".join(f"<th>{html.escape(c.header)}</th>" for c in COLUMNS)
    body = "\n".join(
        "<tr>" + "".join(f'<td class="{"num" if c.numeric else ""}">{html.escape(v)}</td>'
                         for c, v in zip(COLUMNS, cells, strict=True)) + "</tr>"
        for cells in table_cells(rows))
    study = [*qdelay_tables(results), utilisation_table(results), convergence_table(results)]
    detail, flows = runs_table(results), flows_table(results)
    tables = [*study, detail, flows, *series_tables(results)] + ([kernel_cost] if kernel_cost is not None else [])
    if thin:   # app-limited flows (M-APPLAT ...): their table among the result tables, their latency CDF
        study.append(thin_stream_table(thin))
        tables.append(study[-1])

    def link(t: Table) -> str:
        return f"{TABLES_DIR}/{t.name}.csv"

    sections = "\n".join(table_html(t, link(t)) for t in study)
    sections += "\n" + table_html(_compact(detail, ("run_id", "window", "window_s", "util_wire", "util_payload",
                                                    "qdelay_us_mean", "qdelay_us_p99", "jain", "qdisc_drop_rate",
                                                    "notes")), link(detail))
    sections += "\n" + table_html(_compact(flows, ("run_id", "flow_id", "cc", "goodput_bps", "qdelay_us_mean",
                                                   "rtt_median_us", "srtt_mean_us", "cwnd_mean", "ce_fraction",
                                                   "aqm_dropped", "retransmissions", "fct_s", "gap_median_us",
                                                   "dctcp_alpha_mean", "convergence_s")), link(flows))
    figs = figures(results, series, bin_ns)
    if thin:
        figs.append(Figure("Application-layer latency CDF (app-limited flows, every write)",
                           cdf_png(latency_curves(thin, arm_labels(results)), "write → first arrival (ms)",
                                   "application-layer latency (M-APPLAT)"), "application-layer latency CDF"))
    plots = "\n".join(f"<h2>{html.escape(f.heading)}</h2>\n{_img(f.png, f.alt)}" for f in figs)
    if len(results) > MAX_RUN_PANELS:
        plots = (f'<p class="note">Per-run figures show the first {MAX_RUN_PANELS} of {len(results)} runs; '
                 f"the CSV tables hold every run.</p>\n") + plots
    generated = generated or datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    formats = "CSV and Parquet" if parquet_available() else "CSV (Parquet needs pyarrow)"
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 0.85em; margin-bottom: 1em; }}
th, td {{ border: 1px solid #ccc; padding: 0.2em 0.45em; }}
th {{ background: #f0f0f0; }} td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
img {{ max-width: 100%; }} .note {{ color: #555; font-size: 0.85em; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="note">{len(rows)} run(s); generated {generated}. Goodput at the capture point downstream of the
bottleneck (bytes advancing the highest sequence number); backlog of the bottleneck root qdisc; queue delay =
per-packet sojourn from paired aqm captures; every column below over each run's analysis window:
{html.escape(window_rules(rows) or "no runs")} (the rule, start and length of each run's
window are in the Runs result table); time plots show the whole run. Percentiles by
{metrics.PERCENTILE_METHOD} interpolation; KB = 1000 bytes.
Tables as {formats} in <a href="{TABLES_DIR}/">{TABLES_DIR}/</a>; run table: <a href="runs.csv">runs.csv</a>.</p>
<h2>Runs</h2>
<table class="runs"><thead><tr>{head}</tr></thead>
<tbody>
{body}
</tbody></table>
<h2>Result tables</h2>
{sections}
{timing_section(kernel_cost, timing_runs)}
{plots}
</body></html>
"""
    return page, tables


# ---------------------------------------------------------------------------- effects

def write_runs_csv(rows: Sequence[RunRow], path: Path) -> Path:
    import csv

    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(CSV_FIELDS))
        writer.writeheader()
        for row in rows:
            writer.writerow(csv_record(row))
    return path


def write_report(engine: Engine, out_dir: Path, run_ids: list[str] | None = None,
                 bin_ns: int = DEFAULT_BIN_NS, title: str = "tcplab report") -> Path:
    """Write out_dir/report.html, out_dir/runs.csv and out_dir/tables/ for the runs (default: every
    complete run)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results: list[RunAnalysis] = []
    series: list[RunSeries] = []
    timing: list[str] = []
    thin: list[ThinStreamStats] = []
    for data in iter_runs(engine, run_ids, detail=True):
        if is_timing_run(data.meta.flags):   # G-PROBE: no performance number from a run that traced the kernel
            timing.append(data.meta.run_id)
            continue
        result = analyse(data)
        results.append(result)
        series.append(run_series(data, result.row, bin_ns))
        thin += run_thin_streams(engine, result.run_id, data.meta.spec)
    costs = load_costs(engine, timing)
    page, tables = build_report(results, series, title, bin_ns, kernel_cost=cost_table(costs) if timing else None,
                                timing_runs=timing, thin=thin)
    write_runs_csv([r.row for r in results], out_dir / "runs.csv")
    write_tables(tables, out_dir / TABLES_DIR)
    path = out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
