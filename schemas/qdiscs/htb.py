"""htb: the shaper. One root qdisc with one class (1:1, its default class) that shapes to the rate; the
next stage of a chain hangs below that class.

iproute2 6.1 prints htb classes as text even with `-j`, so the agent reads rate, ceil and quantum over
netlink and burst/cburst from the `tc -d class show` text, which rounds sizes to 1024-multiples.
"""
from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from schemas.qdiscs.base import Expect, QdiscKind, Strict, bits, parse_tc_size, tc_size


class Htb(Strict):
    """htb root with one class (1:1, the default class) that shapes to `rate_bit`."""

    kind: Literal["htb"] = "htb"
    rate_bit: int = Field(gt=0, description="class rate, bit/s")
    ceil_bit: int | None = Field(default=None, gt=0, description="class ceil, bit/s (default = rate)")
    burst_bytes: int | None = Field(default=None, gt=0, description="class burst, bytes")
    cburst_bytes: int | None = Field(default=None, gt=0, description="class cburst, bytes")
    quantum_bytes: int | None = Field(default=None, gt=0, description="class quantum, bytes")


def class_params(s: Htb) -> list[str]:
    argv = ["htb", "rate", bits(s.rate_bit), "ceil", bits(s.ceil_bit or s.rate_bit)]
    if s.burst_bytes:
        argv += ["burst", str(s.burst_bytes)]
    if s.cburst_bytes or s.burst_bytes:
        argv += ["cburst", str(s.cburst_bytes or s.burst_bytes)]
    if s.quantum_bytes:
        argv += ["quantum", str(s.quantum_bytes)]
    return argv


def htb_class_bursts(text: str) -> dict[str, tuple[int, int]]:
    """classid -> (burst, cburst) in bytes from `tc -d class show` text."""
    out = {}
    for m in re.finditer(r"class htb (\S+) .*?burst (\S+?)(?:/\d+)? .*?cburst (\S+?)(?:/\d+)? ", text):
        out[m.group(1)] = (parse_tc_size(m.group(2)), parse_tc_size(m.group(3)))
    return out


def class_readback(classid: str, classes: list[dict], class_text: str) -> dict | None:
    """The class's parameters: rate, ceil and quantum over netlink, burst and cburst from the text."""
    found = [c for c in classes if c.get("classid") == classid]
    if not found:
        return None
    burst, cburst = htb_class_bursts(class_text).get(classid, (None, None))
    return {**found[0], "burst_bytes": burst, "cburst_bytes": cburst}


def expected(s: Htb) -> list[Expect]:
    cburst = s.cburst_bytes or s.burst_bytes
    return [
        Expect("default", ("options", "default"), "0x1", (), why="the class every packet goes to"),
        # tc hands the kernel whole bytes/s: a rate that is not a multiple of 8 bit/s reads back rounded down
        Expect("rate", ("class", "rate_bit"), s.rate_bit // 8 * 8, ("rate_bit",), unit="bit/s"),
        Expect("ceil", ("class", "ceil_bit"), (s.ceil_bit or s.rate_bit) // 8 * 8, ("ceil_bit",), unit="bit/s"),
        Expect("quantum", ("class", "quantum_bytes"), s.quantum_bytes, ("quantum_bytes",)),
        Expect("burst", ("class", "burst_bytes"), s.burst_bytes, ("burst_bytes",), tc_size, unit="bytes"),
        Expect("cburst", ("class", "cburst_bytes"), cburst, ("cburst_bytes",), tc_size, unit="bytes"),
    ]


HTB = QdiscKind(
    stage=Htb,
    params=lambda s: ["htb", "default", "1"],
    expected=expected,
    buffer_packets=lambda s, mtu: 0,   # its classes queue in the child qdisc, counted on its own
    probe=("htb",),
    leaf_only=False,
    class_params=class_params,
    class_readback=class_readback,
)
