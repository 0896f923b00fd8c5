"""Record-offset walk over pcap / pcapng bytes: the one inherently sequential step of pcap reading.

Each record's length decides where the next one starts, so finding record offsets cannot be done
with array operations. This module owns that walk and nothing else: it returns int64 offset arrays
that orchestrator/ingest/pcap.py then decodes with vectorised gathers.

Two implementations with identical results:
- a ~30-line C loop compiled with the system `cc`/`gcc` on first use (orchestrator/ingest/cbuild.py:
  cached under $XDG_CACHE_HOME/tcplab, keyed by the hash of its source), loaded with ctypes;
- a pure-Python loop over `struct.unpack_from`, used when no compiler is available, the build fails,
  or TCPLAB_PCAP_WALK=python is set (tests run both and compare).
The reasons for this split are in docs/pcap-reader.md.
"""
from __future__ import annotations

import ctypes
import os
import struct
import sys
from dataclasses import dataclass
from functools import cache

import numpy as np

from orchestrator.ingest import cbuild

# Records per C call: bounds the output buffers (8 MiB of offsets) while keeping call overhead nil.
CHUNK = 1 << 20

PCAPNG_SHB = 0x0A0D0D0A
_BOM = 0x1A2B3C4D          # pcapng byte-order magic as read in the writer's byte order
_BOM_SWAPPED = 0x4D3C2B1A  # ... as read in the other byte order

_C_SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline uint32_t rd32(const uint8_t *p, int swap) {
    uint32_t v;
    memcpy(&v, p, 4);
    return swap ? __builtin_bswap32(v) : v;
}

/* Classic pcap: offsets of record headers from *pos on, at most cap of them.
   Stops before a record that does not fit in len bytes; *pos is left at the first unread byte. */
int64_t tcplab_walk_pcap(const uint8_t *buf, int64_t len, int64_t *pos, int swap,
                         int64_t *out, int64_t cap) {
    int64_t p = *pos, n = 0;
    while (n < cap && p + 16 <= len) {
        int64_t incl = rd32(buf + p + 8, swap);
        if (p + 16 + incl > len) break;
        out[n++] = p;
        p += 16 + incl;
    }
    *pos = p;
    return n;
}

/* pcapng: offset, type and byte order of every block from *pos on, at most cap of them.
   A section header block switches the byte order (read from its byte-order magic).
   Stops at a malformed or incomplete block; *pos and *swap describe where it stopped. */
