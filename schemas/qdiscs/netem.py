"""netem: the delay line (constant delay, jitter, random loss). A following stage hangs under its single
class (i:1), like htb's."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.qdiscs.base import Expect, QdiscKind, Strict, tc_rounded, tc_seconds, tc_time


class Netem(Strict):
    """netem delay line; a following stage hangs under its single class (i:1), like htb's."""

    kind: Literal["netem"] = "netem"
    delay_ns: int = Field(ge=0, description="constant delay, ns")
    jitter_ns: int = Field(default=0, ge=0, description="delay variation, ns")
    distribution: Literal["uniform", "normal", "pareto", "paretonormal"] | None = Field(
        default=None, description="jitter distribution (tc's table name)")
    loss: float = Field(default=0.0, ge=0, le=1, description="random loss probability")
    limit_packets: int = Field(gt=0, description="packets netem may hold (its own and, on some kernels, "
                                                 "its child's)")


def params(s: Netem) -> list[str]:
    argv = ["netem", "delay", tc_time(s.delay_ns)]
    if s.jitter_ns:
        argv += [tc_time(s.jitter_ns)] + (["distribution", s.distribution] if s.distribution else [])
    if s.loss:
        argv += ["loss", f"{s.loss * 100:.6g}%"]
    return argv + ["limit", str(s.limit_packets)]


def expected(s: Netem) -> list[Expect]:
    # times in seconds; tc omits the delay object without a delay and loss-random without loss
    return [Expect("limit", ("options", "limit"), s.limit_packets, ("limit_packets",)),
            Expect("delay", ("options", "delay", "delay"), s.delay_ns / 1e9, ("delay_ns",), tc_seconds, absent=0.0),
            Expect("jitter", ("options", "delay", "jitter"), s.jitter_ns / 1e9, ("jitter_ns",), tc_seconds,
                   absent=0.0),
            Expect("loss", ("options", "loss-random", "loss"), s.loss, ("loss",), tc_rounded, absent=0.0)]


NETEM = QdiscKind(
    stage=Netem,
    params=params,
    expected=expected,
    buffer_packets=lambda s, mtu: s.limit_packets,
    probe=("netem", "delay", "1ms"),
    leaf_only=False,
    unseen={"distribution": "tc (iproute2 6.1) prints no distribution, in JSON or text "
                            "(tests/fixtures/tc/netem_jitter_loss)"},
)
