"""Vectorised pcap / pcapng reader: TCP packets of a capture file -> one records.PACKET array.

Owns file-format parsing (classic pcap with µs or ns magic in either byte order; pcapng sections,
interface blocks with per-interface if_tsresol/if_tsoffset, enhanced packet blocks), link layers
(Ethernet with 802.1Q/802.1ad tags, Linux cooked SLL and SLL2, raw IP) and IPv4/IPv6/TCP header
decoding. No Python object is made per packet: the file is memory-mapped, record offsets come from
pcap_walk (C loop or Python fallback), and every field is a numpy gather at an offset array.

Captures are taken with a small snaplen (tcpdump -s 128), so lengths always come from the IP header
(or, when that is 0 as for BIG TCP / TSO super-packets, from the original wire length), never from
the captured length. Design notes and measurements: docs/pcap-reader.md.
"""
from __future__ import annotations

import socket
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.ingest import records
from orchestrator.ingest.pcap_walk import PCAPNG_SHB, walk_pcap, walk_pcapng

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
SUPPORTED_LINKTYPES = frozenset({LINKTYPE_ETHERNET, LINKTYPE_RAW, LINKTYPE_LINUX_SLL,
                                 LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL2})

ETH_IPV4, ETH_IPV6, ETH_VLAN, ETH_QINQ = 0x0800, 0x86DD, 0x8100, 0x88A8

# classic pcap magic (as the first four bytes) -> (big endian, ns per fraction unit)
_PCAP_MAGIC = {
    b"\xd4\xc3\xb2\xa1": (False, 1000), b"\xa1\xb2\xc3\xd4": (True, 1000),
    b"\x4d\x3c\xb2\xa1": (False, 1), b"\xa1\xb2\x3c\x4d": (True, 1),
}
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_IDB, _SPB, _OPB, _EPB = 1, 3, 2, 6

# Row status while decoding.
_OK, _NON_TCP, _TRUNC = 0, 1, 2


