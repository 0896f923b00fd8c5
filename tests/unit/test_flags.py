"""Flags as values (schemas/flag.py) and the G-ECN packet fold (orchestrator/guards/ecn.py).

The fold is checked against an independent count: scapy crafts a capture with known handshakes and ECN
codepoints, tcplab's reader decodes it, and the per-(ports) counters must be what was written."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from orchestrator.guards.ecn import COUNTERS, EcnTally, chunk_counts, wants_ecn
from orchestrator.ingest.pcap import read_pcap
from orchestrator.plan import expand, load_plan
from schemas.flag import Flag, parse_line, unique

ROOT = Path(__file__).resolve().parents[2]


def test_a_flag_prints_as_one_line_and_stores_as_an_object():
    f = Flag(guard="G-NETEM", host="aqm", message="netem holds 5 packets", accepted=True,
             evidence={"limit": 5, "need": 40})
    assert str(f) == "accepted G-NETEM host aqm: netem holds 5 packets"
    assert f.stored() == {"guard": "G-NETEM", "host": "aqm", "message": "netem holds 5 packets", "accepted": True,
                          "evidence": {"limit": 5, "need": 40}}
    assert Flag.from_stored(f.stored()) == f
    assert Flag(guard="G-CLOCK", message="x").stored() == {"guard": "G-CLOCK", "message": "x"}


def test_a_flag_refuses_what_is_not_a_code_or_an_unknown_key():
    with pytest.raises(ValidationError, match="guard"):
        Flag(guard="netem", message="x")
    with pytest.raises(ValidationError, match="extra"):
        Flag.from_stored({"guard": "G-HTB", "message": "x", "severity": "high"})


@pytest.mark.parametrize("line, guard, host, accepted", [
    ("G-CLOCK host server: clock offset 2500 us exceeds 1000 us", "G-CLOCK", "server", False),
    ("accepted G-OFFLOAD host client: tso not switched off", "G-OFFLOAD", "client", True),
    ("G-CPULOAD host client+aqm+server: cpu1 was > 90% busy", "G-CPULOAD", "client+aqm+server", False),
    ("client/capture-to-aqm: capture incomplete (G-CAPTURE): 3 dropped by kernel", "G-CAPTURE", "client", False),
    ("aqm: reset left sysctl net.ipv4.tcp_ecn: '1' != '0'", "G-RESET", "aqm", False),
    ("client: to-aqm: pause frames off by absence (driver veth: ?)", "G-NIC", "client", False),
    ("server/iperf3-client-5201: ended abnormally after sending: x", "G-TASK", "server", False),
])
def test_lines_from_older_runs_are_read_as_flags(line, guard, host, accepted):
    f = parse_line(line)
    assert (f.guard, f.host, f.accepted) == (guard, host, accepted)


def test_unique_keeps_the_first_of_equal_flags():
    a, b = Flag(guard="G-HTB", host="aqm", message="m"), Flag(guard="G-CC", host="server", message="n")
    assert unique([a, b, Flag(guard="G-HTB", host="aqm", message="m"), a]) == [a, b]


def _capture(path: Path) -> None:
    """Flow 40000 -> 5201 negotiates ECN and sends ECT(0) data with one CE mark; flow 40001 -> 5202 retries
    its SYN without ECE+CWR and sends not-ECT data."""
    eth = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    a, b = dict(src="10.0.0.1", dst="10.0.0.2"), dict(src="10.0.0.2", dst="10.0.0.1")
    pkts = [eth / IP(**a) / TCP(sport=40000, dport=5201, flags="SEC"),
            eth / IP(**b) / TCP(sport=5201, dport=40000, flags="SAE"),
            *(eth / IP(**a, tos=0x02) / TCP(sport=40000, dport=5201, flags="A") / (b"x" * 100) for _ in range(4)),
            eth / IP(**a, tos=0x03) / TCP(sport=40000, dport=5201, flags="A") / (b"x" * 100),
            eth / IP(**b) / TCP(sport=5201, dport=40000, flags="AE"),
            eth / IP(**a) / TCP(sport=40001, dport=5202, flags="SEC"),
            eth / IP(**a) / TCP(sport=40001, dport=5202, flags="S"),
            eth / IP(**b) / TCP(sport=5202, dport=40001, flags="SA"),
            *(eth / IP(**a) / TCP(sport=40001, dport=5202, flags="A") / (b"y" * 50) for _ in range(3))]
    wrpcap(str(path), pkts)


def test_chunk_counts_match_the_packets_written(tmp_path):
    _capture(tmp_path / "c.pcap")
    ports, counts = chunk_counts(read_pcap(tmp_path / "c.pcap"))
    got = {tuple(p): dict(zip(COUNTERS, c.tolist(), strict=True)) for p, c in zip(ports.tolist(), counts,
                                                                                   strict=True)}
    assert got == {
        (40000, 5201): {"syn": 1, "syn_ecn": 1, "synack": 0, "synack_ece": 0, "data": 5, "data_ect": 5},
        (5201, 40000): {"syn": 0, "syn_ecn": 0, "synack": 1, "synack_ece": 1, "data": 0, "data_ect": 0},
        (40001, 5202): {"syn": 2, "syn_ecn": 1, "synack": 0, "synack_ece": 0, "data": 3, "data_ect": 0},
        (5202, 40001): {"syn": 0, "syn_ecn": 0, "synack": 1, "synack_ece": 0, "data": 0, "data_ect": 0}}


def test_the_tally_adds_chunks_up_and_flags_the_flow_that_fell_back(tmp_path):
    _capture(tmp_path / "c.pcap")
    packets = read_pcap(tmp_path / "c.pcap")
    spec = next(s for s in expand(load_plan(ROOT / "experiments/vm/dctcp.yaml")))
    assert wants_ecn(spec)
    flows = [{"flow_id": f.flow_id, "src_port": None} for f in spec.flows]
    whole, split = EcnTally(spec, flows), EcnTally(spec, flows)
    whole.observe("aqm:to-client", packets)
    for part in np.array_split(packets, 5):          # the writer hands over chunks of any size
        split.observe("aqm:to-client", part)
    assert whole.counts() == split.counts()
    assert sum(c["data_ect"] for c in whole.counts()) == 5
    assert whole.flags() == []                       # the dctcp flow on 5201 negotiated and used ECN
    moved = spec.model_copy(update={"flows": [spec.flows[0].model_copy(update={"port": 5202})]})
    fell_back = EcnTally(moved, flows)
    fell_back.observe("aqm:to-client", packets)
    [flag] = fell_back.flags()
    assert flag["guard"] == "G-ECN" and "the SYN-ACK carried no ECE" in flag["message"]
    assert "0% of its data packets" in flag["message"] and "its SYN carried" not in flag["message"]
