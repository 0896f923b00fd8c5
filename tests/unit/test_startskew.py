"""M-STARTSKEW from a real capture (tests/fixtures/sockets/README.md: tcpdump on lo around one iperf3 run),
folded chunk by chunk as the writer streams it; and the capture check's reading of a flow's two ends."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.capture_check import closed, ends_of
from orchestrator.ingest.pcap import PcapReader
from orchestrator.ingest.startskew import StartTally, first_syns, point_rank
from orchestrator.plan import expand, load_plan

ROOT = Path(__file__).resolve().parents[2]
PCAP = ROOT / "tests" / "fixtures" / "ingest" / "startskew_lo.pcap"
T0 = int((ROOT / "tests" / "fixtures" / "ingest" / "startskew_lo.t0_ns").read_text())
CONTROL_SYN, DATA_SYN = 1795710090898622591, 1795710090898899462   # tcpdump -tt --time-stamp-precision nano


@pytest.fixture(scope="module")
def spec():
    return expand(load_plan(ROOT / "experiments" / "quickstart.yaml"))[0]   # one flow server -> client


def packets() -> np.ndarray:
    return np.concatenate(list(PcapReader(PCAP, 0)))


def test_first_syn_of_the_data_connection_and_of_any_connection_to_the_port():
    pk = packets()
    data, any_port = (57228 << 16) | 5299, 5299
    assert first_syns(pk, np.array([data, any_port])) == {data: DATA_SYN, any_port: CONTROL_SYN}
    assert first_syns(pk[:0], np.array([data])) == {}


def test_the_fold_over_chunks_gives_the_skew_in_the_managers_clock(spec):
    rows = [{"flow_id": 0, "src_port": 57228, "dst_port": 5299}]
    tally = StartTally(spec, rows, T0, {"aqm:to-server": "aqm", "client:to-aqm": "client"},
                       {"aqm": 2_000, "client": -5_000})
    pk = packets()
    for chunk in np.array_split(pk, 7):             # the writer's chunks: any boundaries
        tally.observe("aqm:to-server", chunk)
        tally.observe("client:to-aqm", chunk)
    (values,) = tally.flow_values().values()
    # the sender is `server`: aqm's interface facing it beats a point on the receiver
    assert values["start_point"] == "aqm:to-server"
    assert values["scheduled_start_ns"] == T0
    assert values["measured_start_ns"] == DATA_SYN - 2_000
    assert values["start_skew_ns"] == DATA_SYN - 2_000 - T0
    assert 0 < values["start_skew_ns"] < 50_000_000   # iperf3 started, connected, exchanged parameters


def test_a_flow_no_capture_saw_has_its_schedule_and_no_skew(spec):
    tally = StartTally(spec, [{"flow_id": 0, "src_port": 40000, "dst_port": 5201}], T0, {}, {})
    tally.observe("aqm:to-server", packets())
    assert tally.flow_values()[0] == {"scheduled_start_ns": T0, "measured_start_ns": None, "start_skew_ns": None,
                                      "start_point": None}


def test_point_rank_prefers_the_sender_then_the_interface_facing_it(spec):
    assert [point_rank(spec, "server", p) for p in ("server:to-aqm", "aqm:to-server", "aqm:to-client")] == [0, 1, 2]


def test_flow_ends_from_the_real_packets():
    pk = packets()

    def side(src: int, dst: int) -> list[tuple[int, int]]:
        m = (pk["src_port"] == src) & (pk["dst_port"] == dst)
        return list(zip(pk["ts_ns"][m].tolist(), pk["tcp_flags"][m].tolist(), strict=True))

    assert ends_of(side(57228, 5299), side(5299, 57228)) == (True, "fin")   # on lo this one closed with FINs
    assert closed(side(57212, 5299), side(5299, 57212))                     # the control connection
    cut = [(t, f) for t, f in side(5299, 57212) if t < 1795710090901707000]  # without the last ACK
    assert not closed(side(57212, 5299), cut)
    assert ends_of([(1, 0x02)], [(2, 0x14)]) == (True, "rst")
