"""Every metric of one run, over its analysis window: RunData in, RunAnalysis out (pure).

This is where the metric functions of analysis/metrics are applied to a loaded run: which window
(the run spec's `analysis` block: warm-up, all-flows-active or whole run, measure length), which bins
(10 ms, 100 ms, one base RTT when the plan states one) and which packets (bottleneck capture for
throughput and marks, sender-side capture for RTT/FCT/gaps, qdelay rows for queue delay). Missing
inputs become NaN plus a note, never an exception, so one odd run does not sink a campaign report.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from analysis import metrics as m
from analysis.rundata import PACKET_DTYPE, RunData
from analysis.summary import RunRow, flow_spans, goodput_advances, summarise

MS = 1_000_000
TEN_MS, HUNDRED_MS = 10 * MS, 100 * MS
MIN_RTT_BIN_NS = MS
"""Per-RTT bins below 1 ms are not written (the netns lab's ~50 µs path would make millions of bins)."""
SERIES_BIN_NS = TEN_MS
"""Queue delay and cwnd time series for plots and CSV: one value per 10 ms."""


def _reductions(probe: np.ndarray) -> m.Reductions:
    """M-CWNDCOLLAPSE over one flow's tcp_probe events (in time order)."""
    series = m.cwnd_series(probe)
    return m.reduction_episodes(series.ssthresh, series.cwnd)


@dataclass(frozen=True)
class FlowResult:
    """One flow's metrics in the run's window. Rates bit/s, delays µs, cwnd segments."""

    flow_id: int
    cc: str
    src_port: int | None
    dst_port: int
    goodput_bps: float                   # goodput bytes advanced in the window / window length
    qdelay: m.Stats                      # µs, this flow's packets at the queue
    rtt: m.Stats                         # µs, M-RTT (a) TCP timestamps at the sender-side capture
    srtt: m.Stats                        # µs, M-RTT (d) kernel srtt from tcp_probe
    cwnd: m.Stats                        # segments, tcp_probe
    signals: m.SignalRates
    completion: m.Completion
    gaps_us: m.Stats
    retransmissions: int
    alpha: m.AlphaSummary | None         # None: no ss samples with a DCTCP alpha
    convergence_s: float                 # NaN: not reached (censored) or not computable
    convergence_rtts: float
    start_skew_ns: int | None = None     # M-STARTSKEW (None: no capture saw the flow's data)
    reductions: m.Reductions = m.Reductions(0, 0, math.nan)   # M-CWNDCOLLAPSE, tcp_probe in the window


@dataclass(frozen=True)
class RunAnalysis:
    """A run's table row, window metrics, per-flow results and the series plots and CSVs are made of."""

    data_meta: object                    # analysis.runmeta.RunMeta (kept for labels and params)
    row: RunRow
    window: m.Window
    t0_ns: int | None
    base_rtt_s: float | None
    qdelay: m.Stats                      # µs, every flow's packets entering the queue in the window
    qdelay_sketch_us: np.ndarray         # quantile sketch (CDF, pooled box plots)
    utilisation: m.Utilisation | None    # None without a configured rate
    qdisc_drop_rate: float
    jain: float                          # mean over bins with ≥ 2 flows running
    ratio: m.RateRatio | None            # two-flow runs only
    flows: list[FlowResult]
    throughput: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)   # bin_ns -> flow -> bit/s
    qdelay_series_us: np.ndarray = field(default_factory=lambda: np.empty(0))   # mean per 10 ms bin
    cwnd_series: dict[int, np.ndarray] = field(default_factory=dict)            # flow -> last cwnd per 10 ms
    backlog_t_s: np.ndarray = field(default_factory=lambda: np.empty(0))
    backlog_bytes: np.ndarray = field(default_factory=lambda: np.empty(0))
    notes: tuple[str, ...] = ()

    @property
    def run_id(self) -> str:
        return self.row.run_id


def rtt_bin_ns(rtt: float | None) -> int | None:
    """One base RTT (s) in ns when the plan states one of at least MIN_RTT_BIN_NS, else None."""
    return int(round(rtt * 1e9)) if rtt is not None and rtt * 1e9 >= MIN_RTT_BIN_NS else None


