"""DualPI2 (RFC 9332): the L4S coupled dual queue, upstream since Linux 6.17 (net/sched/sch_dualpi2.c).

iproute2 knows it only from 6.17 on, so, like tcplab's own `mark`, the stage has no tc syntax: the agent sends
its netlink options (schemas/qdiscs/dualpi2_netlink.py, with NLA_F_NESTED: sch_dualpi2 parses them with
nla_parse_nested) in an RTM_NEWQDISC (schemas/rawqdisc.py) and reads them back from the kernel's qdisc dump,
decoded and compared option by option with what the kernel keeps of what was sent (ALPHA/BETA round down,
`kernel_holds`). No Debian kernel ships the module (Debian's 7.2 config leaves it out); the VM lab builds
sch_dualpi2.ko from the kernel's source (docs/modules.md) and the agent loads it from its module directories
for the probe and the apply, so only a host whose agent can create the qdisc reports `dualpi2`.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from schemas.qdiscs import dualpi2_netlink
from schemas.qdiscs.base import Expect, QdiscKind, Strict, limit_or_default

ALPHA_BETA_MAX = (1 << 31) - 1   # sch_dualpi2.c's ALPHA_BETA_MAX (its netlink policy: 1..2^31 - 1)


class DualPi2(Strict):
    kind: Literal["dualpi2"] = "dualpi2"
    limit_packets: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0, description="classic queue target delay (whole µs)")
    tupdate_ns: int | None = Field(default=None, gt=0, description="PI update interval (whole µs)")
    alpha: int | None = Field(default=None, gt=0, le=ALPHA_BETA_MAX,
                              description="PI integral gain in Hz × 256 (kernel default 41, i.e. 0.16 Hz)")
    beta: int | None = Field(default=None, gt=0, le=ALPHA_BETA_MAX,
                             description="PI proportional gain in Hz × 256 (kernel default 819, i.e. 3.2 Hz)")
    step_thresh_ns: int | None = Field(default=None, gt=0, description="L4S queue step threshold (whole µs)")
    coupling_factor: int | None = Field(default=None, gt=0, le=255)
    ecn_mask: Literal["l4s_ect", "any_ect"] | None = None
    split_gso: bool | None = None

    @field_validator("target_ns", "tupdate_ns", "step_thresh_ns")
    @classmethod
    def _whole_us(cls, ns: int | None) -> int | None:
        if ns is not None and ns % 1000:
            raise ValueError(f"{ns} ns is not a whole number of µs (the kernel takes µs)")
        return ns


# stage field -> the name dualpi2_netlink.decode_options gives its attribute in the kernel's dump
DUMP_NAMES = {"limit_packets": "limit_packets", "target_ns": "target_us", "tupdate_ns": "tupdate_us",
              "alpha": "alpha", "beta": "beta", "step_thresh_ns": "step_thresh_us",
              "coupling_factor": "coupling_factor", "ecn_mask": "ecn_mask", "split_gso": "split_gso"}


def _decoded(name: str):
    def read(options_hex: str):
        return dualpi2_netlink.decode_options(bytes.fromhex(options_hex)).get(name)
    return read


def expected(s: DualPi2) -> list[Expect]:
    """Every option the stage sets, from the kernel's own dump of TCA_OPTIONS, as the kernel keeps it (exact:
    alpha and beta as their rounding leaves them, e.g. 41 -> 40)."""
    held = dualpi2_netlink.held_options(s)
    return [Expect(name, ("netlink", "options_hex"), held.get(name), (field,), read=_decoded(name),
                   why="as the kernel rounds it" if field in ("alpha", "beta") else "")
            for field, name in DUMP_NAMES.items()]


DUALPI2 = QdiscKind(
    stage=DualPi2,
    params=None,
    expected=expected,
    buffer_packets=lambda s, mtu: limit_or_default(s.limit_packets, DUALPI2.default_limit_packets),
    # bare: any tc adds it without options (the kernel's defaults), so this proves only that the kernel has it
    probe=(dualpi2_netlink.KIND,),
    leaf_only=True,
    default_limit_packets=10000,
    netlink=dualpi2_netlink.options_for,
    netlink_nested=True,
    xstats=dualpi2_netlink.decode_xstats,
    module="sch_dualpi2",
)
