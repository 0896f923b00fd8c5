"""Pure argv builders and read-back verification, on a literal read-back captured from a real agent."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.host.argv import ChainError, chain_argv, offload_argv
from agents.tasks import parse_capture_stats
from orchestrator.engine.verify import readback_differences
from schemas import protocol
from schemas.hoststate import Bfifo, HostState, Htb, Pfifo
from schemas.qdiscs.base import parse_tc_size
from schemas.qdiscs.htb import htb_class_bursts

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "agent" / "readback_aqm_htb50_pfifo100.json"


def test_htb_pfifo_chain_argv():
    cmds = chain_argv("to-client", [Htb(rate_bit=20_000_000, burst_bytes=15000), Pfifo(limit_packets=100)])
    assert cmds == [
        ["tc", "qdisc", "add", "dev", "to-client", "root", "handle", "1:", "htb", "default", "1"],
        ["tc", "class", "add", "dev", "to-client", "parent", "1:", "classid", "1:1", "htb", "rate",
         "20000000bit", "ceil", "20000000bit", "burst", "15000", "cburst", "15000"],
        ["tc", "qdisc", "add", "dev", "to-client", "parent", "1:1", "handle", "2:", "pfifo", "limit", "100"],
    ]


def test_leaf_qdisc_cannot_have_a_child():
    with pytest.raises(ChainError, match="put it last"):
        chain_argv("x", [Bfifo(limit_bytes=10000), Pfifo(limit_packets=10)])


def test_offload_argv_is_sorted_and_refuses_unknown_features():
    assert offload_argv("e0", {"tso": False, "gro": False}) == ["ethtool", "-K", "e0", "gro", "off", "tso", "off"]
    with pytest.raises(ChainError):
        offload_argv("e0", {"tro": False})


def test_tc_sizes():
    assert parse_tc_size("15000b") == 15000
    assert parse_tc_size("15Kb") == 15360
    assert parse_tc_size("1Mb") == 1048576


def load():
    doc = json.loads(FIXTURE.read_text())
    return HostState.model_validate(doc["desired"]), protocol.Readback.model_validate(doc["readback"])


def test_real_readback_matches_what_was_applied():
    desired, rb = load()
    assert htb_class_bursts(rb.interfaces["to-client"].tc_class_text) == {"1:1": (15000, 15000)}
    assert readback_differences(desired, rb) == []


def test_readback_mismatches_are_named():
    desired, rb = load()
    chain = list(desired.interfaces["to-client"].qdiscs)
    wrong = desired.model_copy(update={
        "sysctls": {**desired.sysctls, "net.ipv4.tcp_ecn": "2"},
        "interfaces": {**desired.interfaces, "to-client": desired.interfaces["to-client"].model_copy(update={
            "qdiscs": [Htb(rate_bit=20_000_000, burst_bytes=30000), Pfifo(limit_packets=1000)],
            "offloads": {**desired.interfaces["to-client"].offloads, "tso": True}})}})
    diffs = readback_differences(wrong, rb)
    assert "sysctl net.ipv4.tcp_ecn: '1' != '2'" in diffs
    assert "to-client offload tso: off != on" in diffs
    assert "to-client htb class 1:1: rate 50000000 != 20000000 bit/s" in diffs
    assert "to-client htb class 1:1: burst 15000 != 30000 bytes" in diffs
    assert "to-client qdisc 2:: limit 100 != 1000 packets" in diffs
    assert len(chain) == 2


def test_tcpdump_exit_statistics():
    stderr = ("tcpdump: listening on to-client, link-type EN10MB (Ethernet), snapshot length 128 bytes\n"
              "31337 packets captured\n31340 packets received by filter\n3 packets dropped by kernel\n")
    assert parse_capture_stats(stderr) == {"captured": 31337, "received_by_filter": 31340, "dropped_by_kernel": 3}
