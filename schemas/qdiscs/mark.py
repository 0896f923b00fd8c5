"""`mark`: tcplab's `aqm-mark` qdisc, a kernel variant (module sch_aqm_mark) that marks CE on the
instantaneous sojourn time or the expected service time, as a step or a linear ramp.

The module is experiments/modules/sch_aqm_mark (qdisc kind `aqm_mark`, docs/modules.md) and its netlink
options are schemas/qdiscs/mark_netlink.py (no patched tc: raw TCA_OPTIONS). Still pending for plans: the
agent does not load the module, apply the stage over netlink or read it back yet, so there is no argv,
read-back or probe here. The kind is never probed, so a plan that needs it is refused before any host is
touched ("lacks qdisc mark"); its buffer still counts for G-NETEM.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.qdiscs.base import QdiscKind, Strict


class Mark(Strict):
    """tcplab's `aqm-mark` qdisc (a kernel variant): ECN marking on the instantaneous sojourn or EST."""

    kind: Literal["mark"] = "mark"
    mode: Literal["step", "ramp"]
    min_ns: int = Field(gt=0, description="step threshold, or the ramp's lower end")
    max_ns: int | None = Field(default=None, gt=0, description="ramp upper end (probability 1)")
    metric: Literal["sojourn", "est"] = "sojourn"
    on_dequeue: bool = True
    limit_packets: int = Field(gt=0)


MARK = QdiscKind(
    stage=Mark,
    params=None,
    expected=None,
    buffer_packets=lambda s, mtu: s.limit_packets,
    probe=None,
    leaf_only=True,
    pending="the agent cannot load the aqm_mark module (experiments/modules/sch_aqm_mark) or apply and read it back "
            "over netlink yet",
)
