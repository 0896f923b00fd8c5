"""orchestrator.ingest.tcp_probe on real tracefs output (tests/fixtures/ingest/capture_fixtures.sh).

tcp_probe_trace.txt: a private instance, trace_clock=mono, filter on port 5299, during the 1 s iperf3
whose packets are in eth.pcap; clock_offset_ns.txt: CLOCK_REALTIME - CLOCK_MONOTONIC measured then.
tcp_probe_trace_v6_small_buffer.txt: IPv6 link-local run (port 5298) with an 8 KiB buffer that wrapped.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.ingest.pcap import read_pcap
from orchestrator.ingest.tcp_probe import TcpProbeFormatError, parse_tcp_probe, parse_tcp_probe_with_stats
from orchestrator.storage import addr

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"
TRACE = (FIX / "tcp_probe_trace.txt").read_text()
TRACE_V6 = (FIX / "tcp_probe_trace_v6_small_buffer.txt").read_text()
OFFSET = int((FIX / "clock_offset_ns.txt").read_text())


def test_every_event_parsed_and_header_agrees():
    probes, stats = parse_tcp_probe_with_stats(TRACE, OFFSET)
    assert probes.size == stats.events == TRACE.count(": tcp_probe: ") == 664
    assert (stats.entries_in_buffer, stats.entries_written, stats.overwritten) == (664, 664, 0)


def test_first_events_literal_values():
    probes = parse_tcp_probe(TRACE, 0)
    # 565.382055: family=AF_INET6 src=[::ffff:10.198.1.2]:5299 dest=[::ffff:10.198.1.1]:40060 mark=0x0
    # data_len=37 snd_nxt=0xb67764d4 snd_una=0xb67764d4 snd_cwnd=10 ssthresh=2147483647 snd_wnd=64512
    # srtt=57 rcv_wnd=65160 sock_cookie=1005
    assert probes[0].tolist() == (
        565_382_055_000, "10.198.1.2", 5299, "10.198.1.1", 40060, 10, 2147483647, 57, 64512, 65160,
        0xB67764D4, 0xB67764D4, 37, 0x1005)
    # 565.382074: family=AF_INET src=10.198.1.1:40060 dest=10.198.1.2:5299 … snd_nxt=0x63c8aadf
    # snd_una=0x63c8aaba … srtt=46 … sock_cookie=1006
    p = probes[1]
    assert (p["ts_ns"], p["saddr"], p["sport"], p["snd_nxt"], p["snd_una"], p["srtt_us"], p["sock_cookie"]) == (
        565_382_074_000, "10.198.1.1", 40060, 0x63C8AADF, 0x63C8AABA, 46, 0x1006)


def test_dual_stack_sockets_map_to_dotted_ipv4():
    probes = parse_tcp_probe(TRACE, 0)
    assert TRACE.count("[::ffff:") > 600                    # the server's AF_INET6 listener
    assert set(probes["saddr"]) | set(probes["daddr"]) == {"10.198.1.1", "10.198.1.2"}


def test_clock_offset_is_added_exactly():
    a, b = parse_tcp_probe(TRACE, 0), parse_tcp_probe(TRACE, OFFSET)
    np.testing.assert_array_equal(b["ts_ns"] - a["ts_ns"], OFFSET)
    assert (a["ts_ns"] % 1000 == 0).all()                   # mono prints µs: no float residue


def test_probe_state_agrees_with_the_capture_of_the_same_run():
    """snd_una is a cumulative ACK the socket received, snd_nxt the end of a segment it sent, and each
    event follows (by at most 1 ms, given µs truncation) a packet that arrived on its connection."""
    probes = parse_tcp_probe(TRACE, OFFSET)
    pkts = read_pcap(FIX / "eth.pcap")
    end_seq = (pkts["seq"] + pkts["payload_len"] + ((pkts["tcp_flags"] & 0x03) != 0)) % 2**32
    for (saddr, sport, daddr, dport), ev in _by_connection(probes).items():
        s, d = addr.packed(saddr), addr.packed(daddr)
        inbound = pkts[(pkts["src_addr"] == d) & (pkts["src_port"] == dport)
                       & (pkts["dst_addr"] == s) & (pkts["dst_port"] == sport)]
        outbound = (pkts["src_addr"] == s) & (pkts["src_port"] == sport) & (pkts["dst_port"] == dport)
        assert np.isin(ev["snd_una"], inbound["ack"]).all()
        assert np.isin(ev["snd_nxt"], end_seq[outbound]).all()
        last = np.searchsorted(inbound["ts_ns"], ev["ts_ns"] + 1000, side="right") - 1
        assert (last >= 0).all()
        assert (ev["ts_ns"] - inbound["ts_ns"][last] < 1_000_000).all()


def _by_connection(probes: np.ndarray) -> dict[tuple[str, int, str, int], np.ndarray]:
    keys = {(str(p["saddr"]), int(p["sport"]), str(p["daddr"]), int(p["dport"])) for p in probes}
    return {k: probes[(probes["saddr"] == k[0]) & (probes["sport"] == k[1]) & (probes["daddr"] == k[2])
                      & (probes["dport"] == k[3])] for k in keys}


def test_ipv6_addresses_and_wrapped_buffer():
    probes, stats = parse_tcp_probe_with_stats(TRACE_V6, 0)
    assert (stats.events, stats.entries_in_buffer, stats.entries_written, stats.overwritten) == (71, 71, 267, 196)
    assert set(probes["saddr"]) == {"fe80::acee:8ff:fef7:6bc5", "fe80::2858:cbff:fef3:a1bb"}
    assert probes[0]["data_len"] == 1428 and probes[0]["rcv_wnd"] == 379904
    pkts = read_pcap(FIX / "v6.pcap")
    # same strings as the conn table
    assert set(probes["saddr"]) == set(addr.format_column(pkts["ipv"], pkts["src_addr"]))


def test_empty_and_non_event_lines():
    header = TRACE.split("\n", 12)[:12]
    probes, stats = parse_tcp_probe_with_stats("\n".join(header) + "\n", 0)
    assert probes.size == 0 and probes.dtype.names[0] == "ts_ns" and stats.entries_in_buffer == 664
    probes, stats = parse_tcp_probe_with_stats("", 0)
    assert probes.size == 0 and stats.entries_in_buffer is None and stats.overwritten == 0


def test_unparseable_event_names_its_line():
    lines = TRACE.splitlines()
    lines[20] = lines[20].replace(" srtt=", " srtt_us=")   # a field renamed by some future kernel
    with pytest.raises(TcpProbeFormatError, match="line 21"):
        parse_tcp_probe("\n".join(lines), 0)


@pytest.mark.parametrize("change", [
    (" snd_nxt=0x", " snd_nxt=0xzz"),            # not hex
    (" data_len=", " data_len=-"),              # not a number
    (" mark=0x0 data_len=", " data_len="),     # a field missing: the rest shift
    (": tcp_probe: ", ": tcp_probe: junk "),    # something before family=
])
def test_malformed_field_names_its_line(change):
    lines = TRACE.splitlines()
    lines[30] = lines[30].replace(*change, 1)
    with pytest.raises(TcpProbeFormatError, match="line 31"):
        parse_tcp_probe("\n".join(lines), 0)


def test_hex_and_timestamps_parsed_exactly_beyond_32_bits():
    """The columnar parser against Python's int() on every value, and a line with a wider fraction and a
    full 64-bit cookie, written as some kernels print them (uppercase hex, no 0x on the cookie)."""
    lines = TRACE.splitlines()
    ev = next(i for i, line in enumerate(lines) if ": tcp_probe: " in line)
    line = lines[ev]
    stamp = line.split(": tcp_probe: ")[0].rsplit(" ", 1)[1]
    sec = stamp.split(".")[0]
    lines[ev] = line.replace(stamp, f"{sec}.123456789").split("sock_cookie=")[0] + "sock_cookie=FFFFFFFFFFFFFFFE"
    probes = parse_tcp_probe("\n".join(lines), 0)
    first = probes[0]
    assert first["ts_ns"] == int(sec) * 1_000_000_000 + 123_456_789
    assert int(np.int64(first["sock_cookie"]).view(np.uint64)) == 0xFFFFFFFFFFFFFFFE
    # every other event: the same values Python's own parsing gives
    import re
    for probe, text in zip(probes[1:6], [x for x in lines[ev + 1:] if ": tcp_probe: " in x][:5], strict=True):
        assert probe["snd_nxt"] == int(re.search(r"snd_nxt=0x([0-9a-f]+)", text).group(1), 16)
        assert probe["snd_cwnd"] == int(re.search(r"snd_cwnd=(\d+)", text).group(1))
