"""CAKE: shaper, flow isolation and AQM in one qdisc (rates in bytes/s in tc's JSON)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.qdiscs.base import Expect, QdiscKind, Strict, bits, flag, opt, tc_rounded, tc_time, us, whole_us


class Cake(Strict):
    kind: Literal["cake"] = "cake"
    bandwidth_bit: int | None = Field(default=None, gt=0, description="shaper rate; None = unlimited")
    rtt_ns: int | None = Field(default=None, gt=0)
    flow_mode: Literal["flowblind", "srchost", "dsthost", "hosts", "flows", "dual-srchost", "dual-dsthost",
                       "triple-isolate"] | None = None
    diffserv: Literal["besteffort", "diffserv3", "diffserv4", "diffserv8", "precedence"] | None = None
    ack_filter: bool = False
    overhead_bytes: int | None = Field(default=None, ge=-64, le=256)


def params(s: Cake) -> list[str]:
    bw = ["bandwidth", bits(s.bandwidth_bit)] if s.bandwidth_bit else ["unlimited"]
    return ["cake", *bw, *opt("rtt", s.rtt_ns, tc_time), *([s.flow_mode] if s.flow_mode else []),
            *([s.diffserv] if s.diffserv else []), *flag(s.ack_filter, "ack-filter", "no-ack-filter"),
            *opt("overhead", s.overhead_bytes)]


def expected(s: Cake) -> list[Expect]:
    bandwidth = "unlimited" if s.bandwidth_bit is None else s.bandwidth_bit // 8
    return [Expect("bandwidth", ("options", "bandwidth"), bandwidth, ("bandwidth_bit",), tc_rounded),
            Expect("rtt", ("options", "rtt"), us(s.rtt_ns), ("rtt_ns",), whole_us),
            Expect("flowmode", ("options", "flowmode"), s.flow_mode, ("flow_mode",)),
            Expect("diffserv", ("options", "diffserv"), s.diffserv, ("diffserv",)),
            Expect("ack-filter", ("options", "ack-filter"), "enabled" if s.ack_filter else "disabled",
                   ("ack_filter",)),
            Expect("overhead", ("options", "overhead"), s.overhead_bytes, ("overhead_bytes",))]


CAKE = QdiscKind(
    stage=Cake,
    params=params,
    expected=expected,
    buffer_packets=lambda s, mtu: 0,   # bounded by memory (memlimit), not by a packet count
    probe=("cake",),
    leaf_only=True,
)
