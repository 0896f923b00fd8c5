"""The per-run results table: one RunRow per run (goodput, backlog, drops, cwnd) and its text form.

`summarise` is pure (RunData in, RunRow out); `run_table` adds the DB reading from analysis/load.py.
The column list below is shared by the text table, the HTML report and the CSV so they never drift.
"""
from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import Engine

from analysis import metrics
from analysis.load import iter_runs
from analysis.rundata import PACKET_DTYPE, RunData


@dataclass(frozen=True)
class RunRow:
    """One run's summary. Rates in bit/s, backlog in bytes and packets, cwnd in segments; NaN (or
    None for counts) where the run has no data for a column."""

    run_id: str
    cc: str
    rate_bit: int | None
    flows: int
    goodput_bps: float                    # aggregate: Σ goodput bytes / union of active spans
    flow_goodput_bps: tuple[float, ...]   # per flow, in flow_id order
    goodput_ratio: float                  # aggregate goodput / configured rate
    backlog_mean_bytes: float
    backlog_p99_bytes: float
    backlog_mean_packets: float
    backlog_p99_packets: float
    drops: int | None
    mean_cwnd: float                      # mean of the data flows' per-flow means
    point: str | None                     # capture point goodput was read at
    qdisc_handle: str | None              # bottleneck qdisc the backlog was read from


def analysis_window(data: RunData, goodputs: list[metrics.Goodput]) -> tuple[int | None, int | None]:
    """Window for queue statistics: while data flowed at the capture point, else the flows' schedule
    from t0, else everything (idle seconds before and after the flows would dilute the mean)."""
    active = [g for g in goodputs if g.bytes > 0]
    if active:
        return min(g.first_ns for g in active), max(g.last_ns for g in active)
    t0 = data.meta.t0_ns
    if t0 is not None and data.flows:
        start = min(f.start_s for f in data.flows)
        end = max(f.start_s + f.duration_s for f in data.flows)
        return t0 + int(start * 1e9), t0 + int(end * 1e9)
    return None, None


def _run_cc(data: RunData) -> str:
    if data.meta.cc:
        return data.meta.cc
    return "/".join(sorted({f.cc for f in data.flows}))


def summarise(data: RunData) -> RunRow:
    """The run table row of one loaded run."""
    no_packets = np.empty(0, PACKET_DTYPE)
    goodputs = [metrics.flow_goodput(data.packets.get(f.flow_id, no_packets)) for f in data.flows]
    aggregate = metrics.aggregate_goodput(goodputs)
    rate = data.meta.rate_bit
    start, end = analysis_window(data, goodputs)
    backlog = metrics.backlog_stats(data.qdisc, start, end)
    cwnds = [metrics.mean_cwnd(data.probe, f.src_port, f.dst_port) for f in data.flows]
    cwnds = [c for c in cwnds if not math.isnan(c)]
    return RunRow(
        run_id=data.meta.run_id, cc=_run_cc(data), rate_bit=rate,
        flows=data.meta.flows if data.meta.flows is not None else len(data.flows),
        goodput_bps=aggregate,
        flow_goodput_bps=tuple(g.bits_per_s for g in goodputs),
        goodput_ratio=aggregate / rate if rate else math.nan,
        backlog_mean_bytes=backlog.mean_bytes, backlog_p99_bytes=backlog.p99_bytes,
        backlog_mean_packets=backlog.mean_packets, backlog_p99_packets=backlog.p99_packets,
        drops=backlog.drops if backlog.samples else None,
        mean_cwnd=float(np.mean(cwnds)) if cwnds else math.nan,
        point=data.meta.capture_point, qdisc_handle=data.qdisc_handle,
    )


def run_table(engine: Engine, run_ids: list[str] | None = None) -> list[RunRow]:
    """Rows for the given runs (in that order), or for every complete run ordered by run_id."""
    return [summarise(data) for data in iter_runs(engine, run_ids)]


# ---------------------------------------------------------------------------- presentation

def fmt_num(value: float | int | None, fmt: str) -> str:
    """A number for a text table; '–' for no data (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, fmt)


def _mbit(bps: float) -> str:
    return fmt_num(bps / 1e6, ".2f")


def fmt_rate(rate_bit: int | None) -> str:
    """A configured rate for humans: 20000000 -> '20 Mbit/s'."""
    if rate_bit is None:
        return "–"
    for scale, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if rate_bit >= scale:
            return f"{rate_bit / scale:g} {unit}"
    return f"{rate_bit} bit/s"


@dataclass(frozen=True)
class ColumnDef:
    header: str
    cell: Callable[[RunRow], str]
    numeric: bool = True


COLUMNS: tuple[ColumnDef, ...] = (
    ColumnDef("run", lambda r: r.run_id, numeric=False),
    ColumnDef("cc", lambda r: r.cc, numeric=False),
    ColumnDef("rate", lambda r: fmt_rate(r.rate_bit)),
    ColumnDef("flows", lambda r: str(r.flows)),
    ColumnDef("goodput Mbit/s", lambda r: _mbit(r.goodput_bps)),
    ColumnDef("per-flow Mbit/s", lambda r: " ".join(_mbit(g) for g in r.flow_goodput_bps) or "–"),
    ColumnDef("goodput/rate", lambda r: fmt_num(r.goodput_ratio, ".3f")),
    ColumnDef("backlog mean KB", lambda r: fmt_num(r.backlog_mean_bytes / 1e3, ".1f")),
    ColumnDef("backlog p99 KB", lambda r: fmt_num(r.backlog_p99_bytes / 1e3, ".1f")),
    ColumnDef("backlog mean pkts", lambda r: fmt_num(r.backlog_mean_packets, ".1f")),
    ColumnDef("backlog p99 pkts", lambda r: fmt_num(r.backlog_p99_packets, ".1f")),
    ColumnDef("drops", lambda r: fmt_num(r.drops, "d")),
    ColumnDef("mean cwnd", lambda r: fmt_num(r.mean_cwnd, ".1f")),
)
"""Display columns (KB = 1000 bytes; '–' = no data)."""


def table_cells(rows: Iterable[RunRow]) -> list[list[str]]:
    """Display strings per row, in COLUMNS order."""
    return [[c.cell(r) for c in COLUMNS] for r in rows]


def format_table(rows: list[RunRow], width: int = 200) -> str:
    """A plain-text (no colour codes) table of the rows, rendered with rich."""
    table = Table(title="tcplab runs")
    for c in COLUMNS:
        table.add_column(c.header, justify="right" if c.numeric else "left")
    for cells in table_cells(rows):
        table.add_row(*cells)
    return render_plain(table, width)


def render_plain(table: Table, width: int) -> str:
    """A rich table as plain text (no colour codes), so it can be piped and tested."""
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None, force_terminal=False).print(table)
    return buf.getvalue()


CSV_FIELDS = ("run_id", "cc", "rate_bit", "flows", "goodput_bps", "flow_goodput_bps", "goodput_ratio",
              "backlog_mean_bytes", "backlog_p99_bytes", "backlog_mean_packets", "backlog_p99_packets",
              "drops", "mean_cwnd", "point", "qdisc_handle")


def csv_record(row: RunRow) -> dict[str, object]:
    """A CSV row in full precision and base units; per-flow goodputs joined with ';'."""
    rec: dict[str, object] = {name: getattr(row, name) for name in CSV_FIELDS}
    rec["flow_goodput_bps"] = ";".join(repr(g) for g in row.flow_goodput_bps)
    return {k: ("" if v is None else v) for k, v in rec.items()}
