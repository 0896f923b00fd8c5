"""M-STARTSKEW (the first data packet) from a real capture (tests/fixtures/sockets/README.md: tcpdump on lo
around one iperf3 run), folded chunk by chunk as the writer streams it; and the capture check's reading of a
flow's two ends."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.capture_check import closed, ends_of
from orchestrator.ingest.pcap import PcapReader
from orchestrator.ingest.startskew import StartTally, first_data, point_rank
from orchestrator.plan import expand, load_plan

ROOT = Path(__file__).resolve().parents[2]
PCAP = ROOT / "tests" / "fixtures" / "ingest" / "startskew_lo.pcap"
T0 = int((ROOT / "tests" / "fixtures" / "ingest" / "startskew_lo.t0_ns").read_text())
# tcpdump -r startskew_lo.pcap -tt --time-stamp-precision nano: the data connection's SYN, its 37-byte iperf3
# cookie, its first packet of data (seq 38:32806); the control connection's first payload (its cookie)
DATA_SYN, DATA_COOKIE, DATA_FIRST = 1795710090898899462, 1795710090898929487, 1795710090899983813
CONTROL_COOKIE = 1795710090898728218


@pytest.fixture(scope="module")
def spec():
    return expand(load_plan(ROOT / "experiments" / "quickstart.yaml"))[0]   # one flow server -> client


def packets() -> np.ndarray:
    return np.concatenate(list(PcapReader(PCAP, 0)))


def test_first_data_past_the_preamble_of_the_data_connection_and_of_any_connection_to_the_port():
    pk = packets()
    data, any_port = (57228 << 16) | 5299, 5299
    assert first_data(pk, np.array([data, any_port]), {data: 37}, {}) == {data: DATA_FIRST, any_port: CONTROL_COOKIE}
    assert first_data(pk, np.array([data]), {}, {}) == {data: DATA_COOKIE}   # no preamble: the cookie is data
    assert first_data(pk[:0], np.array([data]), {data: 37}, {}) == {}
    assert DATA_SYN < DATA_COOKIE < DATA_FIRST


def test_a_preamble_in_one_chunk_and_its_data_in_the_next_is_still_skipped():
    pk = packets()
    data = np.array([(57228 << 16) | 5299])
    cut = int(np.searchsorted(pk["ts_ns"], DATA_COOKIE + 1))    # the cookie is the last packet of the first chunk
    base: dict[int, int] = {}
    assert first_data(pk[:cut], data, {int(data[0]): 37}, base) == {}
    assert base == {int(data[0]): 1701936262}                   # the ISN + 1: the cookie's first byte
    assert first_data(pk[cut:], data, {int(data[0]): 37}, base) == {int(data[0]): DATA_FIRST}


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
    # an iperf3 flow: its first data packet after the cookie
    assert values["measured_start_ns"] == DATA_FIRST - 2_000
    assert values["start_skew_ns"] == DATA_FIRST - 2_000 - T0
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
