"""The link/IP/TCP/UDP header decoder in C: one block's Frames -> records.PACKET rows in one call.

Same contract and results as the numpy decoder (`orchestrator/ingest/pcap.py` `decode_numpy`, the
fallback and the test oracle): the same rows in file order, byte for byte, and the same counts of
TCP, UDP, other and truncated frames. The loop runs once per frame in C and writes each row straight
into the output array (field offsets come from records.PACKET, so the dtype stays the single source),
so there is neither a Python object per packet nor the dozens of numpy temporaries per field that the
vectorised decoder needs. Built with orchestrator/ingest/cbuild.py at first use; TCPLAB_PCAP_DECODE=numpy
forces the numpy decoder. Why C and not more numpy: docs/pcap-reader.md.
"""
from __future__ import annotations

import ctypes
import os
from functools import cache

import numpy as np

from orchestrator.ingest import cbuild
from orchestrator.ingest.pcap_format import Frames
from orchestrator.storage import records

# records.PACKET field -> the byte width the C code writes, in the order of its F_* enum
_WIDTH = {"ts_ns": 8, "src_addr": 16, "dst_addr": 16, "seq": 8, "ack": 8, "tsval": 8, "tsecr": 8, "src_port": 4,
          "dst_port": 4, "payload_len": 4, "ip_len": 4, "ip_id": 4, "tcp_flags": 2, "ecn": 2, "point": 2,
          "proto": 1, "ipv": 1}
FIELDS = tuple(_WIDTH)

_C_SOURCE = r"""
#include <stdint.h>
#include <string.h>

enum { F_TS, F_SRC, F_DST, F_SEQ, F_ACK, F_TSVAL, F_TSECR, F_SPORT, F_DPORT, F_PAY, F_IPLEN, F_IPID,
       F_FLAGS, F_ECN, F_POINT, F_PROTO, F_IPV, F_SIZE };

static inline uint32_t be16(const uint8_t *p) { return ((uint32_t)p[0] << 8) | p[1]; }
static inline uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static inline void put64(uint8_t *r, int32_t off, int64_t v) { memcpy(r + off, &v, 8); }
static inline void put32(uint8_t *r, int32_t off, int32_t v) { memcpy(r + off, &v, 4); }
static inline void put16(uint8_t *r, int32_t off, int16_t v) { memcpy(r + off, &v, 2); }

/* Decode n frames (offset, captured and wire length, link type, timestamp per frame) of buf into
   PACKET rows at out (f: field offsets, f[F_SIZE] the row size). counts += tcp, udp, other, truncated.
   Every read stays inside [data, data + caplen), which the record walk put inside buf. */
int64_t tcplab_decode(const uint8_t *buf, const int64_t *data, const int64_t *caplen, const int64_t *wirelen,
                      const int64_t *linktype, const int64_t *ts_ns, int64_t n, int32_t point,
                      const int32_t *f, uint8_t *out, int64_t *counts) {
    int64_t rows = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t d = data[i], end = d + caplen[i];
        int64_t hdr, l3, l4, h4, ip_len, payload;
        uint32_t etype;
        int is6, proto, iphl, tcp, k;
        switch (linktype[i]) {
            case 1: hdr = 14; break;      /* Ethernet */
            case 113: hdr = 16; break;    /* Linux SLL */
            case 276: hdr = 20; break;    /* Linux SLL2 */
            default: hdr = 1;             /* raw IP: one byte to read the version */
        }
        if (caplen[i] < hdr) goto trunc;
        if (hdr == 14) etype = be16(buf + d + 12);
        else if (hdr == 16) etype = be16(buf + d + 14);
        else if (hdr == 20) etype = be16(buf + d);
        else etype = (buf[d] >> 4) == 6 ? 0x86DD : 0x0800;
        l3 = d + (hdr == 1 ? 0 : hdr);
        for (k = 0; k < 2 && (etype == 0x8100 || etype == 0x88A8); k++) {   /* 802.1Q / 802.1ad */
            if (l3 + 4 > end) goto trunc;
            etype = be16(buf + l3 + 2);
            l3 += 4;
        }
        if (etype == 0x0800) {
            if (l3 + 20 > end) goto trunc;
            if ((buf[l3] >> 4) != 4) goto other;
            iphl = (buf[l3] & 0xF) * 4;
            if (iphl < 20) goto trunc;
            proto = buf[l3 + 9];
            if ((proto != 6 && proto != 17) || (be16(buf + l3 + 6) & 0x1FFF) != 0) goto other;
            is6 = 0;
        } else if (etype == 0x86DD) {
            if (l3 + 40 > end) goto trunc;
            proto = buf[l3 + 6];
            if ((buf[l3] >> 4) != 6 || (proto != 6 && proto != 17)) goto other;
            iphl = 40;
            is6 = 1;
        } else {
            goto other;
        }
        l4 = l3 + iphl;
        tcp = proto == 6;
        if (l4 + (tcp ? 20 : 8) > end) goto trunc;
        h4 = tcp ? (buf[l4 + 12] >> 4) * 4 : 8;
        if ((tcp && h4 < 20) || l4 + h4 > end) goto trunc;
        ip_len = is6 ? (int64_t)be16(buf + l3 + 4) + 40 : (int64_t)be16(buf + l3 + 2);
        if (ip_len == (is6 ? 40 : 0)) ip_len = wirelen[i] - (l3 - d);   /* TSO/GSO, BIG TCP: 0 length */
        payload = ip_len - iphl - h4;
        if (payload < 0) goto trunc;
        {
            uint8_t *r = out + rows * f[F_SIZE];
            int64_t tsval = -1, tsecr = -1;
            uint8_t b1 = buf[l3 + 1];
            memset(r, 0, (size_t)f[F_SIZE]);
            put64(r, f[F_TS], ts_ns[i]);
            memcpy(r + f[F_SRC], buf + l3 + (is6 ? 8 : 12), is6 ? 16 : 4);
            memcpy(r + f[F_DST], buf + l3 + (is6 ? 24 : 16), is6 ? 16 : 4);
            put32(r, f[F_SPORT], (int32_t)be16(buf + l4));
            put32(r, f[F_DPORT], (int32_t)be16(buf + l4 + 2));
            if (tcp) {
                const uint8_t *opt = buf + l4 + 20;
                const int64_t optlen = h4 - 20;
                int64_t p = 0;
                put64(r, f[F_SEQ], be32(buf + l4 + 4));
                put64(r, f[F_ACK], be32(buf + l4 + 8));
                put16(r, f[F_FLAGS], (int16_t)(((buf[l4 + 12] & 1) << 8) | buf[l4 + 13]));
                while (p < optlen) {   /* the timestamp option wherever it sits */
                    const int kind = opt[p];
                    const int ln = p + 1 < optlen ? opt[p + 1] : 0;
                    if (kind == 8 && ln == 10 && p + 10 <= optlen) {
                        tsval = be32(opt + p + 2);
                        tsecr = be32(opt + p + 6);
                        break;
                    }
                    if (kind == 0) break;
                    if (kind == 1) { p += 1; continue; }
                    if (ln < 2) break;
                    p += ln;
                }
            }
            put64(r, f[F_TSVAL], tsval);
            put64(r, f[F_TSECR], tsecr);
            put32(r, f[F_PAY], (int32_t)payload);
            put32(r, f[F_IPLEN], (int32_t)ip_len);
            put32(r, f[F_IPID], is6 ? 0 : (int32_t)be16(buf + l3 + 4));
            put16(r, f[F_ECN], (int16_t)(is6 ? (b1 >> 4) & 3 : b1 & 3));
            put16(r, f[F_POINT], (int16_t)point);
            r[f[F_PROTO]] = (uint8_t)proto;
            r[f[F_IPV]] = is6 ? 6 : 4;
            counts[tcp ? 0 : 1]++;
            rows++;
        }
        continue;
    other:
        counts[2]++;
        continue;
    trunc:
        counts[3]++;
    }
    return rows;
}
"""