def _bins(data: RunData, t0: int, end_ns: int) -> dict[int, int]:
    """Bin width -> bin count from t0 to the last packet: 10 ms, 100 ms, one base RTT (≥ 1 ms), and the
    plan's own analysis bin."""
    widths = {TEN_MS, HUNDRED_MS}
    rtt_bin = rtt_bin_ns(data.meta.base_rtt_s)
    if rtt_bin is not None:
        widths.add(rtt_bin)
    plan_bin = data.meta.analysis.bin_s
    if plan_bin:
        widths.add(int(round(plan_bin * 1e9)))
    return {w: max(0, (end_ns - t0) // w + 1) for w in sorted(widths)}


def _convergence(tput: np.ndarray, running: np.ndarray, i: int, first_ns: int, t0: int, bin_ns: int,
                 rate: float, rtt_s: float) -> tuple[float, float]:
    start_bin = max(0, -(-(first_ns - t0) // bin_ns))            # first whole bin after the flow starts
    k = m.convergence_bin(tput, running, i, start_bin, rate)
    if k is None:
        return math.nan, math.nan
    secs = (t0 + k * bin_ns - first_ns) / 1e9
    return secs, secs / rtt_s


def analyse(data: RunData) -> RunAnalysis:
    """All metrics of one loaded run (load_run(..., detail=True) for RTT, FCT, gaps, queue delay, ss)."""
    meta = data.meta
    advance = goodput_advances(data)     # per-packet work once, shared with the runs table row
    row = summarise(data, advance)
    notes: list[str] = [f"run flag: {f}" for f in meta.flags]   # a flagged run's numbers are suspect: say so
    pk = {f.flow_id: data.packets.get(f.flow_id, np.empty(0, PACKET_DTYPE)) for f in data.flows}
    spans = flow_spans(data)
    window, t0 = row.window, row.t0_ns        # the one window: the runs table's, the report's
    if not spans:
        notes.append("no data packets at the bottleneck capture")
    if window.empty and spans:
        notes.append(f"empty analysis window ({window.rule}): window metrics are NaN")
    w0, w1 = window.start_ns, window.end_ns
    rate = meta.rate_bit
    rtt_s = meta.base_rtt_s
    end_ns = max((s[1] for s in spans.values()), default=t0)
    bins = _bins(data, t0, end_ns)
    # each flow's goodput advance (computed once above), binned at every width: the values of
    # m.throughput_series(p, t0, w, n) without redoing the per-packet work per width
    throughput = {w: {i: m.bin_sum(ts, adv, t0, w, n) * 8e9 / w for i, (ts, adv) in advance.items()}
                  for w, n in bins.items()}

    # fairness and convergence on one-RTT bins when the plan states the RTT, else 100 ms bins
    rtt_bin = rtt_bin_ns(rtt_s)
    conv_bin = rtt_bin or HUNDRED_MS
    if rtt_bin is None and len(spans) > 1:
        notes.append("no base RTT >= 1 ms stated: Jain's index and convergence use 100 ms bins")
    ids = [f.flow_id for f in data.flows]
    tput = np.array([throughput[conv_bin].get(i, np.zeros(bins[conv_bin])) for i in ids]) \
        if ids else np.zeros((0, 0))
    running = m.running_matrix([spans.get(i) for i in ids], t0, conv_bin, bins[conv_bin])
    in_win = m.running_matrix([(w0, w1)] * len(ids), t0, conv_bin, bins[conv_bin])
    jain_bins = m.jain_series(tput, running & in_win)
    jain = float(np.nanmean(jain_bins)) if np.isfinite(jain_bins).any() else math.nan
    ratio = None
    if len(ids) == 2 and all(i in spans for i in ids):
        early, late = sorted(ids, key=lambda i: spans[i][0])
        both = running[0] & running[1] & in_win[0]
        ratio = m.rate_ratio(tput[ids.index(late), both], tput[ids.index(early), both])

    qd = data.qdelay
    if qd.size == 0:
        notes.append("no queue-delay rows (qdelay table): no paired aqm captures for this run")
    if data.probe.size == 0:
        notes.append("no tcp_probe events")
    if data.ss_note:
        notes.append(data.ss_note)
    probe_in_w = m.in_window(data.probe["ts_ns"], w0, w1)
    flows = []
    for idx, f in enumerate(data.flows):
        p = pk[f.flow_id]
        ts, adv = advance[f.flow_id]
        in_w = m.in_window(ts, w0, w1)
        goodput = float(adv[in_w].sum()) * 8e9 / window.length_ns if window.length_ns else math.nan
        own_q = qd[(qd["dst_port"] == f.dst_port) & ((qd["src_port"] == f.src_port) if f.src_port else True)]
        data_side, ack_side = data.sender_side.get(f.flow_id, (None, None))
        if data_side is not None:
            ack_ts, rtt = m.rtt_from_timestamps(data_side, ack_side)
            rtt_stats = m.summary_stats(rtt[m.in_window(ack_ts, w0, w1)] / 1e3)
            completion = m.flow_completion(data_side, ack_side, from_first_data=f.tool == "bulk")
            gaps = m.inter_packet_gaps(data_side[m.in_window(data_side["ts_ns"], w0, w1)])
            gap_stats, retx = m.summary_stats(gaps.gaps_ns / 1e3), gaps.retransmissions
        else:
            rtt_stats = gap_stats = m.summary_stats([])
            completion, retx = m.Completion(None, None, math.nan, True, 0), 0
        pm = m.probe_mask(data.probe, f.src_port, f.dst_port) & probe_in_w
        alpha = None
        if data.ss.size:
            s = data.ss[(data.ss["dport"] == f.dst_port) & ~np.isnan(data.ss["dctcp_alpha"])]
            if s.size:
                # ss_sample stores alpha as a fraction already (the ingest divided ss's A by the scale)
                alpha = m.alpha_summary(s["ts_ns"], s["dctcp_alpha"], w0, w1)
        conv_s = conv_rtts = math.nan
        if rate and f.flow_id in spans and tput.size:
            conv_s, conv_rtts = _convergence(tput, running, idx, spans[f.flow_id][0], t0, conv_bin, rate,
                                             conv_bin / 1e9)
        flows.append(FlowResult(
            flow_id=f.flow_id, cc=f.cc, src_port=f.src_port, dst_port=f.dst_port, goodput_bps=goodput,
            qdelay=m.qdelay_stats(own_q, w0, w1), rtt=rtt_stats,
            srtt=m.summary_stats(data.probe["srtt_us"][pm]), cwnd=m.summary_stats(data.probe["snd_cwnd"][pm]),
            signals=m.signal_rates(p, own_q, w0, w1), completion=completion,
            gaps_us=gap_stats, retransmissions=retx, alpha=alpha, convergence_s=conv_s,
            convergence_rtts=conv_rtts, start_skew_ns=f.start_skew_ns,
            reductions=_reductions(data.probe[pm])))

    util = None
    if rate and not window.empty:
        util = m.utilisation(list(pk.values()), rate, w0, w1, HUNDRED_MS)
    n_series = bins[SERIES_BIN_NS]
    cwnd = {}
    for f in data.flows:
        c = m.cwnd_series(data.probe, f.src_port, f.dst_port)
        if c.ts_ns.size:
            cwnd[f.flow_id] = m.last_per_bin(c.ts_ns, c.cwnd, t0, SERIES_BIN_NS, n_series)
    q = data.qdisc
    return RunAnalysis(
        data_meta=meta, row=row, window=window, t0_ns=t0, base_rtt_s=rtt_s,
        qdelay=m.qdelay_stats(qd, w0, w1),
        qdelay_sketch_us=m.quantile_sketch(m.delivered_sojourns(qd, w0, w1) / 1e3),
        utilisation=util, qdisc_drop_rate=m.qdisc_drop_rate(q, w0, w1) if q.size else math.nan,
        jain=jain, ratio=ratio, flows=flows, throughput=throughput,
        qdelay_series_us=m.qdelay_series(qd, t0, SERIES_BIN_NS, n_series) if qd.size else np.empty(0),
        cwnd_series=cwnd, backlog_t_s=(q["ts_ns"] - t0) / 1e9, backlog_bytes=q["backlog_bytes"].astype(float),
        notes=tuple(notes))
