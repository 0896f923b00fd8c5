"""The run template: what one run looks like before the matrix varies it (the `run:` section of a plan).

Every field is unit-typed (`Rate`, `Time`, `Size`, `Fraction`) and documented with a description and an
example; `schemas/plan.schema.json` is generated from these models. Only single-field rules live here
(types, units, ranges, names); rules that relate fields (a flow longer than the run, an unknown role) are
in `checks.py`, so they can name the exact field at fault.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints

from orchestrator.plan.quantities import Fraction, PositiveSize, PositiveTime, Rate, Size, Time


class Strict(BaseModel):
    """Base of every plan model: unknown fields are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _f(default: Any, description: str, example: Any, unit: str | None = None, **kw: Any) -> Any:
    """A documented field: every plan field carries a description and an example (the schema shows both);
    plain numbers also name their unit (quantity types carry theirs)."""
    extra = {"unit": unit} if unit else None
    return Field(default, description=description, examples=[example], json_schema_extra=extra, **kw)


RoleName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
CcName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_]{1,32}$")]
SysctlName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*(\.[A-Za-z0-9_-]+)+$")]
# ethtool -K short names; an allow-list catches typos such as `tro` (EXPERIMENTS.md G-SYSCTL).
OffloadName = Literal["tso", "gso", "gro", "lro", "sg", "tx", "rx", "tx-gso-partial",
                      "rx-gro-list", "rx-udp-gro-forwarding", "rxvlan", "txvlan", "ntuple", "rxhash"]
ALL_HOSTS = "all"


