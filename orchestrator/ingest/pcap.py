"""Vectorised, streaming pcap / pcapng reader: TCP and UDP packets -> records.PACKET chunks.

Owns link layers (Ethernet with 802.1Q/802.1ad tags, Linux cooked SLL and SLL2, raw IP) and
IPv4/IPv6/TCP/UDP header decoding; orchestrator/ingest/pcap_format.py owns the container formats and
hands over one block of frames at a time. No Python object is made per packet: a small C loop
(orchestrator/ingest/pcap_cdecode.py) writes the rows of a block in one call, or, where it cannot be
built, every field is a numpy gather at an offset array (decode_numpy, same results). Memory is
bounded by the block size, not the file size.

Captures are taken with a small snaplen (tcpdump -s 128), so lengths always come from the IP header
(or, when that is 0 as for BIG TCP / TSO super-packets, from the original wire length), never from
the captured length. Design notes and measurements: docs/pcap-reader.md and docs/ingest.md.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.ingest import pcap_cdecode
from orchestrator.ingest.pcap_format import (
    BLOCK_BYTES,
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    SUPPORTED_LINKTYPES,
    Frames,
    PcapFormatError,
    be16,
    be32,
    iter_frames,
    u8,
)
from orchestrator.storage import records

__all__ = ["PcapFormatError", "PcapReader", "PcapStats", "SUPPORTED_LINKTYPES", "decoder_kind", "iter_pcap",
           "read_pcap", "read_pcap_with_stats"]

ETH_IPV4, ETH_IPV6, ETH_VLAN, ETH_QINQ = 0x0800, 0x86DD, 0x8100, 0x88A8
_TCP, _UDP = records.PROTO_TCP, records.PROTO_UDP

# Row status while decoding.
_OK, _OTHER, _TRUNC = 0, 1, 2


@dataclass(frozen=True)
class PcapStats:
    """What happened to every packet record. records == tcp + udp + other + truncated."""

    records: int         # packet records in the file (pcapng: EPB + SPB + obsolete PB)
    tcp: int             # decoded TCP packets
    udp: int             # decoded UDP packets
    other: int           # not TCP/UDP over IPv4/IPv6 (ARP, ICMP, IPv6 extension headers, non-first
    #                      fragments, packet blocks without timestamps)
    truncated: int       # headers cut (snaplen) before the end of the TCP/UDP header, or lengths bogus
    trailing_bytes: int  # bytes after the last complete record (capture killed mid-write)

    @property
    def packets(self) -> int:
        return self.tcp + self.udp


class PcapReader:
    """Iterate a capture as records.PACKET chunks (file order); `stats` is complete after the loop.

    `point` fills the PACKET `point` column (the capture point id within its run).
    """

    def __init__(self, path: Path, point: int = 0, block_bytes: int = BLOCK_BYTES) -> None:
        self.path, self.point, self.block_bytes = Path(path), point, block_bytes
        self.stats: PcapStats | None = None

    def __iter__(self) -> Iterator[np.ndarray]:
        counts = np.zeros(5, dtype=np.int64)  # records, tcp, udp, other, truncated
        trailing = 0
        for item in iter_frames(self.path, self.block_bytes):
            if isinstance(item, int):
                trailing = item
                continue
            out, c = decode(item, self.point)
            counts += c
            if out.size:
                yield out
        self.stats = PcapStats(*(int(v) for v in counts), trailing_bytes=trailing)


def iter_pcap(path: Path, point: int = 0, block_bytes: int = BLOCK_BYTES) -> Iterator[np.ndarray]:
    """records.PACKET chunks of a capture file, in file order, memory bounded by the block size."""
    return iter(PcapReader(path, point, block_bytes))


def read_pcap(path: Path, point: int = 0) -> np.ndarray:
    """TCP and UDP packets of a pcap/pcapng file as one records.PACKET array in file order."""
    return read_pcap_with_stats(path, point)[0]


def read_pcap_with_stats(path: Path, point: int = 0) -> tuple[np.ndarray, PcapStats]:
    """Like read_pcap, plus counts of skipped records."""
    reader = PcapReader(path, point)
    parts = list(reader)
    out = np.concatenate(parts) if parts else np.zeros(0, dtype=records.PACKET)
    assert reader.stats is not None
    return out, reader.stats


# ---------------------------------------------------------------- link, IP, TCP and UDP decoding

def _link(buf: np.ndarray, fr: Frames, status: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ethertype and L3 offset per frame; marks frames too short for their link header."""
    n = fr.data.size
    etype = np.zeros(n, dtype=np.int64)
    l3 = fr.data.copy()
    for lt in fr.linktypes:
        rows = np.flatnonzero(fr.linktype == lt) if len(fr.linktypes) > 1 else np.arange(n)
        hdr = {LINKTYPE_ETHERNET: 14, LINKTYPE_LINUX_SLL: 16, LINKTYPE_LINUX_SLL2: 20}.get(int(lt), 1)
        short = fr.caplen[rows] < hdr
        status[rows[short]] = _TRUNC
        rows = rows[~short]
        d = fr.data[rows]
        if lt == LINKTYPE_ETHERNET:
            etype[rows] = be16(buf, d + 12)
        elif lt == LINKTYPE_LINUX_SLL:
            etype[rows] = be16(buf, d + 14)
        elif lt == LINKTYPE_LINUX_SLL2:
            etype[rows] = be16(buf, d)
        else:  # raw IP: the version nibble says which
            etype[rows] = np.where(u8(buf, d) >> 4 == 6, ETH_IPV6, ETH_IPV4)
        l3[rows] = d + (0 if hdr == 1 else hdr)
    end = fr.data + fr.caplen
    for _ in range(2):  # 802.1Q, or 802.1ad + 802.1Q
        rows = np.flatnonzero((status == _OK) & ((etype == ETH_VLAN) | (etype == ETH_QINQ)))
        if not rows.size:
            break
        short = l3[rows] + 4 > end[rows]
        status[rows[short]] = _TRUNC
        rows = rows[~short]
        etype[rows] = be16(buf, l3[rows] + 2)
        l3[rows] += 4
    return etype, l3


