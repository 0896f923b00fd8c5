"""CoDel and flow-queueing CoDel (times in ns here, whole µs in tc's JSON)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.qdiscs.base import (
    Expect,
    QdiscKind,
    Strict,
    flag,
    limit_or_default,
    opt,
    tc_time,
    us,
    whole_us,
)


class FqCodel(Strict):
    kind: Literal["fq_codel"] = "fq_codel"
    limit_packets: int | None = Field(default=None, gt=0)
    flows: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0)
    interval_ns: int | None = Field(default=None, gt=0)
    quantum_bytes: int | None = Field(default=None, gt=0)
    ce_threshold_ns: int | None = Field(default=None, gt=0)
    memory_limit_bytes: int | None = Field(default=None, gt=0)
    ecn: bool = True


class Codel(Strict):
    kind: Literal["codel"] = "codel"
    limit_packets: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0)
    interval_ns: int | None = Field(default=None, gt=0)
    ce_threshold_ns: int | None = Field(default=None, gt=0)
    ecn: bool = False


def _times(s: FqCodel | Codel) -> list[Expect]:
    # codel keeps times in 1024 ns units: 5 ms reads back as 4999 µs
    return [Expect("target", ("options", "target"), us(s.target_ns), ("target_ns",), whole_us),
            Expect("interval", ("options", "interval"), us(s.interval_ns), ("interval_ns",), whole_us),
            Expect("ce_threshold", ("options", "ce_threshold"), us(s.ce_threshold_ns), ("ce_threshold_ns",),
                   whole_us)]


def fq_codel_expected(s: FqCodel) -> list[Expect]:
    return [Expect("limit", ("options", "limit"), s.limit_packets, ("limit_packets",)),
            Expect("flows", ("options", "flows"), s.flows, ("flows",)),
            Expect("quantum", ("options", "quantum"), s.quantum_bytes, ("quantum_bytes",)),
            Expect("memory_limit", ("options", "memory_limit"), s.memory_limit_bytes, ("memory_limit_bytes",)),
            *_times(s),
            Expect("ecn", ("options", "ecn"), s.ecn, ("ecn",), absent=False)]   # tc prints `ecn` only when set


def codel_expected(s: Codel) -> list[Expect]:
    return [Expect("limit", ("options", "limit"), s.limit_packets, ("limit_packets",)), *_times(s),
            Expect("ecn", ("options", "ecn"), s.ecn, ("ecn",), absent=False)]


FQ_CODEL = QdiscKind(
    stage=FqCodel,
    params=lambda s: ["fq_codel", *opt("limit", s.limit_packets), *opt("flows", s.flows),
                      *opt("target", s.target_ns, tc_time), *opt("interval", s.interval_ns, tc_time),
                      *opt("quantum", s.quantum_bytes), *opt("ce_threshold", s.ce_threshold_ns, tc_time),
                      *opt("memory_limit", s.memory_limit_bytes), *flag(s.ecn, "ecn", "noecn")],
    expected=fq_codel_expected,
    buffer_packets=lambda s, mtu: limit_or_default(s.limit_packets, FQ_CODEL.default_limit_packets),
    probe=("fq_codel",),
    leaf_only=True,
    default_limit_packets=10240,
)

CODEL = QdiscKind(
    stage=Codel,
    params=lambda s: ["codel", *opt("limit", s.limit_packets), *opt("target", s.target_ns, tc_time),
                      *opt("interval", s.interval_ns, tc_time), *opt("ce_threshold", s.ce_threshold_ns, tc_time),
                      *flag(s.ecn, "ecn", "noecn")],
    expected=codel_expected,
    buffer_packets=lambda s, mtu: limit_or_default(s.limit_packets, CODEL.default_limit_packets),
    probe=("codel",),
    leaf_only=True,
    default_limit_packets=1000,
)
