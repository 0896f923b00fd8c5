"""Netlink attributes (struct nlattr: u16 length, u16 type, payload padded to 4 bytes; host byte order) as pure
functions on bytes: what the option codecs of qdiscs tc cannot configure here share (mark_netlink,
dualpi2_netlink)."""
from __future__ import annotations

import struct

TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER


def attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def decode(data: bytes, formats: dict[int, str], names: dict[int, str], error: type[ValueError]) -> dict:
    """{names[type]: value} for each attribute whose type has a struct format in `formats`; PAD and unknown
    types are skipped; a bad length raises `error`."""
    out: dict = {}
    pos = 0
    while pos + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, pos)
        if length < 4 or pos + length > len(data):
            raise error(f"bad attribute length {length} at offset {pos}")
        kind &= TYPE_MASK
        payload = data[pos + 4:pos + length]
        if kind in formats:
            fmt = formats[kind]
            if len(payload) != struct.calcsize(fmt):
                raise error(f"attribute {kind}: {len(payload)} bytes, expected {struct.calcsize(fmt)}")
            out[names[kind]] = struct.unpack(fmt, payload)[0]
        pos += length + (-length % 4)
    return out
