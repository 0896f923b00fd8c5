"""Interactive plots of `tcplab serve` as plotly figure specs (plain dicts, JSON-ready; pure).

The numbers are the report's: per-flow goodput per 100 ms bin (analysis/report.run_series), queue delay mean per
10 ms and tcp_probe cwnd per 10 ms (analysis/runstats.analyse), the bottleneck backlog at each qdisc sample, and
the run's timed events (analysis/events.py) as dotted red lines labelled with the action (an ack_blackout window
shaded). A trace never carries more than MAX_POINTS points (longer series are averaged per bucket), so a long run
still sends a small page. The campaign trend plot: nightly medians per cell and variant with the change points
the trend checks found (analysis/campaign_report.trend_series, change_points).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from analysis.compare import METRIC_BY_KEY
from analysis.events import EventMark
from analysis.plots import RunSeries
from analysis.runstats import SERIES_BIN_NS, RunAnalysis

MAX_POINTS = 4000
EVENT_COLOUR = "#d62728"


def decimate(t: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most max_points points: consecutive buckets averaged (NaN-aware), each at its first time."""
    n = t.size
    if n <= max_points:
        return t, y
    k = math.ceil(n / max_points)
    m = n // k * k
    yb = y[:m].astype(float).reshape(-1, k)
    with np.errstate(invalid="ignore"):
        counts = np.isfinite(yb).sum(axis=1)
        means = np.where(counts > 0, np.nansum(yb, axis=1) / np.maximum(counts, 1), np.nan)
    tt, yy = t[:m:k], means
    if m < n:
        rest = y[m:].astype(float)
        tt = np.append(tt, t[m])
        yy = np.append(yy, np.nanmean(rest) if np.isfinite(rest).any() else np.nan)
    return tt, yy


def _json_list(a: np.ndarray) -> list[Any]:
    """Floats rounded for the page, NaN as null (JSON has no NaN)."""
    a = np.asarray(a, dtype=float)
    return [round(float(v), 6) if math.isfinite(v) else None for v in a]


def line(name: str, t: np.ndarray, y: np.ndarray, steps: bool = False, **extra: Any) -> dict[str, Any]:
    t, y = decimate(np.asarray(t, dtype=float), np.asarray(y, dtype=float))
    trace = {"type": "scatter", "mode": "lines", "name": name, "x": _json_list(t), "y": _json_list(y)}
    if steps:
        trace["line"] = {"shape": "hv"}
    return trace | extra


def event_layout(events: Sequence[EventMark]) -> dict[str, list[dict[str, Any]]]:
    """Shapes and annotations marking the run's events on a time plot (x in seconds since t0)."""
    shapes, notes = [], []
    for e in events:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": e.t_s, "x1": e.t_s, "y0": 0, "y1": 1,
                       "line": {"color": EVENT_COLOUR, "dash": "dot", "width": 1.5}})
        if e.end_s is not None:
            shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": e.t_s, "x1": e.end_s, "y0": 0,
                           "y1": 1, "fillcolor": EVENT_COLOUR, "opacity": 0.12, "line": {"width": 0}})
        notes.append({"x": e.t_s, "y": 1, "xref": "x", "yref": "paper", "text": e.label, "showarrow": False,
                      "xanchor": "left", "yanchor": "bottom", "font": {"color": EVENT_COLOUR, "size": 11}})
    return {"shapes": shapes, "annotations": notes}


def _layout(title: str, ytitle: str, events: Sequence[EventMark] = (), xtitle: str = "time since t0 (s)",
            **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title, "font": {"size": 14}}, "height": 340,
            "margin": {"l": 60, "r": 20, "t": 60, "b": 45},
            "xaxis": {"title": {"text": xtitle}, "zeroline": False},
            "yaxis": {"title": {"text": ytitle}, "rangemode": "tozero"},
            "legend": {"orientation": "h", "y": -0.25}, "hovermode": "x unified",
            **event_layout(events), **extra}


def run_figures(result: RunAnalysis, series: RunSeries) -> dict[str, dict[str, Any]]:
    """figure id -> plotly spec: throughput, queue delay, cwnd, backlog of one analysed run."""
    events = series.events
    step = SERIES_BIN_NS / 1e9
    tput = []
    bin_ms = None
    for label, s in series.throughput.items():
        if s.values.size:
            bin_ms = s.bin_ns / 1e6
            # each bin's value over its whole half-open bin: step plot through the bin starts and the last end
            t = np.arange(s.values.size + 1) * (s.bin_ns / 1e9)
            tput.append(line(label, t, np.append(s.values, s.values[-1]) / 1e6, steps=True))
    if series.rate_bit and tput:
        end = max(x for tr in tput for x in tr["x"] if x is not None)
        tput.append({"type": "scatter", "mode": "lines", "name": "configured rate", "x": [0, end],
                     "y": [series.rate_bit / 1e6] * 2, "line": {"dash": "dash", "color": "black", "width": 1}})
    qd = result.qdelay_series_us
    qdelay = [line("queue delay (mean per 10 ms)", np.arange(qd.size) * step, qd / 1e3)] if qd.size else []
    cwnd = [line(f"flow {k}", np.arange(v.size) * step, v, steps=True) for k, v in result.cwnd_series.items()
            if v.size]
    backlog = ([line(f"backlog {series.qdisc_label}".strip(), series.backlog_t_s, series.backlog_bytes / 1e3)]
               if series.backlog_t_s.size else [])
    unit = f", {bin_ms:g} ms bins" if bin_ms else ""
    return {
        "throughput": {"data": tput, "layout": _layout("Per-flow goodput", f"goodput (Mbit/s{unit})", events)},
        "qdelay": {"data": qdelay, "layout": _layout("Queue delay (per-packet sojourn)", "queue delay (ms)",
                                                     events)},
        "cwnd": {"data": cwnd, "layout": _layout("cwnd (tcp_probe, last value per 10 ms)", "cwnd (segments)",
                                                 events)},
        "backlog": {"data": backlog, "layout": _layout("Bottleneck backlog", "backlog (KB)", events)},
    }


def trend_figure(metric: str, series: dict[tuple[str, str], dict[int, float]], numbers: dict[int, int],
                 change_points: dict[tuple[str, str], list[int]]) -> dict[str, Any]:
    """One line per (cell, variant): nightly medians over night numbers; change points as dotted lines."""
    data, shapes = [], []
    for (label, variant), per in sorted(series.items()):
        ids = sorted(per, key=lambda i: numbers.get(i, i))
        data.append({"type": "scatter", "mode": "lines+markers", "name": f"{variant}: {label}"[:90],
                     "x": [numbers.get(i, i) for i in ids], "y": _json_list(np.array([per[i] for i in ids]))})
        for cp in change_points.get((label, variant), []):
            if cp in numbers:
                shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": numbers[cp] - 0.5,
                               "x1": numbers[cp] - 0.5, "y0": 0, "y1": 1,
                               "line": {"color": EVENT_COLOUR, "dash": "dot", "width": 1.5}})
    m = METRIC_BY_KEY.get(metric)
    ytitle = f"{m.name} ({m.unit})" if m and m.unit else (m.name if m else metric)
    title = f"{metric}: nightly median per cell and variant" + (f" ({m.better} is better)" if m and m.better else "")
    layout = _layout(title, ytitle, xtitle="night", shapes=shapes, annotations=[])
    layout["xaxis"]["dtick"] = 1
    layout["yaxis"].pop("rangemode")
    layout["hovermode"] = "closest"
    return {"data": data, "layout": layout}
