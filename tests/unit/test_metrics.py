"""Unit tests of analysis/metrics.py on small literal arrays (definitions: docs/metrics.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import metrics as m
from orchestrator.storage import records

WRAP = 1 << 32


def pkts(rows: list[tuple[int, int, int]], dst_port: int = 5201) -> np.ndarray:
    """(ts_ns, seq, payload_len) rows as a records.PACKET array; ip_len = payload + 52 (IP+TCP+ts)."""
    arr = np.zeros(len(rows), dtype=records.PACKET)
    for i, (ts, seq, plen) in enumerate(rows):
        arr[i]["ts_ns"], arr[i]["seq"], arr[i]["payload_len"] = ts, seq, plen
        arr[i]["ip_len"] = plen + 52
        arr[i]["dst_port"] = dst_port
    return arr


# ---------------------------------------------------------------------------- percentiles / M-STAT

def test_percentile_interpolates_linearly_between_closest_ranks():
    v = [4.0, 1.0, 3.0, 2.0]   # unsorted on purpose
    assert m.percentile(v, 50) == pytest.approx(2.5)
    assert m.percentile(v, 99) == pytest.approx(1 + 0.99 * 3)   # rank 2.97 between 3 and 4 -> 3.97
    assert m.percentile(v, 0) == 1.0 and m.percentile(v, 100) == 4.0
    assert m.percentile([7.0], 99) == 7.0


def test_percentile_empty_is_nan_and_bad_q_raises():
    assert math.isnan(m.percentile([], 50))
    with pytest.raises(ValueError):
        m.percentile([1.0], 101)


def test_summary_stats_uses_population_sd():
    s = m.summary_stats([2, 4, 4, 4, 5, 5, 7, 9])
    assert (s.n, s.min, s.max, s.mean) == (8, 2.0, 9.0, 5.0)
    assert s.sd == pytest.approx(2.0)          # population sd; the sample sd would be 2.138
    assert s.median == pytest.approx(4.5)
    assert s.p95 == pytest.approx(7 + 0.65 * 2)  # rank 6.65 between 7 and 9
    assert m.summary_stats([]).n == 0


# ---------------------------------------------------------------------------- sequence space / goodput

def test_unwrap_seq_handles_wrap_and_retransmission():
    seq = np.array([WRAP - 200, WRAP - 100, 0, WRAP - 100, 100, 300])
    assert m.unwrap_seq(seq).tolist() == [0, 100, 200, 100, 300, 500]


def test_unwrap_seq_survives_several_wraps():
    step = 1 << 30
    seq = np.array([(5 + k * step) % WRAP for k in range(10)])
    assert m.unwrap_seq(seq).tolist() == [k * step for k in range(10)]


def test_goodput_ignores_retransmission():
    p = pkts([(1_000, 1000, 100), (2_000, 1100, 100), (3_000, 1100, 100), (4_000, 1200, 100)])
    g = m.flow_goodput(p)
    assert (g.bytes, g.first_ns, g.last_ns, g.span_ns) == (300, 1_000, 4_000, 3_000)
    assert g.bits_per_s == pytest.approx(300 * 8 / 3e-6)


def test_goodput_across_wrap_around_with_retransmission():
    p = pkts([(0, WRAP - 150, 100), (10, WRAP - 50, 100), (20, 50, 100),
              (30, WRAP - 50, 100),              # retransmission of the wrapping segment
              (40, 150, 100)])
    g = m.flow_goodput(p)
    assert g.bytes == 400
    assert g.span_ns == 40


def test_goodput_hole_filled_later_counts_once_and_pure_acks_do_not_extend_span():
    # 100..200 was lost upstream: the jump to 200 counts the hole, the repair at t=30 counts nothing.
    p = pkts([(0, 0, 100), (10, 200, 100), (30, 100, 100), (40, 300, 50), (90, 350, 0)])
    ts, adv = m.goodput_advance(p)
    assert ts.tolist() == [0, 10, 30, 40]
    assert adv.tolist() == [100, 200, 0, 50]
    g = m.flow_goodput(p)
    assert (g.bytes, g.span_ns) == (350, 40)


def test_goodput_sorts_by_time_first():
    p = pkts([(20, 200, 100), (0, 0, 100), (10, 100, 100)])
    assert m.flow_goodput(p).bytes == 300


def test_goodput_of_nothing_or_one_packet():
    g0 = m.flow_goodput(pkts([]))
    assert g0.bytes == 0 and math.isnan(g0.bits_per_s)
    g1 = m.flow_goodput(pkts([(5, 7, 1448)]))
    assert g1.bytes == 1448 and math.isnan(g1.bits_per_s)


def test_union_span_and_aggregate_goodput():
    s = 1_000_000_000
    assert m.union_span_ns([(0, 10 * s), (5 * s, 15 * s)]) == 15 * s
    assert m.union_span_ns([(2 * s, 3 * s), (0, 1 * s)]) == 2 * s       # gap not counted
    assert m.union_span_ns([(0, 10), (2, 3)]) == 10                      # nested
    a = m.Goodput(bytes=1_000_000, first_ns=0, last_ns=10 * s)
    b = m.Goodput(bytes=500_000, first_ns=5 * s, last_ns=15 * s)
    idle = m.Goodput(bytes=0, first_ns=0, last_ns=0)
    assert m.aggregate_goodput([a, b, idle]) == pytest.approx(1_500_000 * 8 / 15)
    assert math.isnan(m.aggregate_goodput([idle]))


# ---------------------------------------------------------------------------- bins

def test_bin_sum_half_open_edges():
    ts = np.array([999, 1000, 1099, 1100, 1299, 1300])
    vals = np.array([1, 2, 4, 8, 16, 32])
    out = m.bin_sum(ts, vals, t0_ns=1000, bin_ns=100, n_bins=3)
    # 999 is before t0; 1099 is still bin 0; 1100 opens bin 1; 1300 is the end of bin 2 (excluded).
    assert out.tolist() == [6, 8, 16]


def test_bin_sum_default_bin_count_reaches_last_sample():
    out = m.bin_sum(np.array([0, 250]), np.array([1, 1]), t0_ns=0, bin_ns=100)
    assert out.tolist() == [1, 0, 1]
    assert m.bin_sum(np.array([], dtype=np.int64), np.array([]), 0, 100).size == 0
    with pytest.raises(ValueError):
        m.bin_sum(np.array([0]), np.array([1]), 0, 0)


def test_throughput_series_goodput_payload_and_wire():
    ms = 1_000_000
    p = pkts([(0, 0, 1000), (50 * ms, 1000, 1000), (120 * ms, 1000, 1000), (150 * ms, 2000, 500)])
    good = m.throughput_series(p, t0_ns=0, bin_ns=100 * ms)
    assert good.values.tolist() == pytest.approx([2000 * 8 / 0.1, 500 * 8 / 0.1])
    assert good.bin_start_s.tolist() == pytest.approx([0.0, 0.1])
    payload = m.throughput_series(p, 0, 100 * ms, kind="payload")
    assert payload.values[1] == pytest.approx(1500 * 8 / 0.1)            # counts the retransmission
    wire = m.throughput_series(p, 0, 100 * ms, n_bins=4, kind="wire")
    assert wire.values.tolist() == pytest.approx([(2 * 1066) * 8 / 0.1, (1066 + 566) * 8 / 0.1, 0, 0])
    with pytest.raises(ValueError):
        m.throughput_series(p, 0, 100 * ms, kind="bogus")


# ---------------------------------------------------------------------------- qdisc / cwnd

def qsamples(rows: list[tuple[int, int, int, int]]) -> np.ndarray:
    """(ts_ns, backlog_bytes, qlen, drops) rows as records.QDISC_SAMPLE."""
    arr = np.zeros(len(rows), dtype=records.QDISC_SAMPLE)
    for i, (ts, b, q, d) in enumerate(rows):
        arr[i]["ts_ns"], arr[i]["backlog_bytes"], arr[i]["qlen"], arr[i]["drops"] = ts, b, q, d
        arr[i]["handle"], arr[i]["parent"], arr[i]["kind"] = "1:", "root", "htb"
    return arr


def test_backlog_stats_window_mean_p99_and_drops_delta():
    s = qsamples([(0, 9999, 99, 40),          # before the window: excluded
                  (10, 0, 0, 50), (20, 1000, 1, 50), (30, 3000, 2, 57), (40, 2000, 2, 60),
                  (50, 9999, 99, 90)])        # after the window
    st = m.backlog_stats(s, start_ns=10, end_ns=40)
    assert st.samples == 4
    assert st.mean_bytes == pytest.approx(1500.0)
    assert st.p99_bytes == pytest.approx(2000 + 0.97 * 1000)   # rank 2.97 of [0, 1000, 2000, 3000]
    assert st.mean_packets == pytest.approx(1.25)
    assert st.p99_packets == pytest.approx(2.0)
    assert st.drops == 10                                      # 60 - 50, cumulative counter


def test_backlog_stats_whole_series_unsorted_and_empty_window():
    s = qsamples([(30, 300, 3, 7), (10, 100, 1, 2), (20, 200, 2, 4)])
    st = m.backlog_stats(s)
    assert st.drops == 5 and st.mean_bytes == pytest.approx(200.0)
    empty = m.backlog_stats(s, start_ns=100)
    assert empty.samples == 0 and empty.drops == 0 and math.isnan(empty.mean_bytes)


def test_mean_cwnd_filters_by_ports():
    p = np.zeros(5, dtype=records.TCP_PROBE)
    p["sport"] = [40000, 40000, 40001, 5201, 40000]
    p["dport"] = [5201, 5201, 5201, 40000, 5202]
    p["snd_cwnd"] = [10, 20, 1000, 3, 500]
    assert m.mean_cwnd(p, sport=40000, dport=5201) == pytest.approx(15.0)
    assert m.mean_cwnd(p, dport=5201) == pytest.approx((10 + 20 + 1000) / 3)
    assert math.isnan(m.mean_cwnd(p, sport=1, dport=2))
