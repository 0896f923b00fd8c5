"""IP addresses in packet arrays: 16 raw bytes plus a version, formatted only where text is needed.

records.PACKET keeps addresses as `V16` (IPv4 in the first four bytes, zero-padded) and `ipv` (4/6).
Text is made once per distinct address (inet_ntoa / inet_ntop, RFC 5952 compressed, `::ffff:a.b.c.d`
for mapped IPv6 addresses, as tshark prints them), never per packet.
"""
from __future__ import annotations

import ipaddress
import socket

import numpy as np


def pack(addr: str) -> tuple[int, bytes]:
    """(ipv, 16 bytes) of an address in text form, as records.PACKET stores it."""
    ip = ipaddress.ip_address(addr)
    return ip.version, ip.packed.ljust(16, b"\0")


def packed(addr: str) -> np.void:
    """The V16 value of an address, for comparisons with a PACKET address column."""
    return np.frombuffer(pack(addr)[1], "V16")[0]


def text(ipv: int, raw: bytes) -> str:
    if ipv == 4:
        return socket.inet_ntoa(raw[:4])
    return socket.inet_ntop(socket.AF_INET6, raw)


def format_column(ipv: np.ndarray, addr: np.ndarray) -> np.ndarray:
    """Text of every address of a column (object array of str), each distinct one formatted once."""
    if addr.size == 0:
        return np.empty(0, dtype=object)
    key = np.empty(addr.size, dtype=[("ipv", "u1"), ("a", "V16")])
    key["ipv"], key["a"] = ipv, addr
    uniq, inverse = np.unique(key, return_inverse=True)
    names = np.array([text(int(u["ipv"]), u["a"].tobytes()) for u in uniq], dtype=object)
    return names[inverse.reshape(-1)]
