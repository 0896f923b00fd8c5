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


QdiscStage = Annotated[Htb | Tbf | Pfifo | Bfifo | Netem | Red, Field(discriminator="kind")]

CLASSFUL_KINDS = frozenset({"htb"})


class InterfaceState(_Strict):
    """State of one data interface. `qdiscs` is the chain from the root down, in plan order."""

    offloads: dict[str, bool] = Field(default_factory=dict, description="ethtool -K short names")
    qdiscs: list[QdiscStage] = Field(default_factory=list)


class HostState(_Strict):
    sysctls: dict[str, str] = Field(default_factory=dict, description="dotted sysctl name -> value")
    interfaces: dict[str, InterfaceState] = Field(default_factory=dict)
    flush_tcp_metrics: bool = True
