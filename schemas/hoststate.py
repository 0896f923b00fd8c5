"""Desired host state: the typed contract of the `apply` op, shared by manager and agents.

Every value is already resolved to kernel units (bit/s, bytes, packets): unit parsing belongs to the
plan layer, so an agent never interprets a human-written string.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Htb(_Strict):
    """htb root with one class (1:1, the default class) that shapes to `rate_bit`."""

    kind: Literal["htb"] = "htb"
    rate_bit: int = Field(gt=0, description="class rate, bit/s")
    ceil_bit: int | None = Field(default=None, gt=0, description="class ceil, bit/s (default = rate)")
    burst_bytes: int | None = Field(default=None, gt=0, description="class burst, bytes")
    cburst_bytes: int | None = Field(default=None, gt=0, description="class cburst, bytes")
    quantum_bytes: int | None = Field(default=None, gt=0, description="class quantum, bytes")


class Tbf(_Strict):
    kind: Literal["tbf"] = "tbf"
    rate_bit: int = Field(gt=0)
    burst_bytes: int = Field(gt=0)
    limit_bytes: int = Field(gt=0)


class Pfifo(_Strict):
    kind: Literal["pfifo"] = "pfifo"
    limit_packets: int = Field(gt=0)


class Bfifo(_Strict):
    kind: Literal["bfifo"] = "bfifo"
    limit_bytes: int = Field(gt=0)


class Netem(_Strict):
    """netem delay line; a following stage hangs under its single class (i:1), like htb's."""

    kind: Literal["netem"] = "netem"
    delay_ns: int = Field(ge=0, description="constant delay, ns")
    jitter_ns: int = Field(default=0, ge=0, description="delay variation, ns")
    distribution: Literal["uniform", "normal", "pareto", "paretonormal"] | None = Field(
        default=None, description="jitter distribution (tc's table name)")
    loss: float = Field(default=0.0, ge=0, le=1, description="random loss probability")
    limit_packets: int = Field(gt=0, description="packets netem may hold (its own and, on some kernels, "
                                                 "its child's)")


class Red(_Strict):
    """RED with thresholds already converted to bytes at the bottleneck rate (tc-red parameters)."""

    kind: Literal["red"] = "red"
    limit_bytes: int = Field(gt=0, description="hard queue limit, bytes")
    min_bytes: int = Field(gt=0, description="lower marking threshold, bytes")
    max_bytes: int = Field(gt=0, description="upper marking threshold, bytes (> min)")
    avpkt_bytes: int = Field(gt=0, description="average packet size, bytes")
    burst_packets: int = Field(gt=0, description="burst allowance; sets the EWMA weight")
    probability: float = Field(gt=0, le=1, description="marking probability at max")
    bandwidth_bit: int = Field(gt=0, description="link rate for idle-time averaging, bit/s")
    ecn: bool = Field(default=False, description="mark ECT packets instead of dropping")
    adaptive: bool = Field(default=False, description="adapt max_p (adaptive RED)")
    nodrop: bool = Field(default=False, description="with ecn: queue non-ECT packets instead of dropping them")


class FqCodel(_Strict):
    kind: Literal["fq_codel"] = "fq_codel"
    limit_packets: int | None = Field(default=None, gt=0)
    flows: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0)
    interval_ns: int | None = Field(default=None, gt=0)
    quantum_bytes: int | None = Field(default=None, gt=0)
    ce_threshold_ns: int | None = Field(default=None, gt=0)
    memory_limit_bytes: int | None = Field(default=None, gt=0)
    ecn: bool = True


class Codel(_Strict):
    kind: Literal["codel"] = "codel"
    limit_packets: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0)
    interval_ns: int | None = Field(default=None, gt=0)
    ce_threshold_ns: int | None = Field(default=None, gt=0)
    ecn: bool = False


class Pie(_Strict):
    kind: Literal["pie"] = "pie"
    limit_packets: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0)
    tupdate_ns: int | None = Field(default=None, gt=0)
    alpha: int | None = Field(default=None, ge=0, le=32)
    beta: int | None = Field(default=None, ge=0, le=32)
    ecn: bool = False
    bytemode: bool = False


