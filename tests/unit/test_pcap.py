"""orchestrator.ingest.pcap: real tcpdump/editcap/mergecap captures checked field by field against
tshark, and scapy-written edge cases (IPv6, VLAN, option layouts, truncation, ECN, flags, byte order).

Fixtures come from tests/fixtures/ingest/capture_fixtures.sh (1 s iperf3, cubic, 8 Mbit/s, offloads
off, ECN on): eth.pcap (Ethernet, ns), sll2.pcap (-i any, SLL2, ns),
sll_us.pcap (SLL, µs), eth.pcapng (editcap -F pcapng), multi_if.pcapng (mergecap of Ethernet/ns and
SLL/µs: two interfaces with different link types and if_tsresol), v6.pcap (a short iperf3 over the
veths' IPv6 link-local addresses).
"""
from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from numpy.lib.recfunctions import repack_fields
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q, Ether
from scapy.packet import Packet, Raw
from scapy.utils import PcapWriter

from orchestrator.ingest import pcap_walk, records
from orchestrator.ingest.pcap import PcapFormatError, read_pcap, read_pcap_with_stats

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ingest"
REAL = ["eth.pcap", "sll2.pcap", "sll_us.pcap", "eth.pcapng", "multi_if.pcapng", "v6.pcap"]
# (tcp, non-TCP) per capture, as counted by `tshark -q -z io,phs`: the non-TCP frames are ICMPv6
# router/neighbour solicitations and ARP.
COUNTS = {"eth.pcap": (972, 13), "sll2.pcap": (972, 13), "sll_us.pcap": (972, 13), "eth.pcapng": (972, 13),
          "multi_if.pcapng": (288, 12), "v6.pcap": (436, 2)}
SAME_PACKETS_AS = {"multi_if.pcapng": "multi_if.pcapng", "v6.pcap": "v6.pcap"}
T0 = 1_700_000_000

TSHARK_FIELDS = [
    "frame.time_epoch", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "tcp.srcport", "tcp.dstport",
    "tcp.seq_raw", "tcp.ack_raw", "tcp.len", "ip.len", "ipv6.plen", "tcp.flags", "ip.dsfield.ecn",
    "ipv6.tclass", "ip.id", "tcp.options.timestamp.tsval", "tcp.options.timestamp.tsecr",
]


def tshark_packets(path: Path) -> np.ndarray:
    """The same PACKET columns, decoded by tshark (Wireshark's dissectors) instead of our reader."""
    argv = ["tshark", "-r", str(path), "-Y", "tcp", "-T", "fields", "-E", "occurrence=f"]
    for f in TSHARK_FIELDS:
        argv += ["-e", f]
    lines = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.splitlines()
    out = np.zeros(len(lines), dtype=records.PACKET)
    for i, line in enumerate(lines):
        (t, s4, d4, s6, d6, sp, dp, seq, ack, tlen, iplen, plen, flags, ecn4, tclass, ipid,
         tsval, tsecr) = line.split("\t")
        sec, frac = t.split(".")
        six = bool(s6)
        out[i] = (int(sec) * 10**9 + int(frac.ljust(9, "0")),
                  s6 if six else s4, d6 if six else d4, int(sp), int(dp), int(seq), int(ack),
                  int(tlen), int(plen) + 40 if six else int(iplen), int(flags, 16),
                  int(tclass, 16) & 3 if six else int(ecn4), 0 if six else int(ipid, 16),
                  int(tsval) if tsval else -1, int(tsecr) if tsecr else -1)
    return out


def assert_same_packets(got: np.ndarray, want: np.ndarray) -> None:
    assert got.size == want.size
    for name in records.PACKET.names:
        bad = np.flatnonzero(got[name] != want[name])
        assert bad.size == 0, f"{name} differs at packet {bad[:5]}: {got[name][bad[:5]]} vs {want[name][bad[:5]]}"


