"""Capture file formats, streamed: classic pcap / pcapng bytes -> batches of frame descriptors.

Owns the container formats (classic pcap with µs or ns magic in either byte order; pcapng sections,
interface blocks with per-interface if_tsresol/if_tsoffset, enhanced packet blocks). The file is read
in blocks of BLOCK_BYTES into one reusable buffer, so memory stays bounded whatever the file size:
each block is walked (pcap_walk: C loop or Python fallback) up to the last complete record, its
frames are described as parallel arrays (`Frames`) for orchestrator/ingest/pcap.py to decode, and the
incomplete tail is carried to the front of the buffer before the next read.
"""
from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from orchestrator.ingest.pcap_walk import PCAPNG_SHB, walk_pcap, walk_pcapng

BLOCK_BYTES = 4 << 20  # read size; a record larger than this grows the buffer for that record

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
SUPPORTED_LINKTYPES = frozenset({LINKTYPE_ETHERNET, LINKTYPE_RAW, LINKTYPE_LINUX_SLL,
                                 LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL2})

# classic pcap magic (as the first four bytes) -> (big endian, ns per fraction unit)
PCAP_MAGIC = {
    b"\xd4\xc3\xb2\xa1": (False, 1000), b"\xa1\xb2\xc3\xd4": (True, 1000),
    b"\x4d\x3c\xb2\xa1": (False, 1), b"\xa1\xb2\x3c\x4d": (True, 1),
}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_IDB, _SPB, _OPB, _EPB = 1, 3, 2, 6


class PcapFormatError(ValueError):
    """The file is not a capture this reader understands; says where and why."""

    def __init__(self, path: Path, offset: int, reason: str) -> None:
        super().__init__(f"{path}: byte {offset}: {reason}")
        self.path, self.offset, self.reason = path, offset, reason


@dataclass(frozen=True)
class Frames:
    """Packet records of one block as parallel arrays: where the frame bytes are, how to read them."""

    buf: np.ndarray       # uint8 block buffer the offsets point into (valid until the next block)
    data: np.ndarray      # int64 offset of the first frame byte
    caplen: np.ndarray    # int64 captured bytes
    wirelen: np.ndarray   # int64 original length
    linktype: np.ndarray  # int64
    linktypes: tuple[int, ...]  # the distinct values of linktype
    ts_ns: np.ndarray     # int64 ns since the epoch
    extra_other: int      # records that carry no decodable frame (pcapng SPB/PB)


# ---------------------------------------------------------------- byte gathers (offset arrays)
# Each multi-byte read is ONE gather from an overlapping, unaligned view of the buffer (a u16/u32
# starting at every byte, stride 1, byte order in the dtype) instead of 2-4 byte gathers and shifts.

def at_every_byte(buf: np.ndarray, dtype: str) -> np.ndarray:
    n = max(buf.size - np.dtype(dtype).itemsize + 1, 0)
    return np.ndarray((n,), dtype=dtype, buffer=buf, strides=(1,))


