"""orchestrator.ingest.pcap on scapy-written edge cases: IPv6, VLAN/QinQ, TCP option layouts, snaplen
truncation, ECN codepoints and flags, retransmissions, UDP, cooked/raw link types, byte orders, pcapng
with several interfaces (mergecap), and the streaming reader's block boundaries. Where tshark is
installed the same files are also decoded by tshark and compared field by field.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q
from scapy.packet import Raw
from test_pcap import ETH, FIX, T0, TS, assert_same_packets, tshark_packets, view, write

from orchestrator.ingest import pcap_cdecode
from orchestrator.ingest.pcap import PcapReader, decoder_kind, read_pcap, read_pcap_with_stats
from orchestrator.storage import addr

needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed: no cross-check")


@pytest.fixture(autouse=True, params=["c", "numpy"])
def decoder(request, monkeypatch):
    """Every edge case through the C header decoder and through the numpy one (its fallback)."""
    if request.param == "numpy":
        monkeypatch.setenv("TCPLAB_PCAP_DECODE", "numpy")
    pcap_cdecode._load.cache_clear()
    if decoder_kind() != request.param:
        pytest.skip("no C compiler: the C decoder cannot be built here")
    yield request.param
    pcap_cdecode._load.cache_clear()


# ---------------------------------------------------------------- synthetic edge cases (scapy)

def test_ipv6_addresses_lengths_and_traffic_class(tmp_path):
    p = ETH / IPv6(src="2001:db8::1", dst="2001:db8:0:1::abcd", tc=0xB9) / TCP(
        sport=40000, dport=5201, seq=4_000_000_000, ack=7, flags="PA", options=TS) / Raw(b"x" * 300)
    (pkt,) = read_pcap(write(tmp_path / "v6.pcap", [p], caplens={0: 128}))
    assert (view(pkt[None])["src_addr"][0], view(pkt[None])["dst_addr"][0]) == ("2001:db8::1", "2001:db8:0:1::abcd")
    assert (pkt["ipv"], pkt["proto"], pkt["src_addr"]) == (6, 6, addr.packed("2001:db8::1"))
    assert (pkt["ip_len"], pkt["payload_len"], pkt["ip_id"], pkt["ecn"]) == (40 + 32 + 300, 300, 0, 1)
    assert (pkt["seq"], pkt["ack"], pkt["tsval"], pkt["tsecr"]) == (4_000_000_000, 7, 1111, 2222)
    assert pkt["ts_ns"] == T0 * 10**9


def test_vlan_and_qinq_tags_are_skipped(tmp_path):
    inner = IP(src="10.198.9.1", dst="10.198.9.2", id=77) / TCP(sport=1, dport=2, options=TS)
    frames = [ETH / Dot1Q(vlan=5) / inner, ETH / Dot1AD(vlan=6) / Dot1Q(vlan=7) / inner, ETH / inner]
    pkts = read_pcap(write(tmp_path / "vlan.pcap", frames))
    assert pkts.size == 3
    assert (pkts["ip_id"] == 77).all() and (pkts["tsval"] == 1111).all()
    assert (pkts["src_addr"] == addr.packed("10.198.9.1")).all() and (pkts["dst_port"] == 2).all()
    assert (pkts["ipv"] == 4).all()


@pytest.mark.parametrize(("options", "tsval", "tsecr"), [
    # MSS(4) NOP SACK-permitted(2): the TS option starts at the odd offset 7.
    ([("MSS", 1460), ("NOP", None), ("SAckOK", b""), ("Timestamp", (0xFFFFFFFF, 5)), ("WScale", 7)],
     0xFFFFFFFF, 5),
    ([("SAck", (100, 200, 300, 400)), ("NOP", None), ("NOP", None), ("Timestamp", (3, 4))], 3, 4),
    ([("MSS", 1460), ("WScale", 7)], -1, -1),                 # options, no timestamp
    ([], -1, -1),                                             # no options at all
    ([("EOL", None), ("Timestamp", (9, 9))], -1, -1),         # after end-of-list: not an option
    (b"\x05\x00\x08\x0a\x00\x00\x00\x01\x00\x00\x00\x02", -1, -1),  # zero length: malformed, stop
    (b"\x08\x0a\x00\x00\x00\x01", -1, -1),                    # TS cut by the end of the header
])
def test_timestamp_option_anywhere_among_options(tmp_path, options, tsval, tsecr):
    tcp = TCP(sport=1, dport=2, flags="A")
    tcp.options = options if isinstance(options, list) else []
    hdr = bytes(tcp)
    if isinstance(options, bytes):  # raw option bytes, padded to 32-bit words with EOL
        opt = options + b"\x00" * (-len(options) % 4)
        hdr = hdr[:12] + bytes([(20 + len(opt)) // 4 << 4]) + hdr[13:20] + opt
    ip = IP(src="10.198.9.1", dst="10.198.9.2", proto=6) / Raw(hdr + b"y" * 10)
    (pkt,) = read_pcap(write(tmp_path / "opt.pcap", [ETH / ip]))
    assert (pkt["tsval"], pkt["tsecr"]) == (tsval, tsecr)
    assert pkt["payload_len"] == 10


def test_truncated_headers_are_counted_not_decoded(tmp_path):
    p = ETH / IP(src="10.198.9.1", dst="10.198.9.2") / TCP(options=TS) / Raw(b"z" * 1000)
    # cut inside Ethernet, inside IP, inside the fixed TCP header, inside the TCP options, in payload
    cuts = {0: 10, 1: 30, 2: 14 + 20 + 15, 3: 14 + 20 + 25, 4: 14 + 20 + 32 + 1}
    pkts, stats = read_pcap_with_stats(write(tmp_path / "cut.pcap", [p] * 5, caplens=cuts))
    assert (stats.records, stats.tcp, stats.truncated, stats.other) == (5, 1, 4, 0)
    assert pkts["ts_ns"][0] == T0 * 10**9 + 4 * 10**6
    assert (pkts["ip_len"][0], pkts["payload_len"][0]) == (1052, 1000)   # from the IP header


def test_non_tcp_udp_is_skipped_and_counted(tmp_path):
    frames = [
        ETH / ARP(),
        ETH / IP(src="10.198.9.1", dst="10.198.9.2", proto=1) / Raw(b"icmp"),
        ETH / IP(src="10.198.9.1", dst="10.198.9.2", proto=6, frag=185) / Raw(b"q" * 40),  # later fragment
        ETH / IPv6(src="fe80::1", dst="fe80::2", nh=0) / Raw(b"\x06\x00" + b"\x00" * 6) / TCP(),  # ext hdr
        ETH / IP(src="10.198.9.1", dst="10.198.9.2") / TCP(),
    ]
    pkts, stats = read_pcap_with_stats(write(tmp_path / "mix.pcap", frames))
    assert (stats.tcp, stats.udp, stats.other, stats.truncated) == (1, 0, 4, 0)
    assert pkts["ts_ns"][0] == T0 * 10**9 + 4 * 10**6


def test_ecn_codepoints_flags_ip_options(tmp_path):
    frames = [ETH / IP(src="10.198.9.1", dst="10.198.9.2", tos=0xB8 | ecn) / TCP(flags=f)
              for ecn, f in [(0, "S"), (1, "SEC"), (2, "AE"), (3, "AC")]]
    frames.append(ETH / IP(src="10.198.9.1", dst="10.198.9.2", options=[b"\x01\x01\x01\x00"])
                  / TCP(flags=0x1FF, options=TS) / Raw(b"w" * 5))
    pkts = read_pcap(write(tmp_path / "ecn.pcap", frames))
    assert list(pkts["ecn"]) == [0, 1, 2, 3, 0]
    assert list(pkts["tcp_flags"]) == [0x002, 0x0C2, 0x050, 0x090, 0x1FF]
    assert (pkts["ip_len"][4], pkts["payload_len"][4], pkts["tsval"][4]) == (24 + 32 + 5, 5, 1111)


def test_cooked_raw_and_byte_orders(tmp_path):
    ip = IP(src="10.198.9.1", dst="10.198.9.2", id=9) / TCP(seq=5, options=TS) / Raw(b"p" * 20)
    cases = [
        write(tmp_path / "sll.pcap", [CookedLinux(proto=0x0800) / ip], linktype=113),
        write(tmp_path / "sll2.pcap", [CookedLinuxV2(proto=0x0800) / ip], linktype=276),
        write(tmp_path / "raw.pcap", [ip], linktype=101),
        write(tmp_path / "be_us.pcap", [ETH / ip], nano=False, endianness=">"),
        write(tmp_path / "be_ns.pcap", [ETH / ip], nano=True, endianness=">"),
        write(tmp_path / "le_us.pcap", [ETH / ip], nano=False, endianness="<"),
    ]
    for path in cases:
        (pkt,) = read_pcap(path)
        assert (pkt["ts_ns"], pkt["seq"], pkt["ip_id"], pkt["payload_len"]) == (T0 * 10**9, 5, 9, 20), path


@needs_tshark
def test_synthetic_edge_cases_match_tshark(tmp_path):
    frames = [
        ETH / IPv6(src="2001:db8::5", dst="::ffff:10.198.9.9", tc=3) / TCP(flags="SEC", options=TS),
        ETH / Dot1Q(vlan=3) / IP(src="10.198.9.1", dst="10.198.9.2", tos=1) / TCP(
            options=[("MSS", 1460), ("NOP", None), ("SAckOK", b""), ("Timestamp", (12, 34))]),
        ETH / IP(src="10.198.9.1", dst="10.198.9.2", tos=3) / TCP(flags="AE") / Raw(b"r" * 99),
        ETH / IP(src="10.198.9.1", dst="10.198.9.2", tos=2) / UDP(sport=7, dport=9) / Raw(b"u" * 1200),
        ETH / IPv6(src="2001:db8::5", dst="2001:db8::6", tc=1) / UDP(sport=8, dport=10) / Raw(b"v" * 10),
        ETH / Dot1AD(vlan=6) / Dot1Q(vlan=7) / IP(src="10.198.9.3", dst="10.198.9.4", id=9) / TCP(
            sport=3, dport=4, seq=2**32 - 1, ack=2**31, flags=0x1FF, options=TS) / Raw(b"t" * 1448),
    ]
    path = write(tmp_path / "syn.pcap", frames)
    assert_same_packets(read_pcap(path), tshark_packets(path))



def test_ip_length_zero_and_bogus_lengths(tmp_path):
    tcp = TCP(sport=1, dport=2, options=TS) / Raw(b"s" * 3000)
    frames = [
        ETH / IP(src="10.198.9.1", dst="10.198.9.2", len=0) / tcp,          # TSO/BIG TCP: length 0
        ETH / IPv6(src="2001:db8::1", dst="2001:db8::2", plen=0) / tcp,     # likewise for IPv6
        ETH / IP(src="10.198.9.1", dst="10.198.9.2", len=30) / tcp,         # shorter than its headers
    ]
    pkts, stats = read_pcap_with_stats(write(tmp_path / "len.pcap", frames, caplens={0: 128, 1: 128, 2: 128}))
    assert (stats.tcp, stats.truncated) == (2, 1)
    assert pkts["ip_len"].tolist() == [20 + 32 + 3000, 40 + 32 + 3000]     # from the wire length
    assert pkts["payload_len"].tolist() == [3000, 3000]


def test_udp_ports_and_payload_from_the_ip_header(tmp_path):
    frames = [ETH / IP(src="10.198.9.1", dst="10.198.9.2", id=5, tos=1) / UDP(sport=4000, dport=5000)
              / Raw(b"d" * 1400),
              ETH / IPv6(src="2001:db8::1", dst="2001:db8::2") / UDP(sport=53, dport=5353) / Raw(b"e" * 20)]
    pkts, stats = read_pcap_with_stats(write(tmp_path / "udp.pcap", frames, caplens={0: 128}))
    assert (stats.tcp, stats.udp, stats.other, stats.truncated) == (0, 2, 0, 0)
    assert pkts["proto"].tolist() == [17, 17] and pkts["ipv"].tolist() == [4, 6]
    assert pkts["src_port"].tolist() == [4000, 53] and pkts["dst_port"].tolist() == [5000, 5353]
    assert pkts["payload_len"].tolist() == [1400, 20] and pkts["ip_len"].tolist() == [1428, 68]
    assert pkts["ip_id"].tolist() == [5, 0] and pkts["ecn"].tolist() == [1, 0]
    assert (pkts["seq"] == 0).all() and (pkts["tcp_flags"] == 0).all() and (pkts["tsval"] == -1).all()


def test_udp_cut_inside_its_header_is_truncated(tmp_path):
    p = ETH / IP(src="10.198.9.1", dst="10.198.9.2") / UDP(sport=1, dport=2) / Raw(b"x" * 50)
    _, stats = read_pcap_with_stats(write(tmp_path / "u.pcap", [p, p], caplens={0: 14 + 20 + 7}))
    assert (stats.udp, stats.truncated) == (1, 1)


def test_retransmissions_are_kept_as_separate_packets(tmp_path):
    seg = TCP(sport=40000, dport=5201, seq=1000, flags="PA", options=TS) / Raw(b"r" * 1448)
    frames = [ETH / IP(src="10.198.9.1", dst="10.198.9.2", id=i) / seg for i in (1, 2)]
    frames.append(ETH / IP(src="10.198.9.1", dst="10.198.9.2", id=1) / seg)   # exact duplicate
    pkts = read_pcap(write(tmp_path / "rtx.pcap", frames))
    assert pkts["seq"].tolist() == [1000] * 3 and pkts["ip_id"].tolist() == [1, 2, 1]
    assert np.diff(pkts["ts_ns"]).tolist() == [10**6, 10**6]


@needs_tshark
@pytest.mark.skipif(shutil.which("mergecap") is None, reason="mergecap not installed")
def test_pcapng_with_several_interfaces_matches_tshark(tmp_path):
    """mergecap of an Ethernet/ns capture and a raw-IP/µs one: a pcapng with two interfaces of different
    link type and if_tsresol, packets interleaved by time."""
    eth = [ETH / IP(src="10.198.9.1", dst="10.198.9.2", id=i, tos=i % 4) / TCP(seq=i, options=TS)
           / Raw(b"a" * i) for i in range(1, 6)]
    raw = [IPv6(src="2001:db8::1", dst="2001:db8::2") / UDP(sport=i, dport=9) / Raw(b"b" * i) for i in range(1, 4)]
    a = write(tmp_path / "a.pcap", eth)
    b = write(tmp_path / "b.pcap", raw, linktype=101, nano=False)
    merged = tmp_path / "m.pcapng"
    subprocess.run(["mergecap", "-F", "pcapng", "-w", str(merged), str(a), str(b)], check=True)
    pkts, stats = read_pcap_with_stats(merged)
    assert (stats.tcp, stats.udp) == (5, 3)
    assert_same_packets(pkts, tshark_packets(merged))


@pytest.mark.parametrize("block", [64, 100, 333, 4096])
def test_small_blocks_give_the_same_packets(block):
    """Block boundaries inside records (and records larger than the block) change nothing."""
    for name in ("eth.pcap", "eth.pcapng", "multi_if.pcapng"):
        reader = PcapReader(FIX / name, point=3, block_bytes=block)
        got = np.concatenate(list(reader))
        want, stats = read_pcap_with_stats(FIX / name, point=3)
        assert reader.stats == stats
        assert_same_packets(got, want)
        assert (got["point"] == 3).all()


def test_small_blocks_count_trailing_bytes(tmp_path):
    raw = (FIX / "eth.pcapng").read_bytes()
    (tmp_path / "cut.pcapng").write_bytes(raw[:-50])
    reader = PcapReader(tmp_path / "cut.pcapng", block_bytes=200)
    got = np.concatenate(list(reader))
    full = read_pcap(FIX / "eth.pcapng")
    assert reader.stats is not None and reader.stats.trailing_bytes > 50
    assert_same_packets(got, full[:got.size])
