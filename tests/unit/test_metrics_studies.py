"""Unit tests of the metrics added for the studies (analysis/metrics/*): small literal inputs,
expected values computed by hand in the comments (definitions: docs/metrics.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import metrics as m
from analysis import significance as sig
from orchestrator.storage import records

MS = 1_000_000


def pkts(rows: list[tuple], fields: tuple[str, ...]) -> np.ndarray:
    arr = np.zeros(len(rows), dtype=records.PACKET)
    for i, row in enumerate(rows):
        for name, value in zip(fields, row, strict=True):
            arr[i][name] = value
    arr["tsval"][[k for k in range(len(rows)) if "tsval" not in fields]] = -1
    arr["tsecr"][[k for k in range(len(rows)) if "tsecr" not in fields]] = -1
    return arr


def qrows(rows: list[tuple[int, int, int, int]]) -> np.ndarray:
    """(ts_in_ns, sojourn_ns, dropped, ce) rows of 1448-byte data packets."""
    a = np.zeros(len(rows), records.QDELAY)
    for i, (t, s, d, ce) in enumerate(rows):
        a[i]["ts_in_ns"], a[i]["sojourn_ns"], a[i]["dropped"], a[i]["ce"] = t, s, d, ce
    a["payload_len"] = 1448
    return a


# ---------------------------------------------------------------------------- stats

def test_quantile_sketch_and_box_stats():
    sk = m.quantile_sketch([4.0, 1.0, 3.0, 2.0], points=5)       # probabilities 0, .25, .5, .75, 1
    assert sk.tolist() == pytest.approx([1.0, 1.75, 2.5, 3.25, 4.0])
    b = m.box_stats([1, 2, 3, 4, 100])   # q1 2, q3 4, IQR 2: 100 > 4 + 3 is outside the whisker
    assert (b.q1, b.median, b.q3, b.whisker_lo, b.whisker_hi, b.n) == (2, 3, 4, 1, 4, 5)
    assert m.box_stats([]).n == 0 and m.quantile_sketch([]).size == 0


def test_summary_stats_ignores_nan_and_scales():
    s = m.summary_stats([1.0, math.nan, 3.0])
    assert (s.n, s.mean, s.sd) == (2, 2.0, 1.0)
    assert s.scaled(1000).max == 3000.0 and s.scaled(1000).n == 2


# ---------------------------------------------------------------------------- windows

def test_analysis_window_all_flows_active_warmup_and_measure():
    spans = [(100, 1000), (300, 800)]
    w = m.analysis_window(spans, t0_ns=0)
    assert (w.start_ns, w.end_ns, w.rule) == (300, 800, "all_flows_active")
    w = m.analysis_window(spans, t0_ns=0, warmup_s=400e-9, measure_s=200e-9)
    assert (w.start_ns, w.end_ns) == (400, 600)
    assert "warm-up" in w.rule and "measure" in w.rule
    whole = m.analysis_window(spans, 0, mode="run")
    assert (whole.start_ns, whole.end_ns) == (100, 1000)
    assert m.analysis_window([(0, 10), (20, 30)], 0).empty               # never all active together
    with pytest.raises(ValueError):
        m.analysis_window(spans, 0, mode="bogus")


# ---------------------------------------------------------------------------- utilisation

def test_utilisation_wire_and_payload_per_bin():
    # rate 1.2 Mbit/s, 10 ms bins = 1500 B per bin at full rate. Bin 0: two 1500-B IP packets of 1448
    # payload -> wire 2 x 1514 = 3028 B -> 2.0187; payload 2896 -> 1.9307. Bin 1: one packet.
    p = pkts([(0, 0, 1448, 1500), (5 * MS, 1448, 1448, 1500), (10 * MS, 2896, 1448, 1500)],
             ("ts_ns", "seq", "payload_len", "ip_len"))
    u = m.utilisation([p], rate_bit=1_200_000, start_ns=0, end_ns=20 * MS, bin_ns=10 * MS)
    assert u.wire.n == 2
    assert u.wire.max == pytest.approx(3028 * 8 / (1.2e6 * 0.01))
    assert u.wire.min == pytest.approx(1514 * 8 / (1.2e6 * 0.01))
    assert u.payload.mean == pytest.approx((2896 + 1448) / 2 * 8 / (1.2e6 * 0.01))
    assert u.min_10ms_wire == pytest.approx(u.wire.min)
    # a partial bin at the end is not counted: [0, 25 ms) still has 2 whole 10 ms bins
    assert m.utilisation([p], 1_200_000, 0, 25 * MS, 10 * MS).wire.n == 2


# ---------------------------------------------------------------------------- queue

def test_qdelay_stats_exclude_drops_acks_and_outside_window():
    q = qrows([(0, 1000, 0, 0), (10, 2000, 0, 0), (20, -1, 1, 0), (30, 4000, 0, 1), (99, 9000, 0, 0)])
    q["payload_len"][1] = 0                              # a pure ACK is no data
    s = m.qdelay_stats(q, start_ns=0, end_ns=50)         # 1000 and 4000 ns -> 1 and 4 µs
    assert (s.n, s.min, s.max, s.mean) == (2, 1.0, 4.0, 2.5)
    assert m.delivered_sojourns(q).tolist() == [1000, 4000, 9000]


def test_qdelay_series_means_per_bin_and_nan_for_empty_bins():
    q = qrows([(0, 1000, 0, 0), (5, 3000, 0, 0), (25, 7000, 0, 0)])
    assert m.qdelay_series(q, t0_ns=0, bin_ns=10, n_bins=3).tolist()[0] == 2.0
    out = m.qdelay_series(q, 0, 10, 3)
    assert math.isnan(out[1]) and out[2] == 7.0


def test_signal_rates_ce_fraction_and_aqm_marks_and_drops():
    down = pkts([(0, 0, 100, 2), (1, 0, 100, 3), (2, 0, 100, 3), (3, 0, 100, 0), (4, 0, 0, 3)],
                ("ts_ns", "seq", "payload_len", "ecn"))   # 3 ECN-capable data packets, 2 CE; ACK ignored
    q = qrows([(0, 10, 0, 1), (1, 10, 0, 0), (2, -1, 1, 0), (3, 10, 0, 0)])
    s = m.signal_rates(down, q)
    assert (s.data_packets, s.ecn_capable, s.ce) == (4, 3, 2)
    assert s.ce_fraction == pytest.approx(2 / 3)
    assert s.aqm_marked == pytest.approx(0.25) and s.aqm_dropped == pytest.approx(0.25)
    none = m.signal_rates(down[:0], q[:0])
    assert math.isnan(none.ce_fraction) and math.isnan(none.aqm_dropped)


def test_qdisc_drop_rate_from_counters():
    s = np.zeros(3, records.QDISC_SAMPLE)
    s["ts_ns"], s["packets"], s["drops"] = [0, 10, 20], [100, 150, 196], [5, 6, 9]
    assert m.qdisc_drop_rate(s) == pytest.approx(4 / (96 + 4))      # Δdrops / (Δsent + Δdrops)
    assert math.isnan(m.qdisc_drop_rate(s[:1]))


# ---------------------------------------------------------------------------- tcp state, alpha

def test_cwnd_series_slow_start_end_and_last_per_bin():
    p = np.zeros(4, records.TCP_PROBE)
    p["ts_ns"] = [30, 10, 20, 40]
    p["sport"], p["dport"] = 40000, 5201
    p["snd_cwnd"] = [40, 10, 20, 30]
    p["ssthresh"] = [20, m.SSTHRESH_UNSET, m.SSTHRESH_UNSET, 20]
    c = m.cwnd_series(p, 40000, 5201)
    assert c.ts_ns.tolist() == [10, 20, 30, 40] and c.cwnd.tolist() == [10, 20, 40, 30]
    assert math.isnan(c.ssthresh[0]) and c.ssthresh[2] == 20 and c.slow_start_end_ns == 30
    last = m.last_per_bin(c.ts_ns, c.cwnd, t0_ns=0, bin_ns=15, n_bins=3)   # ends 15, 30, 45 (exclusive)
    assert last.tolist() == [10, 20, 30]
    assert math.isnan(m.last_per_bin(c.ts_ns, c.cwnd, 0, 5, 1)[0])        # before the first event


def test_alpha_fraction_and_time_weighted_mean():
    a = m.alpha_fraction(np.array([1024, 512, 0]))
    assert a.tolist() == [1.0, 0.5, 0.0]
    # alpha 1.0 held for 10 ns, then 0.5 for 30 ns: time-weighted (10 + 15) / 40 = 0.625
    s = m.alpha_summary(np.array([0, 10, 40]), a)
    assert s.time_weighted_mean == pytest.approx(0.625)
    assert s.samples.mean == pytest.approx(0.5)
    assert m.alpha_summary(np.array([0, 10, 40]), a, start_ns=5).samples.n == 2
    with pytest.raises(ValueError):
        m.alpha_fraction(np.array([1]), scale=0)


# ---------------------------------------------------------------------------- RTT, FCT, gaps, write latency

F_DATA = ("ts_ns", "seq", "payload_len", "tsval", "tcp_flags")
F_ACK = ("ts_ns", "ack", "tsecr", "tcp_flags")


def test_rtt_from_timestamps_first_send_first_echo_and_retransmissions_skipped():
    data = pkts([(0, 0, 100, 7, 0x18), (5, 100, 100, 7, 0x18),      # two segments share TSval 7
                 (20, 200, 100, 8, 0x18),
                 (40, 100, 100, 9, 0x18),                            # retransmission: TSval 9 tainted
                 (50, 300, 100, 9, 0x18)], F_DATA)
    acks = pkts([(30, 200, 7, 0x10), (33, 200, 7, 0x10),             # first echo of 7 at 30
                 (45, 300, 8, 0x10), (70, 400, 9, 0x10)], F_ACK)
    ts, rtt = m.rtt_from_timestamps(data, acks)
    assert ts.tolist() == [30, 45] and rtt.tolist() == [30, 25]      # 30 − 0, 45 − 20; 9 skipped


def test_flow_completion_from_syn_to_ack_covering_last_byte_across_wrap():
    isn = (1 << 32) - 150
    data = pkts([(100, isn, 0, -1, 0x02),                           # SYN (sender side opens here)
                 (200, (isn + 1) % (1 << 32), 100, -1, 0x18),
                 (210, (isn + 101) % (1 << 32), 100, -1, 0x18)], F_DATA)
    acks = pkts([(150, 0, -1, 0x12),                                 # SYN-ACK
                 (260, (isn + 101) % (1 << 32), -1, 0x10),
                 (270, (isn + 201) % (1 << 32), -1, 0x10),           # covers the final byte: done
                 (400, (isn + 202) % (1 << 32), -1, 0x11)], F_ACK)   # FIN-ACK later does not count
    c = m.flow_completion(data, acks)
    assert (c.syn_ns, c.done_ns, c.fct_ns, c.censored, c.data_bytes) == (100, 270, 170.0, False, 200)
    cut = m.flow_completion(data, acks[:2])                          # last byte never acked
    assert cut.censored and cut.fct_ns == 160.0                      # lower bound: SYN to last packet seen


def test_inter_packet_gaps_skip_retransmissions():
    data = pkts([(0, 0, 100), (10, 100, 100), (15, 0, 100), (30, 200, 100)], ("ts_ns", "seq", "payload_len"))
    g = m.inter_packet_gaps(data)
    assert g.gaps_ns.tolist() == [10, 20] and g.retransmissions == 1
    assert g.payload_sizes.tolist() == [100, 100, 100, 100]


def test_write_latency_send_and_delivery():
    isn = 1000
    writes = np.zeros(3, [("t_ns", "i8"), ("offset", "i8"), ("len", "i8")])
    writes["t_ns"], writes["offset"], writes["len"] = [0, 10, 20], [0, 50, 100], [50, 50, 50]
    # write 0 = bytes 0..49 (seq 1001..1050), write 1 = 50..99, write 2 = 100..149 never sent
    data = pkts([(5, 1001, 60), (30, 1061, 40), (35, 1001, 60)], ("ts_ns", "seq", "payload_len"))
    acks = pkts([(40, 1061, -1, 0x10), (60, 1101, -1, 0x10)], F_ACK)
    lat = m.write_latency(writes, isn, data, acks)
    assert lat.send_ns[:2].tolist() == [5, 20] and math.isnan(lat.send_ns[2])
    assert lat.delivery_ns[:2].tolist() == [40, 50] and math.isnan(lat.delivery_ns[2])


# ---------------------------------------------------------------------------- fairness, convergence

def test_jain_index_and_series():
    assert m.jain_index(np.array([1.0, 1.0])) == pytest.approx(1.0)
    assert m.jain_index(np.array([3.0, 1.0])) == pytest.approx(16 / (2 * 10))     # 0.8
    assert m.jain_index(np.array([1.0, 0.0, 0.0, 0.0])) == pytest.approx(0.25)    # 1/n
    assert math.isnan(m.jain_index(np.array([0.0, 0.0])))
    tput = np.array([[3.0, 1.0, 2.0], [1.0, 1.0, 9.0]])
    running = np.array([[True, True, True], [True, True, False]])
    out = m.jain_series(tput, running)
    assert out[0] == pytest.approx(0.8) and out[1] == pytest.approx(1.0) and math.isnan(out[2])


def test_rate_ratio_geometric_mean_and_toggling():
    r = m.rate_ratio(np.array([2.0, 8.0, 0.0]), np.array([1.0, 2.0, 5.0]))   # ratios 2, 4; zero skipped
    assert r.geometric_mean == pytest.approx(math.sqrt(8)) and not r.toggling and r.bins == 2
    assert m.rate_ratio(np.array([2.0, 1.0]), np.array([1.0, 2.0])).toggling


def test_convergence_bin_needs_the_new_flow_in_band_and_everyone_held():
    # rate 10, flow 0 alone until bin 2, then flow 1 joins: fair share 5 from bin 2 on.
    f0 = [10, 10, 9, 7, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]
    f1 = [0, 0, 1, 3, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5]
    tput = np.array([f0, f1], dtype=float)
    running = np.array([[True] * 15, [False, False] + [True] * 13])
    assert m.convergence_bin(tput, running, new_flow=1, start_bin=2, rate_bit=10, hold=10) == 4
    # with a hold of 12 bins there are not enough bins left: censored
    assert m.convergence_bin(tput, running, 1, 2, 10, hold=12) is None
    # bin 3 has the new flow at 3 < 0.8 x 5: not yet converged even with a short hold
    assert m.convergence_bin(tput, running, 1, 2, 10, hold=1) == 4


def test_running_matrix_whole_bins_only():
    r = m.running_matrix([(0, 25), None, (5, 40)], t0_ns=0, bin_ns=10, n_bins=4)
    # [30, 40) lies inside the closed span [5, 40]; [20, 30) does not fit in [0, 25]
    assert r.tolist() == [[True, True, False, False], [False] * 4, [False, True, True, True]]


# ---------------------------------------------------------------------------- significance

def test_betainc_closed_forms():
    assert sig.betainc(1, 1, 0.3) == pytest.approx(0.3)                  # uniform
    assert sig.betainc(3, 1, 0.5) == pytest.approx(0.125)                # x^a
    assert sig.betainc(2, 3, 0.4) == pytest.approx(0.5248)               # binomial sum, by hand
    assert sig.betainc(4, 4, 0.5) == pytest.approx(0.5)                  # symmetry
    with pytest.raises(ValueError):
        sig.betainc(0, 1, 0.5)


def test_t_distribution_tail_and_quantile_match_tables():
    assert sig.t_two_sided_p(2.228138852, 10) == pytest.approx(0.05, abs=1e-8)
    assert sig.t_two_sided_p(12.7062047, 1) == pytest.approx(0.05, abs=1e-7)
    assert sig.t_two_sided_p(0.0, 5) == pytest.approx(1.0)
    assert sig.t_quantile(0.975, 4) == pytest.approx(2.776445105, abs=1e-7)


def test_welch_t_test_by_hand():
    # a: mean 2.5, s² 5/3; b: mean 5, s² 2.5. se² = 5/12 + 1/2 = 11/12; t = 2.5 / sqrt(11/12) = 2.6112
    # df = (11/12)² / ((5/12)²/3 + (1/2)²/4) = 0.84028 / 0.12037 = 6.981
    w = sig.welch_t_test([1, 2, 3, 4], [3, 4, 5, 6, 7])
    assert (w.n_a, w.n_b, w.mean_a, w.mean_b, w.diff) == (4, 5, 2.5, 5.0, 2.5)
    assert w.t == pytest.approx(2.5 / math.sqrt(11 / 12))
    assert w.df == pytest.approx((11 / 12) ** 2 / ((5 / 12) ** 2 / 3 + 0.25 / 4))
    assert 0.03 < w.p < 0.04                                             # between t(7) 0.05 and 0.025 points
    assert math.isnan(sig.welch_t_test([1], [2, 3]).p)                   # one run: no test
    assert math.isnan(sig.welch_t_test([1, 1], [2, 2]).p)                # no spread: undefined


def test_t_interval():
    mean, lo, hi = sig.t_interval([1, 2, 3, 4, 5])   # s = sqrt(2.5), t(0.975, 4) = 2.7764
    half = 2.776445105 * math.sqrt(2.5) / math.sqrt(5)
    assert mean == 3.0 and lo == pytest.approx(3 - half) and hi == pytest.approx(3 + half)
    assert math.isnan(sig.t_interval([7.0])[1])
