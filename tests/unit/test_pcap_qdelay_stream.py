"""orchestrator/ingest/qdelay_stream.py: windowed pairing with spooled rows gives qdelay.pair's answer
(one window: identical rows; many small windows: the same pairs on a capture pair with a known queue),
and its memory does not grow with the run."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.ingest import qdelay
from orchestrator.ingest.pcap import read_pcap
from orchestrator.ingest.qdelay_stream import Spool, pair_stream
from orchestrator.storage import addr, records
from tests.support.synth import write_bottleneck_pcap

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"
SRC, DST = addr.packed("10.0.3.2"), addr.packed("10.0.1.2")


def chunks(a: np.ndarray, size: int) -> list[np.ndarray]:
    return [a[i:i + size] for i in range(0, a.size, size)]


def with_conn(a: np.ndarray) -> np.ndarray:
    from numpy.lib.recfunctions import append_fields
    return append_fields(a, "conn_id", np.arange(a.size, dtype=np.int32) % 3, usemask=False)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d = tmp_path_factory.mktemp("qd")
    truth = write_bottleneck_pcap(d / "e.pcap", 40_000, flows=4, ingress_path=d / "i.pcap",
                                  standing_ns=3_000_000, d_fwd_ns=20_000, seed=5)
    e, i = read_pcap(d / "e.pcap"), read_pcap(d / "i.pcap")
    return truth, with_conn(i[qdelay.direction(i, SRC, DST)]), with_conn(e[qdelay.direction(e, SRC, DST)])


@pytest.mark.parametrize("d_fwd", [None, 20_000])
def test_one_window_is_exactly_pair(synthetic, d_fwd) -> None:
    _, i, e = synthetic
    want = qdelay.pair(i, e, conn_in=i["conn_id"], d_fwd_ns=d_fwd, netem_ns=1_000)
    got = pair_stream(chunks(i, 7_000), chunks(e, 5_000), d_fwd_ns=d_fwd, netem_ns=1_000)
    assert isinstance(got.rows, Spool) and len(got.rows) == i.size
    assert got.rows.array().tobytes() == want.rows.tobytes()
    assert got.summary("a", "b") == want.summary("a", "b")
    assert got.rows.array().tobytes() == want.rows.tobytes()   # re-iterable


@pytest.mark.parametrize("window", [1_000, 4_096, 25_000])
def test_many_windows_recover_the_known_queue(synthetic, window) -> None:
    truth, i, e = synthetic
    got = pair_stream(chunks(i, 3_000), chunks(e, 2_000), d_fwd_ns=truth.d_fwd_ns, window=window)
    rows = got.rows.array()
    assert (got.matched, got.dropped, got.unmatched_egress) == (truth.data_packets, truth.dropped, 0)
    np.testing.assert_array_equal(np.sort(rows["sojourn_ns"][rows["dropped"] == 0]), np.sort(truth.sojourn_ns))
    want = qdelay.pair(i, e, conn_in=i["conn_id"], d_fwd_ns=truth.d_fwd_ns)
    assert rows.tobytes() == want.rows.tobytes()
    assert pair_stream(chunks(i, 3_000), chunks(e, 2_000), window=window).d_fwd_ns == \
        truth.d_fwd_ns + truth.sojourn_ns.min()


def test_horizon_counts_late_copies_as_drops(synthetic) -> None:
    truth, i, e = synthetic
    # The egress is read only to 1 ms past each window's last ingress packet: with a 3 ms standing queue
    # the packets of a window's last ~2 ms find no partner (a real run uses 2 s + netem).
    got = pair_stream(chunks(i, 3_000), chunks(e, 10), window=1_000, horizon_ns=1_000_000)
    assert got.dropped > truth.dropped + 1_000
    assert got.matched + got.dropped == i.size


def test_real_capture_shifted_and_empty_sides() -> None:
    p = read_pcap(FIX / "eth.pcap")
    base = with_conn(p[["ts_ns", "proto", "ipv", "src_port", "dst_port", "seq", "ip_id", "payload_len", "tsval",
                        "ecn"]])
    later = base.copy()
    later["ts_ns"] += 12_345
    got = pair_stream(chunks(base, 100), chunks(later, 77), window=150)
    assert (got.matched, got.dropped, got.unmatched_egress, got.d_fwd_ns) == (base.size, 0, 0, 12_345)
    none = pair_stream([], chunks(later, 50))
    assert (none.matched, none.unmatched_egress, len(none.rows)) == (0, later.size, 0)
    lost = pair_stream(chunks(base, 100), [])
    assert (lost.matched, lost.dropped) == (0, base.size)
    assert lost.rows.array().dtype == records.QDELAY