def _tcp_timestamps(buf: np.ndarray, l4: np.ndarray, doff: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TSval/TSecr wherever the timestamp option sits among the options; -1 when absent.

    Walks the option lists of all packets in lockstep: one iteration per option position, each a
    gather over the packets still walking, so the loop count is the longest option list (~5), not n.
    """
    tsval = np.full(l4.size, -1, dtype=np.int64)
    tsecr = np.full(l4.size, -1, dtype=np.int64)
    live = np.flatnonzero(doff > 20)
    start = l4[live] + 20
    optlen = doff[live] - 20
    pos = np.zeros(live.size, dtype=np.int64)
    walking = np.arange(live.size)
    while walking.size:
        p = pos[walking]
        at = start[walking] + p
        kind = u8(buf, at)
        has_len = p + 1 < optlen[walking]
        # Read the length byte only where it is inside the option area (else it may be past the buffer).
        ln = np.zeros(walking.size, dtype=np.int64)
        ln[has_len] = u8(buf, at[has_len] + 1)
        is_ts = (kind == 8) & (ln == 10) & (p + 10 <= optlen[walking])
        hit = walking[is_ts]
        tsval[live[hit]] = be32(buf, at[is_ts] + 2)
        tsecr[live[hit]] = be32(buf, at[is_ts] + 6)
        nop = kind == 1
        p = p + np.where(nop, 1, ln)
        # Stop at EOL, at the TS option, and at a malformed length (< 2 would loop forever).
        go = (kind != 0) & ~is_ts & (nop | (ln >= 2)) & (p < optlen[walking])
        pos[walking] = p
        walking = walking[go]
    return tsval, tsecr


def _addresses(buf: np.ndarray, ip3: np.ndarray, is6: np.ndarray, v4_at: int, v6_at: int) -> np.ndarray:
    """V16 addresses: IPv4 in the first 4 bytes (rest zero), IPv6 all 16, as network-order bytes."""
    words = np.zeros((ip3.size, 4), dtype=">u4")
    a4 = np.flatnonzero(~is6)
    words[a4, 0] = be32(buf, ip3[a4] + v4_at)
    a6 = np.flatnonzero(is6)
    if a6.size:
        for k in range(4):
            words[a6, k] = be32(buf, ip3[a6] + v6_at + 4 * k)
    return words.view("V16").reshape(-1)


def decoder_kind() -> str:
    """'c' or 'numpy': which header decoder `decode` uses in this process."""
    return "c" if pcap_cdecode.available() else "numpy"


def decode(fr: Frames, point: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """records.PACKET rows of one block's TCP/UDP frames, and counts [records, tcp, udp, other, trunc]:
    the C decoder (orchestrator/ingest/pcap_cdecode.py) when it is built, else decode_numpy."""
    if pcap_cdecode.available():
        return pcap_cdecode.decode(fr, point)
    return decode_numpy(fr, point)


def decode_numpy(fr: Frames, point: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The vectorised decoder: every field a gather over the frames still alive (the fallback of the C
    decoder and its test oracle)."""
    buf = fr.buf
    status = np.zeros(fr.data.size, dtype=np.int8)
    etype, l3 = _link(buf, fr, status)
    end = fr.data + fr.caplen
    status[(status == _OK) & (etype != ETH_IPV4) & (etype != ETH_IPV6)] = _OTHER

    def cut(rows: np.ndarray, bad: np.ndarray, why: int) -> np.ndarray:
        status[rows[bad]] = why
        return rows[~bad]

    proto = np.zeros(fr.data.size, dtype=np.int64)
    v4 = np.flatnonzero((status == _OK) & (etype == ETH_IPV4))
    v4 = cut(v4, l3[v4] + 20 > end[v4], _TRUNC)
    b0 = u8(buf, l3[v4])
    v4 = cut(v4, b0 >> 4 != 4, _OTHER)
    ihl = (u8(buf, l3[v4]) & 0xF) * 4
    v4 = cut(v4, ihl < 20, _TRUNC)
    off = l3[v4]
    p4 = u8(buf, off + 9)
    v4 = cut(v4, ((p4 != _TCP) & (p4 != _UDP)) | ((be16(buf, off + 6) & 0x1FFF) != 0), _OTHER)
    proto[v4] = u8(buf, l3[v4] + 9)

    v6 = np.flatnonzero((status == _OK) & (etype == ETH_IPV6))
    v6 = cut(v6, l3[v6] + 40 > end[v6], _TRUNC)
    nh = u8(buf, l3[v6] + 6)
    v6 = cut(v6, (u8(buf, l3[v6]) >> 4 != 6) | ((nh != _TCP) & (nh != _UDP)), _OTHER)
    proto[v6] = u8(buf, l3[v6] + 6)

    iphl = np.zeros(fr.data.size, dtype=np.int64)
    iphl[v4] = (u8(buf, l3[v4]) & 0xF) * 4
    iphl[v6] = 40
    rows = np.flatnonzero(status == _OK)  # every frame left is TCP or UDP over IPv4/IPv6, in file order
    l4 = l3[rows] + iphl[rows]
    is_tcp = proto[rows] == _TCP
    rows = cut(rows, l4 + np.where(is_tcp, 20, 8) > end[rows], _TRUNC)
    l4 = l3[rows] + iphl[rows]
    is_tcp = proto[rows] == _TCP
    tcp = np.flatnonzero(is_tcp)
    hdr = np.full(rows.size, 8, dtype=np.int64)   # L4 header length: UDP 8, TCP data offset
    hdr[tcp] = (u8(buf, l4[tcp] + 12) >> 4) * 4
    bad = (is_tcp & (hdr < 20)) | (l4 + hdr > end[rows])
    rows, hdr = cut(rows, bad, _TRUNC), hdr[~bad]
    ip3 = l3[rows]
    is6 = etype[rows] == ETH_IPV6
    # IPv6 total = payload length + fixed header; a 0 length field (BIG TCP, TSO seen at the sender)
    # means "see the frame": fall back to the original wire length minus the link header.
    ip_len = np.where(is6, be16(buf, ip3 + 4) + 40, be16(buf, ip3 + 2))
    from_wire = fr.wirelen[rows] - (ip3 - fr.data[rows])
    ip_len = np.where(ip_len == np.where(is6, 40, 0), from_wire, ip_len)
    payload = ip_len - iphl[rows] - hdr
    bad = payload < 0  # IP length shorter than the headers it carries
    rows = cut(rows, bad, _TRUNC)
    ip3, is6, ip_len, payload, hdr = ip3[~bad], is6[~bad], ip_len[~bad], payload[~bad], hdr[~bad]
    l4 = ip3 + iphl[rows]
    pr = proto[rows]
    tcp = np.flatnonzero(pr == _TCP)

    out = np.zeros(rows.size, dtype=records.PACKET)
    out["ts_ns"] = fr.ts_ns[rows]
    out["point"] = point
    out["proto"] = pr
    out["ipv"] = np.where(is6, 6, 4)
    out["src_port"] = be16(buf, l4)
    out["dst_port"] = be16(buf, l4 + 2)
    lt = l4[tcp]
    out["seq"][tcp] = be32(buf, lt + 4)
    out["ack"][tcp] = be32(buf, lt + 8)
    out["tcp_flags"][tcp] = ((u8(buf, lt + 12) & 1) << 8) | u8(buf, lt + 13)
    b1 = u8(buf, ip3 + 1)
    out["ecn"] = np.where(is6, (b1 >> 4) & 3, b1 & 3)
    out["ip_len"] = ip_len
    out["payload_len"] = payload
    out["ip_id"] = np.where(is6, 0, be16(buf, ip3 + 4))
    tsval, tsecr = _tcp_timestamps(buf, lt, hdr[tcp])
    out["tsval"] = -1
    out["tsecr"] = -1
    out["tsval"][tcp], out["tsecr"][tcp] = tsval, tsecr
    out["src_addr"] = _addresses(buf, ip3, is6, 12, 8)
    out["dst_addr"] = _addresses(buf, ip3, is6, 16, 24)
    n_udp = rows.size - tcp.size
    counts = np.array([fr.data.size + fr.extra_other, tcp.size, n_udp,
                       np.count_nonzero(status == _OTHER) + fr.extra_other,
                       np.count_nonzero(status == _TRUNC)], dtype=np.int64)
    return out, counts
