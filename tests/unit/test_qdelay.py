"""orchestrator.ingest.qdelay: pairing of aqm ingress/egress packets on literal arrays, on a synthetic
capture pair with a known standing queue, and on the real fixture capture (paired with itself shifted)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.ingest import qdelay
from orchestrator.ingest.pcap import read_pcap
from orchestrator.storage import addr, records
from tests.support.synth import write_bottleneck_pcap

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"
SRC, DST = addr.packed("10.0.3.2"), addr.packed("10.0.1.2")


def pkts(rows: list[tuple[int, int, int, int, int]]) -> np.ndarray:
    """(ts_ns, seq, ip_id, payload_len, ecn) rows of one flow 10.0.3.2:40000 -> 10.0.1.2:5201."""
    a = np.zeros(len(rows), records.PACKET)
    a["ts_ns"], a["seq"], a["ip_id"], a["payload_len"], a["ecn"] = np.array(rows, dtype=np.int64).T
    a["src_addr"], a["dst_addr"], a["src_port"], a["dst_port"] = SRC, DST, 40000, 5201
    a["proto"], a["ipv"], a["tsval"] = 6, 4, -1
    return a


def test_literal_pairs_drops_ce_and_given_forwarding_delay():
    ingress = pkts([(100, 1, 10, 1448, 2), (200, 1449, 11, 1448, 2), (300, 2897, 12, 1448, 2),
                    (400, 4345, 13, 1448, 3)])
    egress = pkts([(1_150, 1, 10, 1448, 2), (2_300, 2897, 12, 1448, 3), (2_450, 4345, 13, 1448, 3),
                   (9_999, 7777, 99, 1448, 2)])   # the last one never entered at this ingress
    r = qdelay.pair(ingress, egress, conn_in=np.array([5, 5, 5, 5]), d_fwd_ns=50, netem_ns=0)
    assert r.rows["dropped"].tolist() == [0, 1, 0, 0]
    assert r.rows["sojourn_ns"][[0, 2, 3]].tolist() == [1_000, 1_950, 2_000]
    assert r.rows["ts_out_ns"][[0, 2, 3]].tolist() == [1_150, 2_300, 2_450]
    assert r.rows["ce"].tolist() == [0, 0, 1, 0]    # CE on arrival is not the AQM's mark
    assert (r.matched, r.dropped, r.ce, r.unmatched_egress) == (3, 1, 1, 1)
    assert r.rows["conn_id"].tolist() == [5] * 4 and r.rows["ts_in_ns"].tolist() == [100, 200, 300, 400]
    assert (r.d_fwd_ns, r.d_fwd_source) == (50, "given")


def test_run_minimum_and_netem_are_subtracted():
    ingress = pkts([(0, 1, 1, 100, 0), (10, 101, 2, 100, 0)])
    egress = pkts([(5_000_500, 1, 1, 100, 0), (5_000_900, 101, 2, 100, 0)])
    r = qdelay.pair(ingress, egress, netem_ns=5_000_000)
    assert (r.d_fwd_ns, r.d_fwd_source) == (500, "run-minimum")
    assert r.rows["sojourn_ns"].tolist() == [0, 390]
    summary = r.summary("aqm:to-server", "aqm:to-client")
    assert summary["netem_ns"] == 5_000_000 and summary["matched"] == 2


def test_duplicates_match_in_order_and_never_backwards_in_time():
    # The same key three times at the ingress (e.g. a duplicating link), twice at the egress.
    ingress = pkts([(100, 1, 7, 10, 0), (200, 1, 7, 10, 0), (300, 1, 7, 10, 0)])
    egress = pkts([(150, 1, 7, 10, 0), (250, 1, 7, 10, 0)])
    r = qdelay.pair(ingress, egress, d_fwd_ns=0)
    assert r.rows["dropped"].tolist() == [0, 0, 1]
    assert r.rows["sojourn_ns"][:2].tolist() == [50, 50]
    # An egress copy earlier than its k-th ingress partner is not a match.
    r = qdelay.pair(pkts([(500, 1, 7, 10, 0)]), pkts([(400, 1, 7, 10, 0)]), d_fwd_ns=0)
    assert (r.matched, r.dropped, r.unmatched_egress) == (0, 1, 1)


def test_retransmission_with_the_same_ip_id_is_told_apart_by_tsval():
    """IPv6 has no IP-ID: original (dropped) and retransmission differ only in TSval."""
    ingress = pkts([(100, 1, 0, 1448, 0), (9_000, 1, 0, 1448, 0)])
    ingress["tsval"] = [1000, 1009]
    egress = pkts([(9_500, 1, 0, 1448, 0)])
    egress["tsval"] = [1009]
    r = qdelay.pair(ingress, egress, d_fwd_ns=0)
    assert r.rows["dropped"].tolist() == [1, 0] and r.rows["sojourn_ns"][1] == 500


def test_other_fields_of_the_key_must_match():
    base = pkts([(0, 1, 1, 100, 0)])
    for field, value in (("src_port", 40001), ("payload_len", 99), ("ip_id", 2), ("dst_addr", SRC)):
        other = base.copy()
        other["ts_ns"] = 10
        other[field] = value
        assert qdelay.pair(base, other).matched == 0, field
    assert qdelay.pair(base[:0], base).unmatched_egress == 1


def test_synthetic_standing_queue_is_recovered_exactly(tmp_path):
    truth = write_bottleneck_pcap(tmp_path / "e.pcap", 30_000, flows=4, ingress_path=tmp_path / "i.pcap",
                                  standing_ns=3_000_000, d_fwd_ns=20_000, seed=3)
    e, i = read_pcap(tmp_path / "e.pcap"), read_pcap(tmp_path / "i.pcap")
    e, i = e[qdelay.direction(e, SRC, DST)], i[qdelay.direction(i, SRC, DST)]
    r = qdelay.pair(i, e, d_fwd_ns=truth.d_fwd_ns)
    assert (r.matched, r.dropped, r.unmatched_egress) == (truth.data_packets, truth.dropped, 0)
    got = r.rows["sojourn_ns"][r.rows["dropped"] == 0]
    np.testing.assert_array_equal(np.sort(got), np.sort(truth.sojourn_ns))
    assert r.ce == int((e["ecn"] == 3).sum()) > 0
    # With the run minimum instead, the standing queue itself is taken for forwarding latency.
    assert qdelay.pair(i, e).d_fwd_ns == truth.d_fwd_ns + truth.sojourn_ns.min()


@pytest.mark.parametrize("shift", [0, 12_345])
def test_real_capture_paired_with_itself_shifted(shift):
    """Every packet of a real capture matches its own copy (retransmissions, SYNs, ACKs included)."""
    p = read_pcap(FIX / "eth.pcap")
    later = p.copy()
    later["ts_ns"] += shift
    r = qdelay.pair(p, later)
    assert (r.matched, r.dropped, r.unmatched_egress) == (p.size, 0, 0)
    assert (r.rows["sojourn_ns"] == 0).all() and r.d_fwd_ns == shift