@pytest.fixture(params=["c", "python"])
def walker(request, monkeypatch):
    """Run a test with the compiled C record walker and with the pure-Python fallback."""
    if request.param == "python":
        monkeypatch.setenv("TCPLAB_PCAP_WALK", "python")
    pcap_walk._load_c.cache_clear()
    if pcap_walk.walker_kind() != request.param:
        pytest.skip("no C compiler: the C record walker cannot be built here")
    yield request.param
    pcap_walk._load_c.cache_clear()


# ---------------------------------------------------------------- real captures

@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed: no cross-check decoder")
@pytest.mark.parametrize("name", REAL)
def test_real_capture_matches_tshark_field_by_field(name):
    assert_same_packets(read_pcap(FIX / name), tshark_packets(FIX / name))


@pytest.mark.parametrize("name", REAL)
def test_real_capture_stats_and_walkers_agree(name, walker):
    pkts, stats = read_pcap_with_stats(FIX / name)
    assert stats.records == stats.tcp + stats.non_tcp + stats.truncated
    assert (stats.tcp, stats.non_tcp, stats.truncated, stats.trailing_bytes) == (*COUNTS[name], 0, 0)
    assert pkts.size == stats.tcp
    ref = read_pcap(FIX / SAME_PACKETS_AS.get(name, "eth.pcap"))
    # Same packets as the Ethernet capture (another tcpdump handle may order simultaneous ones apart).
    same = ["src_addr", "dst_addr", "src_port", "dst_port", "seq", "ack", "payload_len", "tsval"]
    np.testing.assert_array_equal(np.sort(repack_fields(pkts[same])), np.sort(repack_fields(ref[same])))


def test_real_capture_content_is_plausible():
    pkts = read_pcap(FIX / "eth.pcap")
    data = pkts[pkts["payload_len"] > 0]
    assert set(data["payload_len"]) <= set(range(1, 1449))
    assert (data["ip_len"] == data["payload_len"] + 52).all()   # 20 IP + 20 TCP + 12 NOP,NOP,TS
    assert np.isin(data["ecn"], [2]).all()                     # ECT(0): tcp_ecn=1 negotiated
    syn = pkts[(pkts["tcp_flags"] & 0x02) != 0]
    assert syn.size == 4 and set(syn["tcp_flags"]) == {0x0C2, 0x052}   # SYN+ECE+CWR, SYN+ACK+ECE
    assert (pkts["tsval"] >= 0).all() and (np.diff(pkts["ts_ns"]) >= 0).all()


def test_microsecond_capture_is_the_nanosecond_one_floored_within_jitter():
    ns, us = read_pcap(FIX / "eth.pcap"), read_pcap(FIX / "sll_us.pcap")
    assert (us["ts_ns"] % 1000 == 0).all() and not (ns["ts_ns"] % 1000 == 0).all()
    # Two tcpdump handles stamp the same packets a few µs apart.
    assert np.abs(us["ts_ns"] - ns["ts_ns"]).max() < 200_000


def test_cut_off_capture_counts_trailing_bytes(tmp_path):
    raw = (FIX / "eth.pcap").read_bytes()
    (tmp_path / "cut.pcap").write_bytes(raw[:-10])
    pkts, stats = read_pcap_with_stats(tmp_path / "cut.pcap")
    full, full_stats = read_pcap_with_stats(FIX / "eth.pcap")
    assert stats.records == full_stats.records - 1
    assert stats.trailing_bytes == len(raw) - 10 - _last(raw) > 0
    assert_same_packets(pkts, full[:stats.tcp])


def _last(raw: bytes) -> int:
    """Offset of the last record header of a little-endian pcap."""
    p = 24
    last = p
    while p < len(raw):
        last = p
        p += 16 + struct.unpack_from("<I", raw, p + 8)[0]
    return last


def test_walker_chunking_gives_the_same_offsets(walker, monkeypatch):
    monkeypatch.setattr(pcap_walk, "CHUNK", 7)
    a = read_pcap(FIX / "eth.pcapng")
    monkeypatch.undo()
    assert_same_packets(a, read_pcap(FIX / "eth.pcap"))


# ---------------------------------------------------------------- synthetic edge cases (scapy)

