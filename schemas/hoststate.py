"""Desired host state: the typed contract of the `apply` op, shared by manager and agents.

Every value is already resolved to kernel units (bit/s, bytes, packets): unit parsing belongs to the
plan layer, so an agent never interprets a human-written string. The qdisc stages of a chain are the
kinds of `schemas.qdiscs` (one module per kind; re-exported here as part of this contract).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.nic import COALESCE_BOOL_NAMES, COALESCE_INT_NAMES, OFFLOAD_LONG_NAMES
from schemas.qdiscs import (  # noqa: F401 - re-exported: the stages are part of the desired state
    Bfifo,
    Cake,
    Codel,
    DualPi2,
    Fq,
    FqCodel,
    FqPie,
    Htb,
    Mark,
    Netem,
    Pfifo,
    Pie,
    QdiscStage,
    Red,
    Tbf,
)
from schemas.qdiscs.base import Strict as _Strict
from schemas.strings import InterfaceName, IPAddress, KernelValue, MacAddress, ModuleName, ParamName, SysctlName

# names ethtool accepts: a key outside them would reach ethtool's argv or a KeyError in the agent
OffloadName = Literal[tuple(OFFLOAD_LONG_NAMES)]  # type: ignore[valid-type]
CoalesceName = Literal[tuple(sorted(COALESCE_INT_NAMES | COALESCE_BOOL_NAMES))]  # type: ignore[valid-type]
CoalesceValue = Annotated[int, Field(ge=0, le=2**32 - 1)] | bool


class InterfaceState(_Strict):
    """State of one data interface. `qdiscs` is the chain from the root down, in plan order."""

    mtu: int | None = Field(default=None, ge=68, le=65535, description="`ip link set dev IF mtu N`; None: left as "
                            "it is")

    offloads: dict[OffloadName, bool] = Field(default_factory=dict, description="ethtool -K short names")
    qdiscs: list[QdiscStage] = Field(default_factory=list)
    coalesce: dict[CoalesceName, CoalesceValue] = Field(
        default_factory=dict, description="ethtool -C parameter -> value (integers; on/off for adaptive-*)")
    pause: dict[Literal["autoneg", "rx", "tx"], bool] = Field(
        default_factory=dict, description="ethtool -A pause-frame settings")
    neighbours: dict[IPAddress, MacAddress] = Field(
        default_factory=dict, description="peer address -> MAC, made `nud permanent` (G-ARP)")
    quickack: bool | None = Field(
        None, description="every route through the interface carries `quickack` (on: the receiver ACKs each "
        "segment, G-ACK); None leaves the routes as they are")


class HostState(_Strict):
    sysctls: dict[SysctlName, KernelValue] = Field(default_factory=dict, description="dotted sysctl name -> value")
    module_params: dict[ModuleName, dict[ParamName, KernelValue]] = Field(
        default_factory=dict, description="module -> parameter -> value (/sys/module/M/parameters/P)")
    interfaces: dict[InterfaceName, InterfaceState] = Field(default_factory=dict)
    flush_tcp_metrics: bool = True


def norm_module_param(value: str) -> str:
    """Boolean module parameters read back as Y/N whatever was written (1, y, true): compare as 1/0."""
    v = str(value).strip()
    return {"y": "1", "true": "1", "n": "0", "false": "0"}.get(v.lower(), v)