class PcapFormatError(ValueError):
    """The file is not a capture this reader understands; says where and why."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path}: byte {offset}: {reason}")
        self.path, self.offset, self.reason = path, offset, reason


@dataclass(frozen=True)
class PcapStats:
    """What happened to every packet record. records == tcp + non_tcp + truncated."""

    records: int         # packet records in the file (pcapng: EPB + SPB + obsolete PB)
    tcp: int             # decoded into the returned array
    non_tcp: int         # not TCP over IPv4/IPv6 (ARP, ICMPv6, UDP, IPv6 extension headers,
    #                      non-first fragments, packet blocks without timestamps)
    truncated: int       # headers cut (snaplen) before the end of the TCP header, or header lengths bogus
    trailing_bytes: int  # bytes after the last complete record (capture killed mid-write)


@dataclass(frozen=True)
class _Frames:
    """Packet records as parallel arrays: where the frame bytes are and how to read them."""

    data: np.ndarray      # int64 offset of the first frame byte
    caplen: np.ndarray    # int64 captured bytes
    wirelen: np.ndarray   # int64 original length
    linktype: np.ndarray  # int64
    linktypes: tuple[int, ...]  # the distinct values of linktype
    ts_ns: np.ndarray     # int64 ns since the epoch
    extra_non_tcp: int    # records that carry no decodable frame (pcapng SPB/PB)
    trailing_bytes: int


def read_pcap(path: Path) -> np.ndarray:
    """TCP packets of a pcap/pcapng file as a records.PACKET array in file order."""
    return read_pcap_with_stats(path)[0]


def read_pcap_with_stats(path: Path) -> tuple[np.ndarray, PcapStats]:
    """Like read_pcap, plus counts of skipped records."""
    path = Path(path)
    if path.stat().st_size < 4:
        raise PcapFormatError(path, 0, "file too short for a capture header")
    # A plain ndarray view of the mapping: memmap's __getitem__ wrapper costs more than the gathers.
    buf = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
    magic = bytes(buf[:4])
    if magic in _PCAP_MAGIC:
        frames = _pcap_frames(path, buf, *_PCAP_MAGIC[magic])
    elif magic == _PCAPNG_MAGIC:
        frames = _pcapng_frames(path, buf)
    else:
        raise PcapFormatError(path, 0, f"unknown magic {magic.hex()}")
    out, non_tcp, truncated = _decode(buf, frames)
    stats = PcapStats(records=frames.data.size + frames.extra_non_tcp, tcp=out.size,
                      non_tcp=non_tcp + frames.extra_non_tcp, truncated=truncated,
                      trailing_bytes=frames.trailing_bytes)
    return out, stats


# ---------------------------------------------------------------- byte gathers (offset arrays)
# Each multi-byte read is ONE gather from an overlapping, unaligned view of the buffer (a u16/u32
# starting at every byte, stride 1, byte order in the dtype) instead of 2-4 byte gathers and shifts.

def _at_every_byte(buf: np.ndarray, dtype: str) -> np.ndarray:
    n = max(buf.size - np.dtype(dtype).itemsize + 1, 0)
    return np.ndarray((n,), dtype=dtype, buffer=buf, strides=(1,))


def _u8(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return buf[at].astype(np.int64)


def _be16(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _at_every_byte(buf, ">u2")[at].astype(np.int64)


def _be32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _at_every_byte(buf, ">u4")[at].astype(np.int64)


def _le32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return _at_every_byte(buf, "<u4")[at].astype(np.int64)


def _u32(buf: np.ndarray, at: np.ndarray, big: bool | np.ndarray) -> np.ndarray:
    """Unsigned 32-bit in file byte order; `big` may differ per element (pcapng sections)."""
    if isinstance(big, np.ndarray):
        return np.where(big, _be32(buf, at), _le32(buf, at))
    return _be32(buf, at) if big else _le32(buf, at)


# ---------------------------------------------------------------- file formats

def _pcap_frames(path: Path, buf: np.ndarray, big: bool, ns_per_unit: int) -> _Frames:
    if buf.size < 24:
        raise PcapFormatError(path, 0, "truncated pcap file header")
    linktype = struct.unpack_from(">I" if big else "<I", buf, 20)[0] & 0xFFFF
    if linktype not in SUPPORTED_LINKTYPES:
        raise PcapFormatError(path, 20, f"unsupported link type {linktype}")
    walk = walk_pcap(buf, 24, big)
    off = walk.offsets
    ts = _u32(buf, off, big) * 1_000_000_000 + _u32(buf, off + 4, big) * ns_per_unit
    return _Frames(data=off + 16, caplen=_u32(buf, off + 8, big), wirelen=_u32(buf, off + 12, big),
                   linktype=np.full(off.size, linktype, dtype=np.int64), linktypes=(linktype,), ts_ns=ts,
                   extra_non_tcp=0, trailing_bytes=buf.size - walk.end)


@dataclass(frozen=True)
class _Interface:
    linktype: int
    tsresol: int     # if_tsresol byte: MSB clear -> 10**-v s, set -> 2**-(v & 0x7f) s
    tsoffset_s: int  # if_tsoffset, seconds added to every timestamp


def _parse_idb(path: Path, buf: np.ndarray, off: int, big: bool) -> _Interface:
    e = ">" if big else "<"
    total = struct.unpack_from(e + "I", buf, off + 4)[0]
    linktype = struct.unpack_from(e + "H", buf, off + 8)[0]
    tsresol, tsoffset = 6, 0
    p, stop = off + 16, off + total - 4
    while p + 4 <= stop:
        code, length = struct.unpack_from(e + "HH", buf, p)
        if code == 0:
            break
        if p + 4 + length > stop:
            raise PcapFormatError(path, p, "interface option runs past its block")
        if code == 9 and length == 1:
            tsresol = int(buf[p + 4])
        elif code == 14 and length == 8:
            tsoffset = struct.unpack_from(e + "q", buf, p + 4)[0]
        p += 4 + (length + 3) // 4 * 4
    return _Interface(linktype, tsresol, tsoffset)


def _ticks_to_ns(ticks: np.ndarray, tsresol: int) -> np.ndarray:
    """Integer conversion of pcapng timestamp units to ns (floor), exact for 10**-v and 2**-k."""
    if tsresol & 0x80:
        k = tsresol & 0x7F
        whole = (ticks >> k) * 1_000_000_000
        return whole + (((ticks & ((1 << k) - 1)) * 1_000_000_000) >> k)
    if tsresol <= 9:
        return ticks * 10 ** (9 - tsresol)
    return ticks // 10 ** (tsresol - 9)


def _pcapng_frames(path: Path, buf: np.ndarray) -> _Frames:
    walk = walk_pcapng(buf)
    native_big = sys.byteorder == "big"
    big = walk.swapped != native_big
    if walk.types.size == 0 or walk.types[0] != PCAPNG_SHB:
        raise PcapFormatError(path, 0, "pcapng file does not start with a section header block")
    shb = np.flatnonzero(walk.types == PCAPNG_SHB)
    idb = np.flatnonzero(walk.types == _IDB)
    epb = np.flatnonzero(walk.types == _EPB)
    extra = int(np.count_nonzero((walk.types == _SPB) | (walk.types == _OPB)))
    ifaces = [_parse_idb(path, buf, int(walk.offsets[i]), bool(big[i])) for i in idb]
    for i, iface in zip(idb, ifaces, strict=True):
        if iface.linktype not in SUPPORTED_LINKTYPES:
            raise PcapFormatError(path, int(walk.offsets[i]), f"unsupported link type {iface.linktype}")
    # Interface ids restart in every section: global id = IDBs before this section + local id.
    first_idb_of_section = np.searchsorted(idb, shb)
    idbs_in_section = np.diff(np.append(first_idb_of_section, idb.size))
    off = walk.offsets[epb]
    eb = big[epb]
    section = np.searchsorted(shb, epb, side="right") - 1
    local_if = _u32(buf, off + 8, eb)
    bad = np.flatnonzero(local_if >= idbs_in_section[section])
    if bad.size:
        raise PcapFormatError(path, int(off[bad[0]]), "packet names an undeclared interface")
    gif = first_idb_of_section[section] + local_if
    caplen = _u32(buf, off + 20, eb)
    bad = np.flatnonzero(caplen + 32 > _u32(buf, off + 4, eb))
    if bad.size:
        raise PcapFormatError(path, int(off[bad[0]]), "captured length exceeds its block")
    ticks = (_u32(buf, off + 12, eb) << 32) | _u32(buf, off + 16, eb)
    ts = np.empty(off.size, dtype=np.int64)
    linktype = np.empty(off.size, dtype=np.int64)
    for g, iface in enumerate(ifaces):
        m = gif == g
        ts[m] = _ticks_to_ns(ticks[m], iface.tsresol) + iface.tsoffset_s * 1_000_000_000
        linktype[m] = iface.linktype
    return _Frames(data=off + 28, caplen=caplen, wirelen=_u32(buf, off + 24, eb), linktype=linktype,
                   linktypes=tuple(sorted({i.linktype for i in ifaces})), ts_ns=ts,
                   extra_non_tcp=extra, trailing_bytes=buf.size - walk.end)


# ---------------------------------------------------------------- link, IP and TCP decoding

def _link(buf: np.ndarray, fr: _Frames, status: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ethertype and L3 offset per frame; marks frames too short for their link header."""
    n = fr.data.size
    etype = np.zeros(n, dtype=np.int64)
    l3 = fr.data.copy()
    for lt in fr.linktypes:
        rows = np.flatnonzero(fr.linktype == lt)
        hdr = {LINKTYPE_ETHERNET: 14, LINKTYPE_LINUX_SLL: 16, LINKTYPE_LINUX_SLL2: 20}.get(int(lt), 1)
        short = fr.caplen[rows] < hdr
        status[rows[short]] = _TRUNC
        rows = rows[~short]
        d = fr.data[rows]
        if lt == LINKTYPE_ETHERNET:
            etype[rows] = _be16(buf, d + 12)
        elif lt == LINKTYPE_LINUX_SLL:
            etype[rows] = _be16(buf, d + 14)
        elif lt == LINKTYPE_LINUX_SLL2:
            etype[rows] = _be16(buf, d)
        else:  # raw IP: the version nibble says which
            etype[rows] = np.where(_u8(buf, d) >> 4 == 6, ETH_IPV6, ETH_IPV4)
        l3[rows] = d + (0 if hdr == 1 else hdr)
    end = fr.data + fr.caplen
    for _ in range(2):  # 802.1Q, or 802.1ad + 802.1Q
        rows = np.flatnonzero((status == _OK) & ((etype == ETH_VLAN) | (etype == ETH_QINQ)))
        short = l3[rows] + 4 > end[rows]
        status[rows[short]] = _TRUNC
        rows = rows[~short]
        etype[rows] = _be16(buf, l3[rows] + 2)
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
        kind = _u8(buf, at)
        has_len = p + 1 < optlen[walking]
        # Read the length byte only where it is inside the option area (else it may be past the buffer).
        ln = np.zeros(walking.size, dtype=np.int64)
        ln[has_len] = _u8(buf, at[has_len] + 1)
        is_ts = (kind == 8) & (ln == 10) & (p + 10 <= optlen[walking])
        hit = walking[is_ts]
        tsval[live[hit]] = _be32(buf, at[is_ts] + 2)
        tsecr[live[hit]] = _be32(buf, at[is_ts] + 6)
        nop = kind == 1
        p = p + np.where(nop, 1, ln)
        # Stop at EOL, at the TS option, and at a malformed length (< 2 would loop forever).
        go = (kind != 0) & ~is_ts & (nop | (ln >= 2)) & (p < optlen[walking])
        pos[walking] = p
        walking = walking[go]
    return tsval, tsecr


