"""The HTML report: the run table, per-flow throughput and backlog plots, and runs.csv beside it.

The report is one self-contained file (PNGs embedded as base64 data URIs) so it can be mailed or
archived with the results. Runs are loaded one at a time; only their summary row and binned series
are kept.
"""
from __future__ import annotations

import base64
import csv
import html
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.engine import Engine

from analysis import metrics
from analysis.load import RunData, iter_runs
from analysis.plots import RunSeries, backlog_png, throughput_png
from analysis.summary import COLUMNS, CSV_FIELDS, RunRow, csv_record, fmt_rate, summarise, table_cells

DEFAULT_BIN_NS = 100_000_000   # 100 ms: the timer-based default of M-TPUT


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
                     qdisc_label=f"{kind} {data.qdisc_handle}" if data.qdisc_handle else "")


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def render_html(rows: Sequence[RunRow], series: Sequence[RunSeries], bin_ns: int = DEFAULT_BIN_NS) -> str:
    """The report page. Pure: rows and series in, HTML text out."""
    head = "".join(f"<th>{html.escape(c.header)}</th>" for c in COLUMNS)
    body = "\n".join(
        "<tr>" + "".join(f'<td class="{"num" if c.numeric else ""}">{html.escape(v)}</td>'
                         for c, v in zip(COLUMNS, cells, strict=True)) + "</tr>"
        for cells in table_cells(rows))
    plots = ""
    if series:
        plots = (f"<h2>Per-flow goodput over time ({bin_ns / 1e6:g} ms bins)</h2>\n"
                 f"{_img(throughput_png(series), 'per-flow goodput over time')}\n"
                 f"<h2>Bottleneck backlog over time</h2>\n{_img(backlog_png(series), 'backlog over time')}")
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tcplab report</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.5em; }}
th {{ background: #f0f0f0; }} td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
img {{ max-width: 100%; }} .note {{ color: #555; font-size: 0.85em; }}
</style></head><body>
<h1>tcplab report</h1>
<p class="note">{len(rows)} run(s); generated {generated}. Goodput at the capture point downstream of the
bottleneck (bytes advancing the highest sequence number, over each flow's active span); backlog of the
bottleneck root qdisc over the data window; p99 by {metrics.PERCENTILE_METHOD} interpolation;
KB = 1000 bytes. Table as CSV: <a href="runs.csv">runs.csv</a>.</p>
<h2>Runs</h2>
<table><thead><tr>{head}</tr></thead>
<tbody>
{body}
</tbody></table>
{plots}
</body></html>
"""


def write_csv(rows: Sequence[RunRow], path: Path) -> Path:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(CSV_FIELDS))
        writer.writeheader()
        for row in rows:
            writer.writerow(csv_record(row))
    return path


def write_report(engine: Engine, out_dir: Path, run_ids: list[str] | None = None,
                 bin_ns: int = DEFAULT_BIN_NS) -> Path:
    """Write out_dir/report.html and out_dir/runs.csv for the runs (default: every complete run)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[RunRow] = []
    series: list[RunSeries] = []
    for data in iter_runs(engine, run_ids):
        row = summarise(data)
        rows.append(row)
        series.append(run_series(data, row, bin_ns))
    write_csv(rows, out_dir / "runs.csv")
    path = out_dir / "report.html"
    path.write_text(render_html(rows, series, bin_ns), encoding="utf-8")
    return path

