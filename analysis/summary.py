"""The per-run results table: one RunRow per run (goodput, backlog, drops, cwnd) and its text form.

`summarise` is pure (RunData in, RunRow out); `run_table` adds the DB reading from analysis/load.py. Every
column is computed over the run's analysis window (`run_window`, the one window rule), and every table says so.
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
    """One run's summary over its analysis window (`window`). Rates in bit/s, backlog in bytes and packets,
    cwnd in segments; NaN (or None for counts) where the run has no data for a column."""

    run_id: str
    cc: str
    rate_bit: int | None
    flows: int
    goodput_bps: float                    # aggregate: Σ goodput bytes in the window / window length
    flow_goodput_bps: tuple[float, ...]   # per flow, in flow_id order, over the same window
    goodput_ratio: float                  # aggregate goodput / configured rate
    backlog_mean_bytes: float
    backlog_p99_bytes: float
    backlog_mean_packets: float
    backlog_p99_packets: float
    drops: int | None
    mean_cwnd: float                      # mean of the data flows' per-flow means in the window
    point: str | None                     # capture point goodput was read at
    qdisc_handle: str | None              # bottleneck qdisc the backlog was read from
    window: metrics.Window                # the run's analysis window (its rule is printed with every table)
    t0_ns: int                            # the run's T0 (its first packet when T0 is unknown)
    start_skew_ns: tuple[int | None, ...] = ()   # M-STARTSKEW per flow, in flow_id order (None: not measured)


def flow_spans(data: RunData) -> dict[int, tuple[int, int]]:
    """Each flow's first and last packet at the bottleneck capture: what the window rule is applied to."""
    return {f.flow_id: (int(p["ts_ns"].min()), int(p["ts_ns"].max()))
            for f in data.flows if (p := data.packets.get(f.flow_id)) is not None and p.size}


def run_window(data: RunData) -> tuple[metrics.Window, int]:
    """The run's analysis window and T0: the one rule (analysis/metrics/windows.py) with the run's settings
    (warm-up, measure length, all-flows-active or whole run), over the flows' spans at the bottleneck capture.
    The runs table, every metric of the report and the CPU guard use this rule."""
    spans = flow_spans(data)
    t0 = data.meta.t0_ns if data.meta.t0_ns is not None else min((s[0] for s in spans.values()), default=0)
    a = data.meta.analysis
    return metrics.analysis_window(list(spans.values()), t0, a.warmup_s, a.measure_s, a.window), t0


def _run_cc(data: RunData) -> str:
    if data.meta.cc:
        return data.meta.cc
    return "/".join(sorted({f.cc for f in data.flows}))


def goodput_advances(data: RunData) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """flow_id -> (ts, bytes advancing the highest sequence) of its packets at the bottleneck capture: the
    per-packet work (filter, sort, unwrap) done once per flow, for the runs table and the report alike."""
    no_packets = np.empty(0, PACKET_DTYPE)
    return {f.flow_id: metrics.goodput_advance(data.packets.get(f.flow_id, no_packets)) for f in data.flows}


def summarise(data: RunData, advances: dict[int, tuple[np.ndarray, np.ndarray]] | None = None) -> RunRow:
    """The run table row of one loaded run, every column over the run's analysis window. `advances`:
    goodput_advances(data) when the caller has them already."""
    advances = advances if advances is not None else goodput_advances(data)
    window, t0 = run_window(data)
    w0, w1 = window.start_ns, window.end_ns
    per_flow = []
    for f in data.flows:
        ts, adv = advances[f.flow_id]
        per_flow.append(int(adv[metrics.in_window(ts, w0, w1)].sum()))
    length = window.length_ns
    rate = data.meta.rate_bit
    aggregate = sum(per_flow) * 8e9 / length if length else math.nan
    backlog = metrics.backlog_stats(data.qdisc, w0, w1)   # an empty window selects no sample: NaN
    probe = data.probe[metrics.in_window(data.probe["ts_ns"], w0, w1)]
    cwnds = [metrics.mean_cwnd(probe, f.src_port, f.dst_port) for f in data.flows]
    cwnds = [c for c in cwnds if not math.isnan(c)]
    return RunRow(
        run_id=data.meta.run_id, cc=_run_cc(data), rate_bit=rate,
        flows=data.meta.flows if data.meta.flows is not None else len(data.flows),
        goodput_bps=aggregate,
        flow_goodput_bps=tuple(b * 8e9 / length if length else math.nan for b in per_flow),
        goodput_ratio=aggregate / rate if rate else math.nan,
        backlog_mean_bytes=backlog.mean_bytes, backlog_p99_bytes=backlog.p99_bytes,
        backlog_mean_packets=backlog.mean_packets, backlog_p99_packets=backlog.p99_packets,
        drops=backlog.drops if backlog.samples else None,
        mean_cwnd=float(np.mean(cwnds)) if cwnds else math.nan,
        point=data.meta.capture_point, qdisc_handle=data.qdisc_handle, window=window, t0_ns=t0,
        start_skew_ns=tuple(f.start_skew_ns for f in data.flows),
    )


def run_table(engine: Engine, run_ids: list[str] | None = None) -> list[RunRow]:
    """Rows for the given runs (in that order), or for every complete run ordered by run_id; timing runs
    (G-PROBE) have no row: no performance number comes from a run that traced its kernel."""
    from analysis.kernel_cost import is_timing_run

    return [summarise(data) for data in iter_runs(engine, run_ids) if not is_timing_run(data.meta.flags)]


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
    ColumnDef("start skew ms", lambda r: " ".join(fmt_num(s / 1e6 if s is not None else None, ".1f")
                                                   for s in r.start_skew_ns) or "–"),
)
"""Display columns (KB = 1000 bytes; '–' = no data)."""


def table_cells(rows: Iterable[RunRow]) -> list[list[str]]:
    """Display strings per row, in COLUMNS order."""
    return [[c.cell(r) for c in COLUMNS] for r in rows]


def window_rules(rows: Iterable[RunRow]) -> str:
    """The distinct window rules of the rows, e.g. 'all_flows_active, warm-up 2 s'."""
    return "; ".join(sorted({r.window.rule for r in rows}))


def window_caption(rows: Iterable[RunRow]) -> str:
    """Which window the columns of a runs table use."""
    rules = window_rules(rows)
    return (f"goodput, backlog, drops and cwnd over each run's analysis window (docs/metrics.md#analysis-window): "
            f"{rules}") if rules else ""


def format_table(rows: list[RunRow], width: int = 200) -> str:
    """A plain-text (no colour codes) table of the rows, rendered with rich, captioned with its window."""
    table = Table(title="tcplab runs", caption=window_caption(rows) or None)
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
              "drops", "mean_cwnd", "point", "qdisc_handle", "window", "window_start_s", "window_s")


def csv_record(row: RunRow) -> dict[str, object]:
    """A CSV row in full precision and base units; per-flow goodputs joined with ';'; the window's rule, its
    start (s after T0) and length (s)."""
    rec: dict[str, object] = {name: getattr(row, name) for name in CSV_FIELDS[:-3]}
    rec["flow_goodput_bps"] = ";".join(repr(g) for g in row.flow_goodput_bps)
    rec.update(window=row.window.rule, window_start_s=(row.window.start_ns - row.t0_ns) / 1e9,
               window_s=row.window.length_ns / 1e9)
    return {k: ("" if v is None else v) for k, v in rec.items()}
