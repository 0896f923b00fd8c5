"""RunSpec: one fully resolved run, the output of plan expansion and the input of the run engine.

Hosts are plan roles (`client`, `aqm`, `server`, ...); interfaces are named by the role of the peer
they face (`toward`), so a RunSpec is testbed-independent. The engine resolves roles and `toward`
references against the inventory the lab (or a physical testbed) provides.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.hoststate import QdiscStage


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkRef(_Strict):
    host: str = Field(description="role of the host owning the interface")
    toward: str = Field(description="role of the peer at the other end of the link")

    @property
    def label(self) -> str:
        return f"{self.host}:to-{self.toward}"


class HostPlan(_Strict):
    sysctls: dict[str, str] = Field(default_factory=dict)
    offloads: dict[str, bool] = Field(default_factory=dict, description="applied to every data interface")
    qdiscs: dict[str, list[QdiscStage]] = Field(
        default_factory=dict, description="toward-role -> qdisc chain on that interface")
    flush_tcp_metrics: bool = True


class FlowSpec(_Strict):
    flow_id: int = Field(ge=0)
    src: str = Field(description="sending role")
    dst: str = Field(description="receiving role")
    cc: str
    start_s: float = Field(ge=0, description="offset from T0")
    duration_s: float = Field(gt=0)
    port: int = Field(ge=1024, le=65535, description="receiver port; unique per flow in a run")
    tool: Literal["iperf3"] = "iperf3"


class CapturePoint(_Strict):
    link: LinkRef
    snaplen: int = 128


class RunSpec(_Strict):
    run_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$")
    plan_name: str
    experiment: str
    repetition: int = 0
    seed: int = 0
    params: dict[str, Any] = Field(description="the matrix values that define this run")
    derived: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = Field(gt=0)
    hosts: dict[str, HostPlan]
    flows: list[FlowSpec]
    captures: list[CapturePoint]
    qdisc_stats: list[LinkRef] = Field(default_factory=list)
    qdisc_stats_interval_ms: int = 10
    tcp_probe: bool = True

    @property
    def senders(self) -> list[str]:
        return sorted({f.src for f in self.flows})
