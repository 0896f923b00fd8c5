"""Desired host state: the typed contract of the `apply` op, shared by manager and agents.

Every value is already resolved to kernel units (bit/s, bytes, packets): unit parsing belongs to the
plan layer, so an agent never interprets a human-written string. The qdisc stages of a chain are the
kinds of `schemas.qdiscs` (one module per kind; re-exported here as part of this contract).
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

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
