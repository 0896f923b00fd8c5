"""PIE and flow-queueing PIE (times in ns here, whole µs in tc's JSON)."""
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


class Pie(Strict):
    kind: Literal["pie"] = "pie"
    limit_packets: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0)
    tupdate_ns: int | None = Field(default=None, gt=0)
    alpha: int | None = Field(default=None, ge=0, le=32)
    beta: int | None = Field(default=None, ge=0, le=32)
    ecn: bool = False
    bytemode: bool = False


class FqPie(Strict):
    kind: Literal["fq_pie"] = "fq_pie"
    limit_packets: int | None = Field(default=None, gt=0)
    flows: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0)
    tupdate_ns: int | None = Field(default=None, gt=0)
    ecn: bool = True


def _common(s: Pie | FqPie) -> list[Expect]:
    return [Expect("limit", ("options", "limit"), s.limit_packets, ("limit_packets",)),
            Expect("target", ("options", "target"), us(s.target_ns), ("target_ns",), whole_us),
            Expect("tupdate", ("options", "tupdate"), us(s.tupdate_ns), ("tupdate_ns",), whole_us),
            Expect("ecn", ("options", "ecn"), s.ecn, ("ecn",), absent=False)]   # tc prints `ecn` only when set


PIE = QdiscKind(
    stage=Pie,
    params=lambda s: ["pie", *opt("limit", s.limit_packets), *opt("target", s.target_ns, tc_time),
                      *opt("tupdate", s.tupdate_ns, tc_time), *opt("alpha", s.alpha), *opt("beta", s.beta),
                      *flag(s.ecn, "ecn", "noecn"), *flag(s.bytemode, "bytemode", None)],
    expected=lambda s: [*_common(s), Expect("alpha", ("options", "alpha"), s.alpha, ("alpha",)),
                        Expect("beta", ("options", "beta"), s.beta, ("beta",)),
                        Expect("bytemode", ("options", "bytemode"), s.bytemode, ("bytemode",), absent=False)],
    buffer_packets=lambda s, mtu: limit_or_default(s.limit_packets, PIE.default_limit_packets),
    probe=("pie",),
    leaf_only=True,
    default_limit_packets=1000,
)

FQ_PIE = QdiscKind(
    stage=FqPie,
    params=lambda s: ["fq_pie", *opt("limit", s.limit_packets), *opt("flows", s.flows),
                      *opt("target", s.target_ns, tc_time), *opt("tupdate", s.tupdate_ns, tc_time),
                      *flag(s.ecn, "ecn", "no_ecn")],
    expected=lambda s: [*_common(s), Expect("flows", ("options", "flows"), s.flows, ("flows",))],
    buffer_packets=lambda s, mtu: limit_or_default(s.limit_packets, FQ_PIE.default_limit_packets),
    probe=("fq_pie",),
    leaf_only=True,
    default_limit_packets=10240,
)