def write(path: Path, frames: list[bytes | Packet], linktype: int = 1, nano: bool = True,
          endianness: str = "", caplens: dict[int, int] | None = None) -> Path:
    """A pcap of `frames`, packet i at T0 + i ms; caplens cut frame i to that many bytes."""
    with PcapWriter(str(path), linktype=linktype, nano=nano, endianness=endianness) as w:
        w.write_header(None)  # write_packet (raw bytes, exact caplen) does not write it
        for i, f in enumerate(frames):
            b = bytes(f)
            cut = (caplens or {}).get(i, len(b))
            w.write_packet(b[:cut], sec=T0, usec=i * (1_000_000 if nano else 1000), wirelen=len(b))
    return path


ETH = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
TS = [("NOP", None), ("NOP", None), ("Timestamp", (1111, 2222))]


def test_ipv6_addresses_lengths_and_traffic_class(tmp_path):
    p = ETH / IPv6(src="2001:db8::1", dst="2001:db8:0:1::abcd", tc=0xB9) / TCP(
        sport=40000, dport=5201, seq=4_000_000_000, ack=7, flags="PA", options=TS) / Raw(b"x" * 300)
    (pkt,) = read_pcap(write(tmp_path / "v6.pcap", [p], caplens={0: 128}))
    assert (pkt["src_addr"], pkt["dst_addr"]) == ("2001:db8::1", "2001:db8:0:1::abcd")
    assert (pkt["ip_len"], pkt["payload_len"], pkt["ip_id"], pkt["ecn"]) == (40 + 32 + 300, 300, 0, 1)
    assert (pkt["seq"], pkt["ack"], pkt["tsval"], pkt["tsecr"]) == (4_000_000_000, 7, 1111, 2222)
    assert pkt["ts_ns"] == T0 * 10**9


def test_vlan_and_qinq_tags_are_skipped(tmp_path):
    inner = IP(src="10.198.9.1", dst="10.198.9.2", id=77) / TCP(sport=1, dport=2, options=TS)
    frames = [ETH / Dot1Q(vlan=5) / inner, ETH / Dot1AD(vlan=6) / Dot1Q(vlan=7) / inner, ETH / inner]
    pkts = read_pcap(write(tmp_path / "vlan.pcap", frames))
    assert pkts.size == 3
    assert (pkts["ip_id"] == 77).all() and (pkts["tsval"] == 1111).all()
    assert (pkts["src_addr"] == "10.198.9.1").all() and (pkts["dst_port"] == 2).all()


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
    assert (stats.records, stats.tcp, stats.truncated, stats.non_tcp) == (5, 1, 4, 0)
    assert pkts["ts_ns"][0] == T0 * 10**9 + 4 * 10**6
    assert (pkts["ip_len"][0], pkts["payload_len"][0]) == (1052, 1000)   # from the IP header


def test_non_tcp_is_skipped_and_counted(tmp_path):
    frames = [
        ETH / ARP(),
        ETH / IP(src="10.198.9.1", dst="10.198.9.2") / UDP(sport=1, dport=2),
        ETH / IP(src="10.198.9.1", dst="10.198.9.2", proto=6, frag=185) / Raw(b"q" * 40),  # later fragment
        ETH / IPv6(src="fe80::1", dst="fe80::2", nh=0) / Raw(b"\x06\x00" + b"\x00" * 6) / TCP(),  # ext hdr
        ETH / IP(src="10.198.9.1", dst="10.198.9.2") / TCP(),
    ]
    pkts, stats = read_pcap_with_stats(write(tmp_path / "mix.pcap", frames))
    assert (stats.tcp, stats.non_tcp, stats.truncated) == (1, 4, 0)
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


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed: no cross-check decoder")
def test_synthetic_edge_cases_match_tshark(tmp_path):
    frames = [
        ETH / IPv6(src="2001:db8::5", dst="::ffff:10.198.9.9", tc=3) / TCP(flags="SEC", options=TS),
        ETH / Dot1Q(vlan=3) / IP(src="10.198.9.1", dst="10.198.9.2", tos=1) / TCP(
            options=[("MSS", 1460), ("NOP", None), ("SAckOK", b""), ("Timestamp", (12, 34))]),
        ETH / IP(src="10.198.9.1", dst="10.198.9.2", tos=3) / TCP(flags="AE") / Raw(b"r" * 99),
    ]
    path = write(tmp_path / "syn.pcap", frames)
    assert_same_packets(read_pcap(path), tshark_packets(path))


