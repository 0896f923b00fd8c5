"""The run template: what one run looks like before the matrix varies it (the `run:` section of a plan).

Every field is unit-typed (`Rate`, `Time`, `Size`, `Fraction`) and documented with a description and an
example; `schemas/plan.schema.json` is generated from these models. Only single-field rules live here
(types, units, ranges, names); rules that relate fields (a flow longer than the run, an unknown role) are
in `orchestrator.plan.checks`, so they can name the exact field at fault.
"""
from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, StringConstraints

from orchestrator.plan.model.conditions import AckPolicy, Analysis, Event
from orchestrator.plan.model.fields import Strict, _f
from orchestrator.plan.model.names import RoleName, VariantName
from orchestrator.plan.model.qdiscs import (  # noqa: F401 - re-exported: the stage models are part of the template
    BfifoQueue,
    HtbStage,
    NetemStage,
    PfifoQueue,
    Queue,
    RedQueue,
    Stage,
    TbfStage,
)
from orchestrator.plan.model.quantities import PositiveSize, PositiveTime, Rate, Size, Time
from orchestrator.plan.model.traffic import Traffic

ModuleName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,55}$")]
ParamKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")]  # dctcp_chirp_L
SysctlName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*(\.[A-Za-z0-9_-]+)+$")]
# ethtool -K short names; an allow-list catches typos such as `tro` (docs/guards.md#g-sysctl).
OffloadName = Literal["tso", "gso", "gro", "lro", "sg", "tx", "rx", "tx-gso-partial",
                      "rx-gro-list", "rx-udp-gro-forwarding", "rxvlan", "txvlan", "ntuple", "rxhash"]
# ethtool -C parameters (integers; adaptive-*/cqe-mode-* on/off)
CoalesceName = Literal["rx-usecs", "rx-frames", "rx-usecs-irq", "rx-frames-irq", "tx-usecs", "tx-frames",
                       "tx-usecs-irq", "tx-frames-irq", "adaptive-rx", "adaptive-tx", "cqe-mode-rx",
                       "cqe-mode-tx", "stats-block-usecs", "sample-interval", "pkt-rate-low", "pkt-rate-high",
                       "rx-usecs-low", "rx-frames-low", "tx-usecs-low", "tx-frames-low", "rx-usecs-high",
                       "rx-frames-high", "tx-usecs-high", "tx-frames-high"]
PauseName = Literal["autoneg", "rx", "tx"]
HostOSName = Literal["linux", "freebsd"]
ALL_HOSTS = "all"
GuardId = Literal["G-NETEM", "G-HTB", "G-OFFLOAD", "G-SOCKBUF", "G-TSQ"]


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
    target: PositiveTime | None = _f(
        None, "queue delay the AQM aims for; the per-flow window uses base_rtt + target (default: the "
        "AQM's lower threshold, e.g. RED min or the step K, or its target)", "500us")
    line_rate: Rate | None = _f(None, "speed of the interface: the rate netem sees before the shaper "
                                "(sizes the netem limit); checked against the speed the NIC reports, where a "
                                "physical NIC reports one (G-NIC)", "1gbit")
    netem_limit: int | None = _f(None, "netem limit in packets; default derived (1.5 x line rate x delay / "
                                 "MTU + the leaf's buffer in packets)", 1000, unit="packets", gt=0,
                                 le=10_000_000)


class HostSection(Strict):
    """The `hosts.<role>` section of a run template, as the plan writes it (units, the `all` key); the
    expansion merges `all` with each role's own section into that role's `HostSpec`."""

    # added after plans had results: out of the run hash while at their default (see RunTemplate)
    HASH_SKIP_IF_DEFAULT: ClassVar[frozenset[str]] = frozenset({"coalesce", "pause", "static_neighbours", "os"})

    sysctls: dict[SysctlName, SysctlValue] = _f(
        {}, "sysctl name -> value; note that net.core.* is not writable inside a network namespace",
        {"net.ipv4.tcp_ecn": 1, "net.ipv4.tcp_rmem": "4096 131072 8388608"})
    offloads: dict[OffloadName, bool] = _f(
        {}, "ethtool -K feature -> on/off, applied to every data interface of the host",
        {"tso": False, "gso": False, "gro": False, "sg": False})
    flush_tcp_metrics: bool | None = _f(None, "flush the TCP metrics cache before the run (default on)",
                                        True)
    coalesce: dict[CoalesceName, int | bool] = _f(
        {}, "ethtool -C interrupt coalescing on every data interface (0/off = none; a driver without "
        "coalescing satisfies 'off' and the run records that)", {"rx-usecs": 0, "tx-usecs": 0})
    pause: dict[PauseName, bool] = _f(
        {}, "ethtool -A pause frames on every data interface (a driver without pause frames satisfies 'off')",
        {"autoneg": False, "rx": False, "tx": False})
    static_neighbours: bool | None = _f(
        None, "make every data-path peer a `nud permanent` neighbour before the run (G-ARP; default on)", True)
    os: HostOSName | None = _f(
        None, "operating system the host must run (its agent reports it at hello, G-HETERO); default: whatever it "
        "runs, recorded. The agent's mechanisms (tc, ethtool, tracefs, netlink) are Linux-only: a plan naming "
        "freebsd is refused", "linux")
    kernel: VariantName | None = _f(
        None, "kernel variant the host must run (a key of the plan's `kernels`); default: whatever it runs, "
        "recorded", "vanilla-5.0.0")
    module_params: dict[ModuleName, dict[ParamKey, SysctlValue]] = _f(
        {}, "kernel module -> parameter -> value: a module that is not loaded is loaded with them (insmod from the "
        "agent's --module-dir or modprobe, `name=value`; `{}` loads it with its defaults), else they are written to "
        "/sys/module/<m>/parameters; read back from there and checked before the run, unloaded at reset",
        {"tcp_dctcp": {"dctcp_shift_g": 4}, "tcp_cubic": {"beta": 850}})
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


