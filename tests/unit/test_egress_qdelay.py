"""M-QDELAY at a sender's own egress (method (a), orchestrator/ingest/egress_qdelay.py) on literal artifacts of a
netns-lab run (tests/fixtures/egress/README.md): the queue trace's events, the super-packets TCP hands the qdisc
with `gso off`, every captured data packet timed, and each packet's wait agreeing with what the qdisc's own
samples say it found on entering: the backlog ahead of it drained at the shaped rate (a FIFO)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.ingest import egress_qdelay as eg
from orchestrator.ingest import qdelay
from orchestrator.ingest.assemble import parse_qdisc_csv
from orchestrator.ingest.pcap import read_pcap
from orchestrator.storage import addr

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "egress"
OFFSET_NS = 1795788620063299383
RATE_BIT = 50_000_000


@pytest.fixture(scope="module")
def events() -> np.ndarray:
    return eg.parse_queue_trace((FIX / "queue-trace-to-receiver.trace").read_text(), OFFSET_NS)


def _data_packets() -> np.ndarray:
    pkts = read_pcap(FIX / "sender-egress.pcap", 0)
    pkts = pkts[qdelay.direction(pkts, addr.packed("10.199.1.1"), addr.packed("10.199.1.2"))]
    out = np.zeros(pkts.size, [("ts_ns", "i8"), ("ip_len", "i4"), ("payload_len", "i4"), ("ecn", "i2"),
                               ("conn_id", "i4")])
    for n in ("ts_ns", "ip_len", "payload_len", "ecn"):
        out[n] = pkts[n]
    out["conn_id"] = pkts["dst_port"]
    return out[np.argsort(out["ts_ns"], kind="stable")]


def test_the_trace_is_read_in_file_order_with_the_super_packets_tcp_queues(events):
    kinds = {k: int((events["kind"] == k).sum()) for k in (eg.QUEUE, eg.DEQUEUE, eg.XMIT)}
    assert sum(kinds.values()) == 446 and kinds[eg.XMIT] > kinds[eg.QUEUE] > 0
    assert (np.diff(events["ts_ns"]) >= 0).all()
    first = events[0]
    assert first["ts_ns"] == 2451_189389_000 + OFFSET_NS and first["kind"] == eg.DEQUEUE
    queued = events["len"][events["kind"] == eg.QUEUE]
    assert queued.max() > 1514                 # GSO super-packets in the chain although the device has gso off
    assert set(events["len"][events["kind"] == eg.XMIT].tolist()) <= set(range(54, 1515))


def test_every_captured_data_packet_gets_its_super_packets_entry_and_the_delay_matches_the_backlog(events):
    xm = eg.trace_xmits(events)
    pkts = _data_packets()
    rows, unmatched = eg.attach(xm.rows, pkts, netem_ns=0)
    assert unmatched == 0 and rows.size == pkts.size > 200
    assert (rows["sojourn_ns"] >= 0).all() and (rows["ts_in_ns"] <= rows["ts_out_ns"]).all()
    # a FIFO drained at the rate: the wait is the backlog found on entering (last 1 ms sample before) / rate
    q = parse_qdisc_csv((FIX / "qdisc-to-receiver.csv").read_text())
    q = q[q["kind"] == "pfifo"]
    data = rows[rows["payload_len"] > 0]
    found = q["backlog_bytes"][np.searchsorted(q["ts_ns"], data["ts_in_ns"], side="right") - 1]
    expected_ms = (found * 8 / RATE_BIT * 1e3).mean()
    measured_ms = data["sojourn_ns"].mean() / 1e6
    assert measured_ms == pytest.approx(expected_ms, rel=0.1), (measured_ms, expected_ms)


def test_a_packet_that_is_never_dequeued_is_a_drop_and_a_refused_xmit_is_not_a_departure():
    ev = np.zeros(6, eg.EVENTS)
    # skb A queued, dequeued, cut into two xmits; skb B queued and dropped (its address reused by C later)
    ev[:] = [(100, 0, 0xA, 3000, eg.QUEUE), (200, 1, 0xB, 1514, eg.QUEUE), (300, 2, 0xA, 0, eg.DEQUEUE),
             (301, 3, 0x1, 1514, eg.XMIT), (302, 4, 0x2, 1514, eg.XMIT), (400, 5, 0xB, 1514, eg.QUEUE)]
    xm = eg.trace_xmits(ev)
    assert xm.dropped == 2 and xm.rows["ts_in_ns"].tolist() == [100, 100]
    assert xm.rows["ts_xmit_ns"].tolist() == [301, 302]


def test_a_line_in_another_format_is_refused_naming_the_event():
    bad = "  iperf3-1 [000] b.... 10.000001: net_dev_xmit: dev=x skb=00ff len=1514 rc=0\n"
    with pytest.raises(eg.QueueTraceFormatError, match="net_dev_xmit"):
        eg.parse_queue_trace(bad, 0)


def test_a_queue_is_traced_where_a_sender_captures_behind_its_own_chain_and_nowhere_else():
    from orchestrator.engine.bind import egress_queue_sites
    from orchestrator.plan import expand, load_plan

    root = Path(__file__).resolve().parents[2]
    (egress,) = expand(load_plan(root / "tests" / "plans" / "lab_sender_egress.yaml"))
    assert egress_queue_sites(egress) == [("sender", "receiver")]
    lsaimd = expand(load_plan(root / "experiments" / "lsaimd" / "table-5-1.yaml"))[0]
    assert egress_queue_sites(lsaimd) == [("sender", "receiver")]
    quickstart = expand(load_plan(root / "experiments" / "quickstart.yaml"))[0]
    assert egress_queue_sites(quickstart) == []          # the bottleneck is on the aqm: paired captures time it