def _format_addresses(v4: np.ndarray, v6: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strings for IPv4 (uint32) and IPv6 (V16) addresses: each distinct address formatted once."""
    u4, code4 = _factorize(v4)
    names4 = np.array([socket.inet_ntoa(int(a).to_bytes(4, "big")) for a in u4] or [""], dtype="U45")
    u6, code6 = np.unique(v6, return_inverse=True)  # IPv6 is the rare case: plain unique is fine
    names6 = np.array([socket.inet_ntop(socket.AF_INET6, a.tobytes()) for a in u6] or [""], dtype="U45")
    return names4[code4], names6[code6.reshape(-1)]


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and each value's index among them, exact, fast when few are distinct.

    A capture holds a handful of addresses among millions of rows: take the distinct values of a
    sample, look every row up with a binary search, and add whatever the sample missed.
    """
    if values.size == 0:
        return values[:0], np.zeros(0, dtype=np.intp)
    uniq = np.unique(values[:: max(1, values.size // 4096)])
    code = np.searchsorted(uniq, values)
    missed = (code == uniq.size) | (uniq[np.minimum(code, uniq.size - 1)] != values)
    if missed.any():
        uniq = np.union1d(uniq, np.unique(values[missed]))
        code = np.searchsorted(uniq, values)
    return uniq, code


def _decode(buf: np.ndarray, fr: _Frames) -> tuple[np.ndarray, int, int]:
    """records.PACKET rows for the TCP frames, plus counts of non-TCP and truncated frames."""
    status = np.zeros(fr.data.size, dtype=np.int8)
    etype, l3 = _link(buf, fr, status)
    end = fr.data + fr.caplen
    status[(status == _OK) & (etype != ETH_IPV4) & (etype != ETH_IPV6)] = _NON_TCP

    def cut(rows: np.ndarray, bad: np.ndarray, why: int) -> np.ndarray:
        status[rows[bad]] = why
        return rows[~bad]

    v4 = np.flatnonzero((status == _OK) & (etype == ETH_IPV4))
    v4 = cut(v4, l3[v4] + 20 > end[v4], _TRUNC)
    b0 = _u8(buf, l3[v4])
    v4 = cut(v4, b0 >> 4 != 4, _NON_TCP)
    ihl = (_u8(buf, l3[v4]) & 0xF) * 4
    v4 = cut(v4, ihl < 20, _TRUNC)
    off = l3[v4]
    not_first_tcp = (_u8(buf, off + 9) != 6) | ((_be16(buf, off + 6) & 0x1FFF) != 0)
    v4 = cut(v4, not_first_tcp, _NON_TCP)

    v6 = np.flatnonzero((status == _OK) & (etype == ETH_IPV6))
    v6 = cut(v6, l3[v6] + 40 > end[v6], _TRUNC)
    v6 = cut(v6, (_u8(buf, l3[v6]) >> 4 != 6) | (_u8(buf, l3[v6] + 6) != 6), _NON_TCP)

    iphl = np.zeros(fr.data.size, dtype=np.int64)
    iphl[v4] = (_u8(buf, l3[v4]) & 0xF) * 4
    iphl[v6] = 40
    rows = np.flatnonzero(status == _OK)  # every frame left is IPv4 or IPv6 TCP, in file order
    l4 = l3[rows] + iphl[rows]
    rows = cut(rows, l4 + 20 > end[rows], _TRUNC)
    l4 = l3[rows] + iphl[rows]
    doff = (_u8(buf, l4 + 12) >> 4) * 4
    bad = (doff < 20) | (l4 + doff > end[rows])
    rows, doff = cut(rows, bad, _TRUNC), doff[~bad]
    ip3 = l3[rows]
    is6 = etype[rows] == ETH_IPV6
    # IPv6 total = payload length + fixed header; a 0 length field (BIG TCP, TSO seen at the sender)
    # means "see the frame": fall back to the original wire length minus the link header.
    ip_len = np.where(is6, _be16(buf, ip3 + 4) + 40, _be16(buf, ip3 + 2))
    from_wire = fr.wirelen[rows] - (ip3 - fr.data[rows])
    ip_len = np.where(ip_len == np.where(is6, 40, 0), from_wire, ip_len)
    payload = ip_len - iphl[rows] - doff
    bad = payload < 0  # IP length shorter than the headers it carries
    rows = cut(rows, bad, _TRUNC)
    ip3, is6, ip_len, payload, doff = ip3[~bad], is6[~bad], ip_len[~bad], payload[~bad], doff[~bad]
    l4 = ip3 + iphl[rows]

    out = np.zeros(rows.size, dtype=records.PACKET)
    out["ts_ns"] = fr.ts_ns[rows]
    out["src_port"] = _be16(buf, l4)
    out["dst_port"] = _be16(buf, l4 + 2)
    out["seq"] = _be32(buf, l4 + 4)
    out["ack"] = _be32(buf, l4 + 8)
    out["tcp_flags"] = ((_u8(buf, l4 + 12) & 1) << 8) | _u8(buf, l4 + 13)
    b1 = _u8(buf, ip3 + 1)
    out["ecn"] = np.where(is6, (b1 >> 4) & 3, b1 & 3)
    out["ip_len"] = ip_len
    out["payload_len"] = payload
    out["ip_id"] = np.where(is6, 0, _be16(buf, ip3 + 4))
    out["tsval"], out["tsecr"] = _tcp_timestamps(buf, l4, doff)

    a4 = np.flatnonzero(~is6)
    a6 = np.flatnonzero(is6)
    src4, dst4 = _be32(buf, ip3[a4] + 12), _be32(buf, ip3[a4] + 16)
    span = np.arange(16)
    src6 = np.ascontiguousarray(buf[ip3[a6, None] + 8 + span]).view("V16").reshape(-1)
    dst6 = np.ascontiguousarray(buf[ip3[a6, None] + 24 + span]).view("V16").reshape(-1)
    names4, names6 = _format_addresses(np.concatenate([src4, dst4]), np.concatenate([src6, dst6]))
    out["src_addr"][a4], out["dst_addr"][a4] = names4[:a4.size], names4[a4.size:]
    out["src_addr"][a6], out["dst_addr"][a6] = names6[:a6.size], names6[a6.size:]
    return out, int(np.count_nonzero(status == _NON_TCP)), int(np.count_nonzero(status == _TRUNC))