def _sysctl_value(v: object) -> str:
    """Sysctl values are written as integers or strings ('4096 131072 8388608'); the kernel wants text."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError("a sysctl value is an integer or a string such as '4096 131072 8388608'")
    text = str(v).strip()
    if not text or "\n" in text:
        raise ValueError("a sysctl value must be one non-empty line")
    return text


SysctlValue = Annotated[str, BeforeValidator(_sysctl_value, json_schema_input_type=int | str)]


class LinkSel(Strict):
    """One data interface, named by its host role and the role of the peer it faces."""

    host: RoleName = _f(..., "role of the host that owns the interface", "aqm")
    toward: RoleName = _f(..., "role of the peer at the other end of the link", "client")


# ------------------------------------------------------------------ qdisc stages (plan units)

class PfifoQueue(Strict):
    kind: Literal["pfifo"] = _f("pfifo", "packet-limited FIFO (tail drop)", "pfifo")
    limit: int = _f(..., "queue limit in packets", 100, unit="packets", gt=0, le=1_000_000)


class BfifoQueue(Strict):
    kind: Literal["bfifo"] = _f("bfifo", "byte-limited FIFO (tail drop)", "bfifo")
    limit: PositiveSize = _f(..., "queue limit in bytes", "150KB")


class HtbStage(Strict):
    kind: Literal["htb"] = _f("htb", "htb root with one default class shaping to `rate`", "htb")
    rate: Rate = _f(..., "class rate", "100mbit")
    ceil: Rate | None = _f(None, "class ceil (default: the rate)", "100mbit")
    burst: PositiveSize | None = _f(None, "class burst (default: rate x 1 ms, at least one frame)", "12500B")
    cburst: PositiveSize | None = _f(None, "class cburst (default: the burst)", "12500B")


class TbfStage(Strict):
    kind: Literal["tbf"] = _f("tbf", "token bucket filter", "tbf")
    rate: Rate = _f(..., "token rate", "50mbit")
    burst: PositiveSize = _f(..., "bucket size", "32KiB")
    limit: PositiveSize = _f(..., "bytes that may wait for tokens", "150KB")


class NetemStage(Strict):
    kind: Literal["netem"] = _f("netem", "netem delay line (e.g. on the ACK path)", "netem")
    delay: Time = _f(..., "constant delay added to every packet", "15ms")
    limit: int = _f(..., "packets netem may hold; needs >= 1.5 x rate x delay / MTU (EXPERIMENTS.md "
                    "G-NETEM), so it is stated explicitly here", 1000, unit="packets", gt=0, le=10_000_000)


class RedQueue(Strict):
    """RED with thresholds in time; expansion converts them to bytes at the bottleneck rate."""

    kind: Literal["red"] = _f("red", "RED marking/dropping queue", "red")
    mode: Literal["ramp", "step"] = _f(
        "ramp", "`ramp`: probability rises from 0 at min to `probability` at max (averaged queue); "
        "`step`: one threshold K = max(rate x min, 2 MTU), marks with probability 1", "ramp")
    min: PositiveTime = _f(..., "lower threshold (ramp) or the step threshold K", "500us")
    max: PositiveTime | None = _f(None, "upper threshold (ramp only; must be above min)", "1500us")
    limit: PositiveTime = _f("200ms", "buffer: hard limit as time at the bottleneck rate", "200ms",
                             validate_default=True)
    probability: Fraction | None = _f(None, "marking probability at max (default: 10% ramp, 1 step)", "10%")
    ecn: bool = _f(True, "mark ECN-capable packets instead of dropping them", True)
    adaptive: bool = _f(False, "adaptive RED (tunes max_p)", True)
    avpkt: PositiveSize | None = _f(None, "average packet size (default: 1000 B ramp, the MTU step)", 1000)
    burst: int | None = _f(None, "burst allowance in packets (default: (2 min + max) / (3 avpkt) for a "
                           "ramp, the smallest tc accepts for a step)", 2, unit="packets", gt=0, le=10**6)


Queue = Annotated[PfifoQueue | BfifoQueue | RedQueue, Field(discriminator="kind")]
Stage = Annotated[HtbStage | TbfStage | PfifoQueue | BfifoQueue | NetemStage, Field(discriminator="kind")]


# ------------------------------------------------------------------ sections

class Bottleneck(Strict):
    """The shaped link on one interface: [netem delay ->] htb at `rate` -> an explicit leaf queue."""

    at: LinkSel = _f(..., "interface that carries the bottleneck (its egress is shaped)",
                     {"host": "aqm", "toward": "client"})
    rate: Rate = _f(..., "bottleneck rate (htb class rate and ceil)", "20mbit")
    burst: PositiveSize | None = _f(
        None, "htb burst and cburst; default derived: rate x 1 ms / 8, at least one frame (mtu + 14)",
        "6250B")
    queue: Queue = _f(..., "leaf queue under the shaper; stated explicitly because htb's default leaf "
                      "holds 1000 packets", {"kind": "pfifo", "limit": 100})
    delay: Time | None = _f(None, "netem delay in front of the shaper (the whole base RTT on this path)",
                            "300us")
    line_rate: Rate | None = _f(None, "speed of the interface: the rate netem sees before the shaper "
                                "(sizes the netem limit)", "1gbit")
    netem_limit: int | None = _f(None, "netem limit in packets; default derived (1.5 x line rate x delay / "
                                 "MTU + the leaf's buffer in packets)", 1000, unit="packets", gt=0,
                                 le=10_000_000)


class FlowOverride(Strict):
    """Settings of one flow that differ from the traffic defaults."""

    cc: CcName | None = _f(None, "congestion control of this flow", "dctcp")
    src: RoleName | None = _f(None, "sending role of this flow", "server")
    dst: RoleName | None = _f(None, "receiving role of this flow", "client")
    start: Time | None = _f(None, "start offset from T0 (replaces start + index x stagger)", "5s")
    duration: PositiveTime | None = _f(None, "how long this flow sends", "10s")
    port: int | None = _f(None, "receiver port of this flow", 5301, ge=1024, le=65535)


class Traffic(Strict):
    """Bulk TCP flows: `flows` identical flows unless `per_flow` overrides some of them."""

    tool: Literal["iperf3"] = _f("iperf3", "traffic generator", "iperf3")
    src: RoleName = _f(..., "sending role", "server")
    dst: RoleName = _f(..., "receiving role", "client")
    cc: CcName = _f(..., "congestion control of every flow (TCP_CONGESTION per socket)", "cubic")
    flows: int = _f(..., "number of flows", 2, unit="flows", ge=1, le=256)
    start: Time = _f("0s", "start offset of flow 0 from T0", "0s", validate_default=True)
    stagger: Time = _f("0s", "interval between successive flow starts ('flow pace'): flow i starts "
                       "at start + i x stagger", "1s", validate_default=True)
    duration: PositiveTime | None = _f(None, "how long each flow sends; default: until the run ends",
                                       "10s")
    base_port: int = _f(5201, "receiver port of flow 0; flow i uses base_port + i", 5201,
                        ge=1024, le=65535)
    per_flow: dict[Annotated[int, Field(ge=0)], FlowOverride] = _f(
        {}, "overrides for single flows, by flow index (0-based)", {1: {"cc": "reno", "start": "5s"}})


class HostSettings(Strict):
    """Host state for one role (or for every role, under the key `all`)."""

    sysctls: dict[SysctlName, SysctlValue] = _f(
        {}, "sysctl name -> value; note that net.core.* is not writable inside a network namespace",
        {"net.ipv4.tcp_ecn": 1, "net.ipv4.tcp_rmem": "4096 131072 8388608"})
    offloads: dict[OffloadName, bool] = _f(
        {}, "ethtool -K feature -> on/off, applied to every data interface of the host",
        {"tso": False, "gso": False, "gro": False, "sg": False})
    flush_tcp_metrics: bool | None = _f(None, "flush the TCP metrics cache before the run (default on)",
                                        True)
    qdiscs: dict[RoleName, list[Stage]] = _f(
        {}, "explicit qdisc chains, root first, keyed by the role the interface faces (the bottleneck "
        "section adds its own chain)", {"server": [{"kind": "pfifo", "limit": 1000}]})


class Capture(Strict):
    """A packet capture on one interface for the whole run."""

    host: RoleName = _f(..., "role of the capturing host", "aqm")
    toward: RoleName = _f(..., "role the captured interface faces", "client")
    snaplen: Size = _f(128, "bytes kept per packet (>= 96 keeps every header)", 128,
                       validate_default=True)


class QdiscStats(Strict):
    """Periodic qdisc statistics (backlog, drops, marks) on some interfaces."""

    links: list[LinkSel] = _f(..., "interfaces to poll", [{"host": "aqm", "toward": "client"}],
                              min_length=1)
    interval: PositiveTime = _f("10ms", "polling interval (whole milliseconds)", "10ms",
                                validate_default=True)


class RunTemplate(Strict):
    """One run before matrix substitution; every matrix axis names a dotted path into this model."""

    duration: PositiveTime = _f(..., "run length from T0 (flows, captures and pollers fit inside it)",
                                "40s")
    base_rtt: PositiveTime | None = _f(
        None, "base RTT of the path, stated by the plan (used for BDP and per-flow windows; the netns "
        "lab has no delay emulation)", "300us")
    mtu: Size = _f(1500, "MTU of the data path (frame on the wire = mtu + 14)", 1500,
                   validate_default=True)
    bottleneck: Bottleneck | None = _f(None, "the shaped bottleneck link", {
        "at": {"host": "aqm", "toward": "client"}, "rate": "20mbit",
        "queue": {"kind": "pfifo", "limit": 100}})
    traffic: Traffic = _f(..., "the TCP flows of the run", {
        "src": "server", "dst": "client", "cc": "cubic", "flows": 1})
    hosts: dict[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}$")], HostSettings] = _f(
        {}, "host settings by role; the key `all` applies to every role (role settings win per key)",
        {"all": {"sysctls": {"net.ipv4.tcp_sack": 1}}})
    captures: list[Capture] = _f([], "packet capture points", [{"host": "aqm", "toward": "client"}])
    qdisc_stats: QdiscStats | None = _f(None, "qdisc statistics polling",
                                        {"links": [{"host": "aqm", "toward": "client"}], "interval": "10ms"})
    tcp_probe: bool = _f(True, "record the tcp:tcp_probe tracepoint on the senders", True)
