"""Matplotlib figures of run time series, rendered to PNG bytes with the Agg canvas.

Figures are built on `matplotlib.figure.Figure` with an explicit Agg canvas rather than pyplot, so no
global backend or figure registry is touched (safe in tests, servers and threads). Inputs are plain
typed series (RunSeries); turning a run into series is the caller's job.
"""
from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.events import EventMark
from analysis.metrics import BinnedSeries, BoxStats

MAX_COLS = 2
PANEL_SIZE_IN = (6.0, 3.2)
DPI = 100


@dataclass(frozen=True)
class RunSeries:
    """What one run contributes to the plots; times are seconds since the run's t0."""

    run_id: str
    title: str                                   # from run metadata: cc, rate, flows
    rate_bit: int | None
    throughput: dict[str, BinnedSeries] = field(default_factory=dict)   # legend label -> series
    backlog_t_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    backlog_bytes: np.ndarray = field(default_factory=lambda: np.empty(0))
    qdisc_label: str = ""
    events: tuple[EventMark, ...] = ()           # timed plan events, marked on every time plot


def _grid(n: int) -> tuple[Figure, list[Axes]]:
    ncols = max(1, min(MAX_COLS, n))
    nrows = max(1, math.ceil(n / ncols))
    fig = Figure(figsize=(PANEL_SIZE_IN[0] * ncols, PANEL_SIZE_IN[1] * nrows), dpi=DPI,
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel())
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _mark_events(ax: Axes, marks: Sequence[EventMark]) -> None:
    """A vertical line per event at its effective time, labelled at the top; a blackout's window shaded."""
    for m in marks:
        ax.axvline(m.t_s, color="tab:red", linestyle=":", linewidth=1.0)
        if m.end_s is not None:
            ax.axvspan(m.t_s, m.end_s, color="tab:red", alpha=0.12, linewidth=0)
        ax.annotate(m.label, (m.t_s, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -2),
                    textcoords="offset points", fontsize=6, color="tab:red", va="top", rotation=90)


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")


def throughput_png(runs: Sequence[RunSeries]) -> bytes:
    """One panel per run: per-flow goodput over time (one line per flow), the configured rate dashed."""
    fig, axes = _grid(len(runs))
    for ax, run in zip(axes, runs, strict=True):
        drawn = False
        for label, series in run.throughput.items():
            if series.values.size:
                # stairs: each value spans its whole half-open bin, the last bin included.
                edges = np.arange(series.values.size + 1) * (series.bin_ns / 1e9)
                ax.stairs(series.values / 1e6, edges, label=label, linewidth=1.2)
                drawn = True
        if run.rate_bit:
            ax.axhline(run.rate_bit / 1e6, color="black", linestyle="--", linewidth=0.8,
                       label="configured rate")
        if not drawn:
            _no_data(ax)
        _mark_events(ax, run.events)
        bin_ms = next((s.bin_ns / 1e6 for s in run.throughput.values()), None)
        ax.set_title(run.title, fontsize=9)
        ax.set_xlabel("time since t0 (s)")
        ax.set_ylabel(f"goodput (Mbit/s{f', {bin_ms:g} ms bins' if bin_ms else ''})")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=7, loc="lower right")
    return _png(fig)


def backlog_png(runs: Sequence[RunSeries]) -> bytes:
    """One panel per run: backlog (KB) of the bottleneck qdisc at each stats sample."""
    fig, axes = _grid(len(runs))
    for ax, run in zip(axes, runs, strict=True):
        if run.backlog_t_s.size:
            # steps-post: the sampled backlog holds until the next sample.
            ax.plot(run.backlog_t_s, run.backlog_bytes / 1e3, drawstyle="steps-post", linewidth=0.8,
                    label=run.qdisc_label or None)
            if run.qdisc_label:
                ax.legend(fontsize=7, loc="upper right")
        else:
            _no_data(ax)
        _mark_events(ax, run.events)
        ax.set_title(run.title, fontsize=9)
        ax.set_xlabel("time since t0 (s)")
        ax.set_ylabel("backlog (KB)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    return _png(fig)


# ---------------------------------------------------------------------------- generic series, CDF, boxes

@dataclass(frozen=True)
class Panel:
    """One panel of a time-series figure: title and label -> (t in s, values); NaN values are gaps."""

    title: str
    lines: dict[str, tuple[np.ndarray, np.ndarray]]
    marks: tuple[EventMark, ...] = ()


def timeseries_png(panels: Sequence[Panel], ylabel: str, steps: bool = False) -> bytes:
    """One panel per run, one line per label (queue delay, cwnd ...); steps for sampled state."""
    fig, axes = _grid(len(panels))
    for ax, panel in zip(axes, panels, strict=True):
        drawn = False
        for label, (t, v) in panel.lines.items():
            if t.size and np.isfinite(v).any():
                ax.plot(t, v, label=label, linewidth=0.9, drawstyle="steps-post" if steps else "default")
                drawn = True
        if not drawn:
            _no_data(ax)
        elif len(panel.lines) > 1:
            ax.legend(fontsize=7, loc="upper right")
        _mark_events(ax, panel.marks)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel("time since t0 (s)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    return _png(fig)


def cdf_png(curves: dict[str, np.ndarray], xlabel: str, title: str) -> bytes:
    """Empirical CDFs from quantile sketches (values at probabilities linspace(0, 1, n)), one axes."""
    fig, (ax,) = _grid(1)
    drawn = False
    for label, sketch in curves.items():
        if sketch.size > 1:
            ax.plot(sketch, np.linspace(0.0, 1.0, sketch.size), label=label, linewidth=1.0)
            drawn = True
    if not drawn:
        _no_data(ax)
    elif len(curves) <= 12:
        ax.legend(fontsize=6, loc="lower right")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("CDF")
    ax.set_ylim(0, 1)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    return _png(fig)


def box_png(boxes: dict[str, BoxStats], ylabel: str, title: str) -> bytes:
    """Tukey boxes from precomputed statistics (no fliers drawn: the samples are sketches)."""
    width = max(PANEL_SIZE_IN[0], 0.6 * len(boxes) + 1.5)
    fig = Figure(figsize=(width, PANEL_SIZE_IN[1] + 1.2), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    stats = [{"label": label, "q1": b.q1, "med": b.median, "q3": b.q3, "whislo": b.whisker_lo,
              "whishi": b.whisker_hi} for label, b in boxes.items() if b.n > 0]
    if stats:
        ax.bxp(stats, showfliers=False)
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
    else:
        _no_data(ax)
    ax.set_title(title, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)