class SsPolling(Strict):
    """Per-socket TCP state from `ss -tinH` on the senders, polled for the whole run."""

    interval: PositiveTime = _f("100ms", "polling interval (whole milliseconds, 10ms to 10s; one poll runs "
                                "`ss` once, about 5-8 ms of a core)", "100ms", validate_default=True)


class RunTemplate(Strict):
    """One run before matrix substitution; every matrix axis names a dotted path into this model."""

    # Fields added after plans had results: left out of the run hash while at their default, so the run
    # ids (and "already complete" in a results DB) of every existing plan stay what they were.
    HASH_SKIP_IF_DEFAULT: ClassVar[frozenset[str]] = frozenset({"ss"})

    duration: PositiveTime = _f(..., "run length from T0 (flows, captures and pollers fit inside it)",
                                "40s")
    base_rtt: PositiveTime | None = _f(
        None, "base RTT of the path, stated by the plan (used for BDP and per-flow windows; the netns "
        "lab has no delay emulation)", "300us")
    mtu: Size = _f(1500, "MTU of the data path (frame on the wire = mtu + 14), set on every data interface of "
                   "every host and read back", 1500,
                   validate_default=True)
    bottleneck: Bottleneck | None = _f(None, "the shaped bottleneck link", {
        "at": {"host": "aqm", "toward": "client"}, "rate": "20mbit",
        "queue": {"kind": "pfifo", "limit": 100}})
    traffic: Traffic = _f(..., "the TCP flows of the run", {
        "src": "server", "dst": "client", "cc": "cubic", "flows": 1})
    hosts: dict[Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,31}$")], HostSection] = _f(
        {}, "host settings by role; the key `all` applies to every role (role settings win per key)",
        {"all": {"sysctls": {"net.ipv4.tcp_sack": 1}}})
    captures: list[Capture] | None = _f(
        None, "packet capture points; default: both sides of the bottleneck host (toward the bottleneck and "
        "toward the flows' other end), paired for per-packet queue delay; [] captures nothing",
        [{"host": "aqm", "toward": "client"}])
    qdisc_stats: QdiscStats | None = _f(None, "qdisc statistics polling",
                                        {"links": [{"host": "aqm", "toward": "client"}], "interval": "10ms"})
    background: list[Traffic] = _f(
        [], "further flow groups of the run (a greedy background flow, UDP load); their flow ids and "
        "ports follow the main traffic's", [{"src": "server", "dst": "client", "cc": "dctcp", "flows": 1,
                                             "base_port": 5401}])
    ack_policy: AckPolicy | None = _f(None, "receiver ACK policy and how it is put in place (G-ACK); "
                                      "default: the stack's own, recorded", {"mode": "per_segment",
                                                                           "mechanism": "quickack_route"})
    events: list[Event] = _f([], "timed actions during the run (G-FAULT)", [
        {"at": "20s", "action": "ack_blackout", "host": "receiver", "toward": "aqm", "duration": "1s"}])
    analysis: Analysis = _f(Analysis(), "analysis windows stored with the run (G-WINDOW)",
                            {"warmup": "2s", "bin": "10ms"})
    tcp_probe: bool = _f(True, "record the tcp:tcp_probe tracepoint on the senders", True)
    ss: SsPolling | None = _f(None, "poll `ss -tinH` on the senders: cwnd, ssthresh, rtt, pacing and delivery "
                              "rate, retransmissions, DCTCP alpha, BBR state per socket (table ss_sample)",
                              {"interval": "100ms"})
    accept_guards: list[GuardId] = _f(
        [], "pitfall guards this run is meant to trip (the experiment studies the pitfall itself); they are "
        "recorded as flags instead of refusing the run", ["G-NETEM"])
