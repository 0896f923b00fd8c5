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
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Packet
from scapy.utils import PcapWriter

from orchestrator.ingest import pcap_walk
from orchestrator.ingest.pcap import PcapFormatError, read_pcap, read_pcap_with_stats
from orchestrator.storage import addr, records

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
    "udp.srcport", "udp.dstport", "udp.length",
]
# Every PACKET field, with addresses as text: what both decoders are compared on.
VIEW = np.dtype([(n, "U45" if n in ("src_addr", "dst_addr") else t)
                 for n, (t, _) in records.PACKET.fields.items()])


def view(pkts: np.ndarray) -> np.ndarray:
    """A PACKET array with its addresses formatted, comparable with tshark's text output."""
    out = np.zeros(pkts.size, VIEW)
    for name in records.PACKET.names:
        if name in ("src_addr", "dst_addr"):
            out[name] = addr.format_column(pkts["ipv"], pkts[name]).astype("U45")
        else:
            out[name] = pkts[name]
    return out


def tshark_packets(path: Path, point: int = 0) -> np.ndarray:
    """The same PACKET columns, decoded by tshark (Wireshark's dissectors) instead of our reader."""
    argv = ["tshark", "-r", str(path), "-n", "-Y", "(tcp or udp) and not icmp and not icmpv6",
            "-T", "fields", "-E", "occurrence=f"]
    for f in TSHARK_FIELDS:
        argv += ["-e", f]
    lines = subprocess.run(argv, check=True, capture_output=True, text=True).stdout.splitlines()
    out = np.zeros(len(lines), dtype=VIEW)
    for i, line in enumerate(lines):
        (t, s4, d4, s6, d6, sp, dp, seq, ack, tlen, iplen, plen, flags, ecn4, tclass, ipid,
         tsval, tsecr, usp, udp_, ulen) = line.split("\t")
        sec, frac = t.split(".")
        six = bool(s6)
        udp = bool(usp)
        ip_len = int(plen) + 40 if six else int(iplen)
        out[i] = (int(sec) * 10**9 + int(frac.ljust(9, "0")),
                  s6 if six else s4, d6 if six else d4,
                  0 if udp else int(seq), 0 if udp else int(ack),
                  -1 if udp or not tsval else int(tsval), -1 if udp or not tsecr else int(tsecr),
                  int(usp if udp else sp), int(udp_ if udp else dp),
                  int(ulen) - 8 if udp else int(tlen), ip_len, 0 if six else int(ipid, 16),
                  0 if udp else int(flags, 16), int(tclass, 16) & 3 if six else int(ecn4),
                  point, 17 if udp else 6, 6 if six else 4)
    return out


def assert_same_packets(got: np.ndarray, want: np.ndarray) -> None:
    """Packet by packet, field by field (PACKET arrays or their text views)."""
    got = view(got) if got.dtype == records.PACKET else got
    want = view(want) if want.dtype == records.PACKET else want
    assert got.size == want.size
    for name in VIEW.names:
        bad = np.flatnonzero(got[name] != want[name])
        assert bad.size == 0, f"{name} differs at packet {bad[:5]}: {got[name][bad[:5]]} vs {want[name][bad[:5]]}"


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
    assert stats.records == stats.tcp + stats.udp + stats.other + stats.truncated
    assert (stats.tcp, stats.other, stats.truncated, stats.trailing_bytes, stats.udp) == (*COUNTS[name], 0, 0, 0)
    assert pkts.size == stats.tcp
    ref = read_pcap(FIX / SAME_PACKETS_AS.get(name, "eth.pcap"))
    # Same packets as the Ethernet capture (another tcpdump handle may order simultaneous ones apart).
    same = ["src_addr", "dst_addr", "src_port", "dst_port", "seq", "ack", "payload_len", "tsval"]
    np.testing.assert_array_equal(np.sort(repack_fields(view(pkts)[same])), np.sort(repack_fields(view(ref)[same])))


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