def u8(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return buf[at].astype(np.int64)


def be16(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return at_every_byte(buf, ">u2")[at].astype(np.int64)


def be32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return at_every_byte(buf, ">u4")[at].astype(np.int64)


def _le32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return at_every_byte(buf, "<u4")[at].astype(np.int64)


def _u32(buf: np.ndarray, at: np.ndarray, big: bool | np.ndarray) -> np.ndarray:
    """Unsigned 32-bit in file byte order; `big` may differ per element (pcapng sections)."""
    if isinstance(big, np.ndarray):
        return np.where(big, be32(buf, at), _le32(buf, at))
    return be32(buf, at) if big else _le32(buf, at)


# ---------------------------------------------------------------- the block reader

class _Blocks:
    """The file read into one reusable buffer, a block at a time, keeping an unconsumed tail."""

    def __init__(self, fh: BinaryIO, size: int, block_bytes: int) -> None:
        self.fh, self.size = fh, size
        self.buf = np.empty(block_bytes, dtype=np.uint8)
        self.n = 0          # valid bytes in buf
        self.base = 0       # file offset of buf[0]

    @property
    def at_eof(self) -> bool:
        return self.base + self.n >= self.size

    def refill(self, keep_from: int, need: int = 0) -> int:
        """Move buf[keep_from:n] to the front, grow to hold `need` bytes if asked, read to fill;
        returns the bytes read (0 only when the buffer is full of a tail that is not a record)."""
        tail = self.n - keep_from
        if need > self.buf.size:
            grown = np.empty(need, dtype=np.uint8)
            grown[:tail] = self.buf[keep_from:self.n]
            self.buf = grown
        elif keep_from:
            self.buf[:tail] = self.buf[keep_from:self.n]
        self.base += keep_from
        got = self.fh.readinto(memoryview(self.buf)[tail:])
        self.n = tail + got
        return got


def iter_frames(path: Path, block_bytes: int = BLOCK_BYTES) -> Iterator[Frames | int]:
    """Frames of every block of the file, then (last item) the count of trailing bytes after the last
    complete record (a capture killed mid-write)."""
    size = path.stat().st_size
    if size < 4:
        raise PcapFormatError(path, 0, "file too short for a capture header")
    with open(path, "rb") as fh:
        blocks = _Blocks(fh, size, max(block_bytes, 64))
        blocks.refill(0)
        magic = bytes(blocks.buf[:4])
        if magic in PCAP_MAGIC:
            yield from _pcap(path, blocks, *PCAP_MAGIC[magic])
        elif magic == PCAPNG_MAGIC:
            yield from _pcapng(path, blocks)
        else:
            raise PcapFormatError(path, 0, f"unknown magic {magic.hex()}")


def _pcap(path: Path, blocks: _Blocks, big: bool, ns_per_unit: int) -> Iterator[Frames | int]:
    if blocks.n < 24:
        raise PcapFormatError(path, 0, "truncated pcap file header")
    linktype = struct.unpack_from(">I" if big else "<I", blocks.buf, 20)[0] & 0xFFFF
    if linktype not in SUPPORTED_LINKTYPES:
        raise PcapFormatError(path, 20, f"unsupported link type {linktype}")
    pos = 24
    while True:
        buf = blocks.buf[:blocks.n]
        walk = walk_pcap(buf, pos, big)
        off = walk.offsets
        if off.size:
            ts = _u32(buf, off, big) * 1_000_000_000 + _u32(buf, off + 4, big) * ns_per_unit
            yield Frames(buf=buf, data=off + 16, caplen=_u32(buf, off + 8, big), wirelen=_u32(buf, off + 12, big),
                         linktype=np.full(off.size, linktype, dtype=np.int64), linktypes=(linktype,),
                         ts_ns=ts, extra_other=0)
        need = 0
        if walk.end + 16 <= blocks.n:  # a record header is there but its body is not
            need = 16 + int(_u32(buf, np.array([walk.end + 8]), big)[0])
            if blocks.base + walk.end + need > blocks.size:
                break                  # it claims more than the file holds: trailing garbage
        if blocks.at_eof or not blocks.refill(walk.end, need):
            break
        pos = 0
    yield blocks.size - (blocks.base + walk.end)


@dataclass
class _Interface:
    linktype: int
    tsresol: int     # if_tsresol byte: MSB clear -> 10**-v s, set -> 2**-(v & 0x7f) s
    tsoffset_s: int  # if_tsoffset, seconds added to every timestamp


def _parse_idb(path: Path, buf: np.ndarray, off: int, big: bool, file_off: int) -> _Interface:
    e = ">" if big else "<"
    total = struct.unpack_from(e + "I", buf, off + 4)[0]
    linktype = struct.unpack_from(e + "H", buf, off + 8)[0]
    if linktype not in SUPPORTED_LINKTYPES:
        raise PcapFormatError(path, file_off + off, f"unsupported link type {linktype}")
    tsresol, tsoffset = 6, 0
    p, stop = off + 16, off + total - 4
    while p + 4 <= stop:
        code, length = struct.unpack_from(e + "HH", buf, p)
        if code == 0:
            break
        if p + 4 + length > stop:
            raise PcapFormatError(path, file_off + p, "interface option runs past its block")
        if code == 9 and length == 1:
            tsresol = int(buf[p + 4])
        elif code == 14 and length == 8:
            tsoffset = struct.unpack_from(e + "q", buf, p + 4)[0]
        p += 4 + (length + 3) // 4 * 4
    return _Interface(linktype, tsresol, tsoffset)


def ticks_to_ns(ticks: np.ndarray, tsresol: int) -> np.ndarray:
    """Integer conversion of pcapng timestamp units to ns (floor), exact for 10**-v and 2**-k."""
    if tsresol & 0x80:
        k = tsresol & 0x7F
        whole = (ticks >> k) * 1_000_000_000
        return whole + (((ticks & ((1 << k) - 1)) * 1_000_000_000) >> k)
    if tsresol <= 9:
        return ticks * 10 ** (9 - tsresol)
    return ticks // 10 ** (tsresol - 9)


class _Sections:
    """Interface numbering across pcapng sections: ids restart in each section."""

    def __init__(self) -> None:
        self.ifaces: list[_Interface] = []
        self.base = 0  # global index of the current section's first interface

    def control(self, path: Path, buf: np.ndarray, off: np.ndarray, types: np.ndarray, big: np.ndarray,
                file_off: int) -> tuple[np.ndarray, np.ndarray]:
        """Apply the SHB/IDB blocks (positions in `off`) in order; returns, for each position i in
        0..len, the (section base, interface count) in force after the first i of them."""
        bases, counts = [self.base], [len(self.ifaces)]
        for o, t, b in zip(off.tolist(), types.tolist(), big.tolist(), strict=True):
            if t == PCAPNG_SHB:
                self.base = len(self.ifaces)
            else:
                self.ifaces.append(_parse_idb(path, buf, o, b, file_off))
            bases.append(self.base)
            counts.append(len(self.ifaces))
        return np.asarray(bases, dtype=np.int64), np.asarray(counts, dtype=np.int64)


def _pcapng(path: Path, blocks: _Blocks) -> Iterator[Frames | int]:
    native_big = sys.byteorder == "big"
    sections = _Sections()
    pos, swapped, first = 0, False, True
    while True:
        buf = blocks.buf[:blocks.n]
        walk = walk_pcapng(buf, pos, swapped)
        if walk.types.size:
            if first and walk.types[0] != PCAPNG_SHB:
                raise PcapFormatError(path, 0, "pcapng file does not start with a section header block")
            first = False
            yield _pcapng_frames(path, buf, walk.offsets, walk.types, walk.swapped != native_big, sections,
                                 blocks.base)
        swapped = walk.swap_end
        need = 0
        if walk.end + 12 <= blocks.n:
            e = (">" if native_big != swapped else "<") + "I"
            need = struct.unpack_from(e, buf, walk.end + 4)[0]
            if need < 12 or need & 3 or blocks.base + walk.end + need > blocks.size:
                break
        if blocks.at_eof or not blocks.refill(walk.end, need):
            break
        pos = 0
    if first:
        raise PcapFormatError(path, 0, "pcapng file does not start with a section header block")
    yield blocks.size - (blocks.base + walk.end)


def _pcapng_frames(path: Path, buf: np.ndarray, offsets: np.ndarray, types: np.ndarray, big: np.ndarray,
                   sections: _Sections, file_off: int) -> Frames:
    ctrl = np.flatnonzero((types == PCAPNG_SHB) | (types == _IDB))
    bases, counts = sections.control(path, buf, offsets[ctrl], types[ctrl], big[ctrl], file_off)
    epb = np.flatnonzero(types == _EPB)
    extra = int(np.count_nonzero((types == _SPB) | (types == _OPB)))
    seen = np.searchsorted(ctrl, epb)   # control blocks before each EPB
    off = offsets[epb]
    eb = big[epb]
    local_if = _u32(buf, off + 8, eb)
    base = bases[seen]
    bad = np.flatnonzero(local_if >= counts[seen] - base)
    if bad.size:
        raise PcapFormatError(path, file_off + int(off[bad[0]]), "packet names an undeclared interface")
    gif = base + local_if
    caplen = _u32(buf, off + 20, eb)
    bad = np.flatnonzero(caplen + 32 > _u32(buf, off + 4, eb))
    if bad.size:
        raise PcapFormatError(path, file_off + int(off[bad[0]]), "captured length exceeds its block")
    ticks = (_u32(buf, off + 12, eb) << 32) | _u32(buf, off + 16, eb)
    ts = np.empty(off.size, dtype=np.int64)
    linktype = np.empty(off.size, dtype=np.int64)
    used = np.unique(gif).tolist()
    for g in used:
        iface = sections.ifaces[g]
        m = gif == g
        ts[m] = ticks_to_ns(ticks[m], iface.tsresol) + iface.tsoffset_s * 1_000_000_000
        linktype[m] = iface.linktype
    return Frames(buf=buf, data=off + 28, caplen=caplen, wirelen=_u32(buf, off + 24, eb), linktype=linktype,
                  linktypes=tuple(sorted({sections.ifaces[g].linktype for g in used})), ts_ns=ts,
                  extra_other=extra)