# ---------------------------------------------------------------- hand-built pcapng (struct)

def _block(e: str, btype: int, body: bytes) -> bytes:
    body += b"\x00" * (-len(body) % 4)
    return struct.pack(e + "II", btype, len(body) + 12) + body + struct.pack(e + "I", len(body) + 12)


def _pcapng(e: str, tsresol: int, ticks: int, frame: bytes, tsoffset: int = 0) -> bytes:
    shb = _block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1))
    opts = struct.pack(e + "HHB3x", 9, 1, tsresol)
    if tsoffset:
        opts += struct.pack(e + "HHq", 14, 8, tsoffset)
    idb = _block(e, 1, struct.pack(e + "HHI", 1, 0, 128) + opts + struct.pack(e + "HH", 0, 0))
    epb = _block(e, 6, struct.pack(e + "IIIII", 0, ticks >> 32, ticks & 0xFFFFFFFF, len(frame), len(frame))
                 + frame)
    return shb + idb + epb


@pytest.mark.parametrize(("e", "tsresol", "ticks", "tsoffset", "want_ns"), [
    (">", 9, T0 * 10**9 + 123, 0, T0 * 10**9 + 123),                 # big-endian section, ns
    ("<", 6, T0 * 10**6 + 5, 0, T0 * 10**9 + 5000),                  # default µs
    ("<", 0x80 | 20, (T0 << 20) + (1 << 19), 0, T0 * 10**9 + 500_000_000),  # 2**-20 s units
    (">", 12, 5 * 10**12 + 7_000_999, 0, 5 * 10**9 + 7000),          # ps, floored to ns
    ("<", 9, 42, T0, T0 * 10**9 + 42),                               # if_tsoffset seconds
])
def test_pcapng_byte_order_and_timestamp_resolution(tmp_path, walker, e, tsresol, ticks, tsoffset, want_ns):
    frame = bytes(ETH / IP(src="10.198.9.1", dst="10.198.9.2") / TCP(options=TS))
    path = tmp_path / "x.pcapng"
    # Two sections of opposite byte order: the second restarts interface numbering.
    other = "<" if e == ">" else ">"
    path.write_bytes(_pcapng(e, tsresol, ticks, frame, tsoffset) + _pcapng(other, 9, 1, frame))
    pkts = read_pcap(path)
    assert list(pkts["ts_ns"]) == [want_ns, 1]
    assert (pkts["tsval"] == 1111).all()


def test_format_errors_say_where(tmp_path):
    (tmp_path / "junk").write_bytes(b"hello world, not a capture")
    with pytest.raises(PcapFormatError, match="byte 0: unknown magic"):
        read_pcap(tmp_path / "junk")
    path = write(tmp_path / "usb.pcap", [b"\x00" * 64], linktype=189)
    with pytest.raises(PcapFormatError, match="byte 20: unsupported link type 189"):
        read_pcap(path)
    empty = write(tmp_path / "empty.pcap", [])
    pkts, stats = read_pcap_with_stats(empty)
    assert pkts.size == 0 and stats.records == 0


def test_address_factorize_finds_values_the_sample_missed():
    from orchestrator.ingest.pcap import _factorize
    values = np.repeat(np.array([9, 5], dtype=np.int64), 50_000)
    values[12_345] = 7          # between the sampled rows: only the fallback can find it
    values[-1] = 11
    uniq, code = _factorize(values)
    assert uniq.tolist() == [5, 7, 9, 11]
    np.testing.assert_array_equal(uniq[code], values)
    uniq, code = _factorize(values[:0])
    assert uniq.size == 0 and code.size == 0


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
