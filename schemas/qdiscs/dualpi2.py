"""DualPI2 (RFC 9332): the L4S coupled dual queue. In the kernel since 6.17 and in iproute2 since 6.17;
an older tc cannot set or print its options, which the probe (it sets one) and the read-back both catch.

The JSON names follow iproute2's print function (tc/q_dualpi2.c): times in µs (`target`, `tupdate`,
`step-thresh-us`), `coupling`, `ecn-mask` as "l4s-ect"/"any-ect", and `split-gso` printed (as null) only
when splitting is on. tests/fixtures/tc/htb_dualpi2.json is constructed from it, not captured (see the
fixtures' README).
"""
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


class DualPi2(Strict):
    kind: Literal["dualpi2"] = "dualpi2"
    limit_packets: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0, description="classic queue target delay")
    tupdate_ns: int | None = Field(default=None, gt=0)
    step_thresh_ns: int | None = Field(default=None, gt=0, description="L4S queue step threshold")
    coupling_factor: int | None = Field(default=None, gt=0)
    ecn_mask: Literal["l4s_ect", "any_ect"] | None = None
    split_gso: bool | None = None


def expected(s: DualPi2) -> list[Expect]:
    return [Expect("limit", ("options", "limit"), s.limit_packets, ("limit_packets",)),
            Expect("target", ("options", "target"), us(s.target_ns), ("target_ns",), whole_us),
            Expect("tupdate", ("options", "tupdate"), us(s.tupdate_ns), ("tupdate_ns",), whole_us),
            Expect("step_thresh", ("options", "step-thresh-us"), us(s.step_thresh_ns), ("step_thresh_ns",),
                   whole_us),
            Expect("coupling_factor", ("options", "coupling"), s.coupling_factor, ("coupling_factor",)),
            Expect("ecn_mask", ("options", "ecn-mask"), s.ecn_mask and s.ecn_mask.replace("_", "-"), ("ecn_mask",)),
            Expect("split_gso", ("options", "split-gso"), s.split_gso, ("split_gso",), present=True)]


DUALPI2 = QdiscKind(
    stage=DualPi2,
    params=lambda s: ["dualpi2", *opt("limit", s.limit_packets), *opt("target", s.target_ns, tc_time),
                      *opt("tupdate", s.tupdate_ns, tc_time), *opt("step_thresh", s.step_thresh_ns, tc_time),
                      *opt("coupling_factor", s.coupling_factor), *([s.ecn_mask] if s.ecn_mask else []),
                      *flag(s.split_gso, "split_gso", "no_split_gso")],
    expected=expected,
    buffer_packets=lambda s, mtu: limit_or_default(s.limit_packets, DUALPI2.default_limit_packets),
    # with an option: a tc older than 6.17 adds a bare `dualpi2` (it passes no options) but refuses any option
    probe=("dualpi2", "limit", "10000"),
    leaf_only=True,
    default_limit_packets=10000,
)
