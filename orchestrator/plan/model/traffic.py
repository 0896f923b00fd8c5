"""Flow groups of a run: bulk or byte-limited TCP (iperf3, or tcplab's own `bulk` sender whose flows start
together), UDP load, app-limited thin streams.

A group is `flows` identical flows; flow i starts at start + i x stagger ("flow pace") and listens on
base_port + i unless `per_flow` overrides it. Flow ids number the main group first, then `background`.
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from orchestrator.plan.model.fields import Strict, _f
from orchestrator.plan.model.names import CcName, RoleName
from orchestrator.plan.model.quantities import PositiveSize, PositiveTime, Rate, Time

Tool = Literal["iperf3", "udp", "app_limited", "bulk"]


class FlowOverride(Strict):
    """Settings of one flow that differ from the group's."""

    cc: CcName | None = _f(None, "congestion control of this flow", "dctcp")
    src: RoleName | None = _f(None, "sending role of this flow", "server")
    dst: RoleName | None = _f(None, "receiving role of this flow", "client")
    start: Time | None = _f(None, "start offset from T0 (replaces start + index x stagger)", "5s")
    duration: PositiveTime | None = _f(None, "how long this flow sends", "10s")
    bytes: PositiveSize | None = _f(None, "send this many bytes, then stop", "1MB")
    port: int | None = _f(None, "receiver port of this flow", 5301, ge=1024, le=65535)


class Traffic(Strict):
    """One flow group: `flows` identical flows unless `per_flow` overrides some of them."""

    # fields added after run ids were pinned: left out of the run hash while unset, so those ids stay
    HASH_SKIP_IF_DEFAULT: ClassVar[frozenset[str]] = frozenset({"write_interval_dist"})

    tool: Tool = _f("iperf3", "`iperf3`: greedy or byte-limited TCP; `udp`: constant-rate UDP load "
                    "(iperf3 -u); `app_limited`: a writer that sends `write_size` every `write_interval` "
                    "(thin streams, logs every write); `bulk`: backlogged or byte-limited TCP from tcplab's own "
                    "sender, connected before T0 and released at the flow's start (flows of one host that start "
                    "together start within a fraction of a millisecond)", "iperf3")
    src: RoleName = _f(..., "sending role", "server")
    dst: RoleName = _f(..., "receiving role", "client")
    cc: CcName = _f(..., "congestion control of every flow (TCP_CONGESTION per socket; ignored for udp)",
                    "cubic")
    flows: int = _f(..., "number of flows", 2, unit="flows", ge=1, le=1024)
    start: Time = _f("0s", "start offset of flow 0 from T0", "0s", validate_default=True)
    stagger: Time = _f("0s", "interval between successive flow starts ('flow pace'): flow i starts "
                       "at start + i x stagger", "1s", validate_default=True)
    duration: PositiveTime | None = _f(None, "how long each flow sends; default: until the run ends "
                                       "(or until `bytes` are sent)", "10s")
    bytes: PositiveSize | None = _f(None, "bytes each flow sends before it stops (a short flow, for "
                                    "flow completion times); the flow still ends with the run", "150KB")
    rate: Rate | None = _f(None, "sending rate of each flow (required for udp)", "24mbit")
    write_size: PositiveSize | None = _f(None, "bytes per application write (app_limited)", "50B")
    write_interval: PositiveTime | None = _f(None, "time between application writes (app_limited)", "10ms")
    write_interval_dist: Literal["fixed", "exponential"] | None = _f(
        None, "gaps between application writes (app_limited): `fixed` (default: every `write_interval`) or "
        "`exponential` (i.i.d. gaps of mean `write_interval`, drawn from the run's seed)", "exponential")
    nodelay: bool = _f(False, "TCP_NODELAY (Nagle off)", True)
    base_port: int = _f(5201, "receiver port of flow 0; flow i uses base_port + i", 5201,
                        ge=1024, le=65535)
    per_flow: dict[Annotated[int, Field(ge=0)], FlowOverride] = _f(
        {}, "overrides for single flows, by flow index (0-based)", {1: {"cc": "reno", "start": "5s"}})