int64_t tcplab_walk_pcapng(const uint8_t *buf, int64_t len, int64_t *pos, int32_t *swap,
                           int64_t *out_off, uint32_t *out_type, uint8_t *out_swap, int64_t cap) {
    int64_t p = *pos, n = 0;
    int s = *swap;
    while (n < cap && p + 12 <= len) {
        uint32_t type = rd32(buf + p, s);
        if (type == 0x0A0D0D0Au) {
            uint32_t bom;
            memcpy(&bom, buf + p + 8, 4);
            if (bom == 0x1A2B3C4Du) s = 0;
            else if (bom == 0x4D3C2B1Au) s = 1;
            else break;
        }
        int64_t total = rd32(buf + p + 4, s);
        if (total < 12 || (total & 3) || p + total > len) break;
        out_off[n] = p;
        out_type[n] = type;
        out_swap[n] = (uint8_t)s;
        n++;
        p += total;
    }
    *pos = p;
    *swap = s;
    return n;
}
"""


@dataclass(frozen=True)
class PcapWalk:
    """Offsets of complete records; `end` is the first byte not covered by one (== len if none)."""

    offsets: np.ndarray  # int64, start of each record header
    end: int


@dataclass(frozen=True)
class PcapngWalk:
    """Every complete block: offset, type (in the block's byte order) and whether it is byte-swapped."""

    offsets: np.ndarray  # int64
    types: np.ndarray    # uint32
    swapped: np.ndarray  # bool
    end: int
    swap_end: bool = False  # byte order in force at `end` (pass it back in to resume the walk)


@cache
def _load_c() -> ctypes.CDLL | None:
    """Compile (once per source hash) and load the C walker; None when that is not possible."""
    if os.environ.get("TCPLAB_PCAP_WALK") == "python":
        return None
    lib = cbuild.build(_C_SOURCE, "pcapwalk")
    if lib is None:
        return None
    i64p = ctypes.POINTER(ctypes.c_int64)
    lib.tcplab_walk_pcap.restype = ctypes.c_int64
    lib.tcplab_walk_pcap.argtypes = [ctypes.c_void_p, ctypes.c_int64, i64p, ctypes.c_int,
                                     ctypes.c_void_p, ctypes.c_int64]
    lib.tcplab_walk_pcapng.restype = ctypes.c_int64
    lib.tcplab_walk_pcapng.argtypes = [ctypes.c_void_p, ctypes.c_int64, i64p,
                                       ctypes.POINTER(ctypes.c_int32), ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def walker_kind() -> str:
    """'c' or 'python': which implementation walk_pcap/walk_pcapng use in this process."""
    return "c" if _load_c() is not None else "python"


def _swap_needed(big_endian: bool) -> bool:
    return big_endian != (sys.byteorder == "big")


def walk_pcap(buf: np.ndarray, start: int, big_endian: bool) -> PcapWalk:
    """Offsets of the classic-pcap record headers in `buf` (uint8) from `start` on."""
    lib = _load_c()
    if lib is None:
        return _walk_pcap_py(buf, start, big_endian)
    swap = int(_swap_needed(big_endian))
    pos = ctypes.c_int64(start)
    parts: list[np.ndarray] = []
    while True:
        out = np.empty(CHUNK, dtype=np.int64)
        n = lib.tcplab_walk_pcap(buf.ctypes.data, buf.size, ctypes.byref(pos), swap, out.ctypes.data, CHUNK)
        parts.append(out[:n])
        if n < CHUNK:
            break
    return PcapWalk(np.concatenate(parts), pos.value)


def _walk_pcap_py(buf: np.ndarray, start: int, big_endian: bool) -> PcapWalk:
    data = memoryview(buf)
    incl = struct.Struct(">I" if big_endian else "<I")
    size = buf.size
    out = []
    p = start
    while p + 16 <= size:
        (n,) = incl.unpack_from(data, p + 8)
        if p + 16 + n > size:
            break
        out.append(p)
        p += 16 + n
    return PcapWalk(np.asarray(out, dtype=np.int64), p)


def walk_pcapng(buf: np.ndarray, start: int = 0, swapped: bool = False) -> PcapngWalk:
    """Offset, type and byte order of every pcapng block in `buf` (uint8) from `start` on.

    `swapped`: the byte order in force at `start` (the section's), when resuming mid-file."""
    lib = _load_c()
    if lib is None:
        return _walk_pcapng_py(buf, start, swapped)
    pos = ctypes.c_int64(start)
    swap = ctypes.c_int32(int(swapped))
    offs: list[np.ndarray] = []
    types: list[np.ndarray] = []
    swaps: list[np.ndarray] = []
    while True:
        o = np.empty(CHUNK, dtype=np.int64)
        t = np.empty(CHUNK, dtype=np.uint32)
        s = np.empty(CHUNK, dtype=np.uint8)
        n = lib.tcplab_walk_pcapng(buf.ctypes.data, buf.size, ctypes.byref(pos), ctypes.byref(swap),
                                   o.ctypes.data, t.ctypes.data, s.ctypes.data, CHUNK)
        offs.append(o[:n])
        types.append(t[:n])
        swaps.append(s[:n])
        if n < CHUNK:
            break
    return PcapngWalk(np.concatenate(offs), np.concatenate(types),
                      np.concatenate(swaps).astype(bool), pos.value, bool(swap.value))


def _walk_pcapng_py(buf: np.ndarray, start: int, swapped: bool = False) -> PcapngWalk:
    data = memoryview(buf)
    size = buf.size
    native = "<" if sys.byteorder == "little" else ">"
    other = ">" if native == "<" else "<"
    order = other if swapped else native
    offs, types, swaps = [], [], []
    p = start
    while p + 12 <= size:
        (btype,) = struct.unpack_from(order + "I", data, p)
        if btype == PCAPNG_SHB:
            (bom,) = struct.unpack_from(native + "I", data, p + 8)
            if bom == _BOM:
                order = native
            elif bom == _BOM_SWAPPED:
                order = other
            else:
                break
        (total,) = struct.unpack_from(order + "I", data, p + 4)
        if total < 12 or total & 3 or p + total > size:
            break
        offs.append(p)
        types.append(btype)
        swaps.append(order != native)
        p += total
    return PcapngWalk(np.asarray(offs, dtype=np.int64), np.asarray(types, dtype=np.uint32),
                      np.asarray(swaps, dtype=bool), p, order != native)
