"""Pure metric maths over numpy arrays, one module per family of metrics (M-… codes: docs/metrics.md).

Nothing here touches the database, files or plots: inputs are structured arrays whose field names
follow orchestrator/storage/records.py (only the fields a function names are required), outputs are
numbers, small dataclasses or arrays. Times are integer ns. Definitions: docs/metrics.md.

  stats       M-STAT summaries, quantile sketches, box statistics
  windows     G-WINDOW analysis windows (warm-up, all flows active, measure length)
  throughput  M-TPUT goodput and bins, M-UTIL utilisation, sequence-space helpers
  queue       M-QDELAY, M-QLEN, M-MARK, M-DROP
  tcpstate    M-CWND series, M-CWNDCOLLAPSE, M-ALPHA
  timing      M-RTT (timestamps), M-FCT, M-GAP, M-APPLAT
  fairness    M-JAIN, M-RATIO, M-CONV
"""
from analysis.metrics.fairness import (
    FAIR_HI,
    FAIR_LO,
    HOLD_BINS,
    RateRatio,
    convergence_bin,
    jain_index,
    jain_series,
    rate_ratio,
    running_matrix,
)
from analysis.metrics.queue import (
    CE,
    BacklogStats,
    SignalRates,
    backlog_stats,
    binned_mean,
    delivered_sojourns,
    qdelay_series,
    qdelay_stats,
    qdisc_drop_rate,
    signal_rates,
)
from analysis.metrics.stats import (
    PERCENTILE_METHOD,
    SKETCH_POINTS,
    STAT_FIELDS,
    BoxStats,
    Stats,
    box_stats,
    percentile,
    quantile_sketch,
    summary_stats,
)
from analysis.metrics.tcpstate import (
    COLLAPSE_BELOW,
    DCTCP_ALPHA_SCALE,
    SSTHRESH_UNSET,
    AlphaSummary,
    CwndSeries,
    Reductions,
    alpha_fraction,
    alpha_summary,
    cwnd_series,
    last_per_bin,
    mean_cwnd,
    probe_mask,
    reduction_episodes,
)
from analysis.metrics.throughput import (
    ETHERNET_HEADER,
    SEQ_SPACE,
    BinnedSeries,
    Goodput,
    Utilisation,
    aggregate_goodput,
    bin_sum,
    flow_goodput,
    goodput_advance,
    is_retransmission,
    signed_seq_diff,
    throughput_series,
    union_span_ns,
    unwrap_seq,
    utilisation,
    wire_bytes,
)
from analysis.metrics.timing import (
    Completion,
    Gaps,
    WriteLatency,
    flow_completion,
    inter_packet_gaps,
    rtt_from_timestamps,
    write_latency,
)
from analysis.metrics.windows import Window, analysis_window, in_window

__all__ = [
    "FAIR_HI", "FAIR_LO", "HOLD_BINS", "RateRatio", "convergence_bin", "jain_index", "jain_series", "rate_ratio",
    "running_matrix", "CE", "BacklogStats", "SignalRates", "backlog_stats", "binned_mean", "delivered_sojourns",
    "qdelay_series", "qdelay_stats", "qdisc_drop_rate", "signal_rates", "PERCENTILE_METHOD", "SKETCH_POINTS",
    "STAT_FIELDS", "BoxStats", "Stats", "box_stats", "percentile", "quantile_sketch", "summary_stats",
    "COLLAPSE_BELOW", "DCTCP_ALPHA_SCALE", "SSTHRESH_UNSET", "AlphaSummary", "CwndSeries", "Reductions",
    "alpha_fraction", "alpha_summary", "reduction_episodes",
    "cwnd_series", "last_per_bin", "mean_cwnd", "probe_mask", "ETHERNET_HEADER", "SEQ_SPACE", "BinnedSeries",
    "Goodput", "Utilisation", "aggregate_goodput", "bin_sum", "flow_goodput", "goodput_advance",
    "is_retransmission", "signed_seq_diff", "throughput_series", "union_span_ns", "unwrap_seq", "utilisation",
    "wire_bytes", "Completion", "Gaps", "WriteLatency", "flow_completion", "inter_packet_gaps",
    "rtt_from_timestamps", "write_latency", "Window", "analysis_window", "in_window",
]