def _offsets() -> np.ndarray:
    """Field offsets of records.PACKET in FIELDS order plus the row size, checked against the widths the
    C code writes (a changed dtype disables the C decoder instead of corrupting rows)."""
    fields = records.PACKET.fields
    for name in FIELDS:
        if fields[name][0].itemsize != _WIDTH[name] or fields[name][0].byteorder not in ("=", "|", "<"):
            raise TypeError(f"records.PACKET.{name} is not what the C decoder writes")
    if set(fields) != set(FIELDS):
        raise TypeError("records.PACKET fields differ from the C decoder's")
    return np.array([fields[n][1] for n in FIELDS] + [records.PACKET.itemsize], dtype=np.int32)


@cache
def _load() -> tuple[ctypes.CDLL, np.ndarray] | None:
    if os.environ.get("TCPLAB_PCAP_DECODE") == "numpy" or np.little_endian is False:
        return None
    try:
        offsets = _offsets()
    except TypeError:
        return None
    lib = cbuild.build(_C_SOURCE, "pcapdecode", flags=("-O2", "-std=c99"))
    if lib is None:
        return None
    p = ctypes.c_void_p
    lib.tcplab_decode.restype = ctypes.c_int64
    lib.tcplab_decode.argtypes = [p, p, p, p, p, p, ctypes.c_int64, ctypes.c_int32, p, p, p]
    return lib, offsets


def available() -> bool:
    return _load() is not None


def decode(fr: Frames, point: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """records.PACKET rows of one block's TCP/UDP frames and counts [records, tcp, udp, other, truncated]
    (the numpy decoder's contract). Raises RuntimeError when the C decoder is not available."""
    loaded = _load()
    if loaded is None:
        raise RuntimeError("the C pcap decoder is not available (no compiler, or TCPLAB_PCAP_DECODE=numpy)")
    lib, offsets = loaded
    cols = [np.ascontiguousarray(a, dtype=np.int64) for a in (fr.data, fr.caplen, fr.wirelen, fr.linktype, fr.ts_ns)]
    buf = np.ascontiguousarray(fr.buf)
    n = cols[0].size
    out = np.empty(n, dtype=records.PACKET)
    c = np.zeros(4, dtype=np.int64)
    rows = lib.tcplab_decode(buf.ctypes.data, *(a.ctypes.data for a in cols), n, int(point), offsets.ctypes.data,
                             out.ctypes.data, c.ctypes.data)
    counts = np.array([n + fr.extra_other, c[0], c[1], c[2] + fr.extra_other, c[3]], dtype=np.int64)
    return out[:rows], counts
