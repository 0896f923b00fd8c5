"""fq: per-flow fair queueing and pacing, in the studies on the sender's egress as the root qdisc."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.qdiscs.base import (
    Expect,
    QdiscKind,
    Strict,
    bits,
    flag,
    limit_or_default,
    opt,
    tc_rounded,
    tc_time,
    us,
    whole_us,
)


class Fq(Strict):
    """fq (per-flow pacing) - in the studies on the sender's egress, as the root qdisc."""

    kind: Literal["fq"] = "fq"
    limit_packets: int | None = Field(default=None, gt=0)
    flow_limit_packets: int | None = Field(default=None, gt=0)
    quantum_bytes: int | None = Field(default=None, gt=0)
    initial_quantum_bytes: int | None = Field(default=None, gt=0)
    maxrate_bit: int | None = Field(default=None, gt=0)
    pacing: bool = True
    ce_threshold_ns: int | None = Field(default=None, gt=0)


def expected(s: Fq) -> list[Expect]:
    return [Expect("limit", ("options", "limit"), s.limit_packets, ("limit_packets",)),
            Expect("flow_limit", ("options", "flow_limit"), s.flow_limit_packets, ("flow_limit_packets",)),
            Expect("quantum", ("options", "quantum"), s.quantum_bytes, ("quantum_bytes",)),
            Expect("initial_quantum", ("options", "initial_quantum"), s.initial_quantum_bytes,
                   ("initial_quantum_bytes",)),
            Expect("maxrate", ("options", "maxrate"), None if s.maxrate_bit is None else s.maxrate_bit // 8,
                   ("maxrate_bit",), tc_rounded),
            Expect("pacing", ("options", "pacing"), s.pacing, ("pacing",), absent=True),  # printed only when off
            Expect("ce_threshold", ("options", "ce_threshold"), us(s.ce_threshold_ns), ("ce_threshold_ns",),
                   whole_us)]


FQ = QdiscKind(
    stage=Fq,
    params=lambda s: ["fq", *opt("limit", s.limit_packets), *opt("flow_limit", s.flow_limit_packets),
                      *opt("quantum", s.quantum_bytes), *opt("initial_quantum", s.initial_quantum_bytes),
                      *opt("maxrate", s.maxrate_bit, bits), *flag(s.pacing, "pacing", "nopacing"),
                      *opt("ce_threshold", s.ce_threshold_ns, tc_time)],
    expected=expected,
    buffer_packets=lambda s, mtu: limit_or_default(s.limit_packets, FQ.default_limit_packets),
    probe=("fq",),
    leaf_only=True,
    default_limit_packets=10000,
)