class FqPie(_Strict):
    kind: Literal["fq_pie"] = "fq_pie"
    limit_packets: int | None = Field(default=None, gt=0)
    flows: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0)
    tupdate_ns: int | None = Field(default=None, gt=0)
    ecn: bool = True


class Cake(_Strict):
    kind: Literal["cake"] = "cake"
    bandwidth_bit: int | None = Field(default=None, gt=0, description="shaper rate; None = unlimited")
    rtt_ns: int | None = Field(default=None, gt=0)
    flow_mode: Literal["flowblind", "srchost", "dsthost", "hosts", "flows", "dual-srchost", "dual-dsthost",
                       "triple-isolate"] | None = None
    diffserv: Literal["besteffort", "diffserv3", "diffserv4", "diffserv8", "precedence"] | None = None
    ack_filter: bool = False
    overhead_bytes: int | None = Field(default=None, ge=-64, le=256)


class DualPi2(_Strict):
    kind: Literal["dualpi2"] = "dualpi2"
    limit_packets: int | None = Field(default=None, gt=0)
    target_ns: int | None = Field(default=None, gt=0, description="classic queue target delay")
    tupdate_ns: int | None = Field(default=None, gt=0)
    step_thresh_ns: int | None = Field(default=None, gt=0, description="L4S queue step threshold")
    coupling_factor: int | None = Field(default=None, gt=0)
    ecn_mask: Literal["l4s_ect", "any_ect"] | None = None
    split_gso: bool | None = None


class Fq(_Strict):
    """fq (per-flow pacing) - in the studies on the sender's egress, as the root qdisc."""

    kind: Literal["fq"] = "fq"
    limit_packets: int | None = Field(default=None, gt=0)
    flow_limit_packets: int | None = Field(default=None, gt=0)
    quantum_bytes: int | None = Field(default=None, gt=0)
    initial_quantum_bytes: int | None = Field(default=None, gt=0)
    maxrate_bit: int | None = Field(default=None, gt=0)
    pacing: bool = True
    ce_threshold_ns: int | None = Field(default=None, gt=0)


class Mark(_Strict):
    """tcplab's `aqm-mark` qdisc (a kernel variant): ECN marking on the instantaneous sojourn or EST."""

    kind: Literal["mark"] = "mark"
    mode: Literal["step", "ramp"]
    min_ns: int = Field(gt=0, description="step threshold, or the ramp's lower end")
    max_ns: int | None = Field(default=None, gt=0, description="ramp upper end (probability 1)")
    metric: Literal["sojourn", "est"] = "sojourn"
    on_dequeue: bool = True
    limit_packets: int = Field(gt=0)


QdiscStage = Annotated[Htb | Tbf | Pfifo | Bfifo | Netem | Red | FqCodel | Codel | Pie | FqPie | Cake | DualPi2
                       | Fq | Mark, Field(discriminator="kind")]

CLASSFUL_KINDS = frozenset({"htb"})


class InterfaceState(_Strict):
    """State of one data interface. `qdiscs` is the chain from the root down, in plan order."""

    offloads: dict[str, bool] = Field(default_factory=dict, description="ethtool -K short names")
    qdiscs: list[QdiscStage] = Field(default_factory=list)
    coalesce: dict[str, int | bool] = Field(
        default_factory=dict, description="ethtool -C parameter -> value (integers; on/off for adaptive-*)")
    pause: dict[Literal["autoneg", "rx", "tx"], bool] = Field(
        default_factory=dict, description="ethtool -A pause-frame settings")
    neighbours: dict[str, str] = Field(
        default_factory=dict, description="peer address -> MAC, made `nud permanent` (G-ARP)")


class HostState(_Strict):
    sysctls: dict[str, str] = Field(default_factory=dict, description="dotted sysctl name -> value")
    module_params: dict[str, dict[str, str]] = Field(
        default_factory=dict, description="module -> parameter -> value (/sys/module/M/parameters/P)")
    interfaces: dict[str, InterfaceState] = Field(default_factory=dict)
    flush_tcp_metrics: bool = True
