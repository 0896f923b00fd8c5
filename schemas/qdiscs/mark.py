"""`mark`: tcplab's `aqm-mark` qdisc, a kernel variant (module sch_aqm_mark) that marks CE on the
instantaneous sojourn time or the expected service time, as a step or a linear ramp.

The module is experiments/modules/sch_aqm_mark (qdisc kind `aqm_mark`, docs/modules.md). Stock tc cannot
configure it, so the stage has no tc argv: the agent sends its netlink options (schemas/qdiscs/mark_netlink.py)
in an RTM_NEWQDISC (schemas/rawqdisc.py) and reads them back from the kernel's qdisc dump, byte-decoded here.
The agent loads the module from its module directories (`--module-dir`) for the probe and the apply, and a host
whose agent cannot load it does not report `mark`: a plan that needs it is refused there before any host is
touched ("lacks qdisc mark").
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.qdiscs import mark_netlink
from schemas.qdiscs.base import Expect, QdiscKind, Strict


class Mark(Strict):
    """tcplab's `aqm-mark` qdisc (a kernel variant): ECN marking on the instantaneous sojourn or EST."""

    kind: Literal["mark"] = "mark"
    mode: Literal["step", "ramp"]
    min_ns: int = Field(gt=0, description="step threshold, or the ramp's lower end")
    max_ns: int | None = Field(default=None, gt=0, description="ramp upper end (probability 1)")
    metric: Literal["sojourn", "est"] = "sojourn"
    on_dequeue: bool = True
    limit_packets: int = Field(gt=0)


def _decoded(field: str):
    def read(options_hex: str):
        return mark_netlink.decode_options(bytes.fromhex(options_hex)).get(field)
    return read


def expected(s: Mark) -> list[Expect]:
    """Every option, from the kernel's own dump of TCA_OPTIONS (exact: the kernel keeps what it was given)."""
    wanted = {"mode": s.mode, "metric": s.metric, "min_ns": s.min_ns, "max_ns": s.max_ns,
              "on_dequeue": s.on_dequeue, "limit_packets": s.limit_packets}
    return [Expect(name, ("netlink", "options_hex"), want, (name,), read=_decoded(name),
                   unit="ns" if name.endswith("_ns") else "") for name, want in wanted.items()]


MARK = QdiscKind(
    stage=Mark,
    params=None,
    expected=expected,
    buffer_packets=lambda s, mtu: s.limit_packets,
    probe=(mark_netlink.KIND,),
    leaf_only=True,
    netlink=mark_netlink.options_for,
    kernel_kind=mark_netlink.KIND,
    xstats=mark_netlink.decode_xstats,
    module="sch_aqm_mark",
)
