"""From a resolved run template to the typed parts of a RunSpec: host plans, qdisc chains, flows, captures.

Pure functions. Plan units become kernel units here (`Rate` -> bit/s, `Size` -> bytes) and defaults are
filled in (htb burst, per-flow ports and start times), so the engine and the agents never parse text.
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan.derive import htb_burst_bytes, netem_limit_packets, red_bytes
from orchestrator.plan.errors import Path
from orchestrator.plan.runspec import CapturePoint, FlowSpec, HostPlan, LinkRef
from orchestrator.plan.template import (
    ALL_HOSTS,
    BfifoQueue,
    Bottleneck,
    FlowOverride,
    HostSettings,
    HtbStage,
    NetemStage,
    PfifoQueue,
    Queue,
    RedQueue,
    RunTemplate,
    Stage,
    TbfStage,
    Traffic,
)
from schemas.hoststate import Bfifo, Htb, Netem, Pfifo, QdiscStage, Red, Tbf


@dataclass(frozen=True)
class FlowPlan:
    """One flow with every default resolved, plus the template paths its values came from."""

    index: int
    cc: str
    src: str
    dst: str
    start_ns: int
    duration_ns: int | None      # None: until the run ends
    port: int
    start_path: Path
    duration_path: Path
    port_path: Path
    src_path: Path
    dst_path: Path


def flow_plans(tr: Traffic) -> list[FlowPlan]:
    """Flow i starts at start + i x stagger and listens on base_port + i unless `per_flow` says otherwise."""
    out = []
    for i in range(tr.flows):
        o = tr.per_flow.get(i, FlowOverride())
        pf: Path = ("traffic", "per_flow", i)

        def origin(name: str, own: object, default: Path, pf: Path = pf) -> Path:
            return pf + (name,) if own is not None else default

        duration = o.duration if o.duration is not None else tr.duration
        out.append(FlowPlan(
            index=i,
            cc=o.cc or tr.cc,
            src=o.src or tr.src,
            dst=o.dst or tr.dst,
            start_ns=o.start.value if o.start is not None else tr.start.value + i * tr.stagger.value,
            duration_ns=duration.value if duration is not None else None,
            port=o.port if o.port is not None else tr.base_port + i,
            start_path=origin("start", o.start, ("traffic", "stagger") if i and tr.stagger.value
                              else ("traffic", "start")),
            duration_path=origin("duration", o.duration, ("traffic", "duration")),
            port_path=origin("port", o.port, ("traffic", "base_port")),
            src_path=origin("src", o.src, ("traffic", "src")),
            dst_path=origin("dst", o.dst, ("traffic", "dst"))))
    return out


def flow_specs(t: RunTemplate) -> list[FlowSpec]:
    run_ns = t.duration.value
    return [FlowSpec(flow_id=f.index, src=f.src, dst=f.dst, cc=f.cc, start_s=f.start_ns / 1e9,
                     duration_s=(f.duration_ns if f.duration_ns is not None else run_ns - f.start_ns) / 1e9,
                     port=f.port, tool="iperf3")
            for f in flow_plans(t.traffic)]


def stage_state(stage: Stage | Queue, mtu: int) -> QdiscStage:
    """One plan stage in kernel units."""
    if isinstance(stage, HtbStage):
        burst = stage.burst.value if stage.burst else htb_burst_bytes(stage.rate.value, mtu)
        return Htb(rate_bit=stage.rate.value, ceil_bit=(stage.ceil or stage.rate).value,
                   burst_bytes=burst, cburst_bytes=stage.cburst.value if stage.cburst else burst)
    if isinstance(stage, TbfStage):
        return Tbf(rate_bit=stage.rate.value, burst_bytes=stage.burst.value, limit_bytes=stage.limit.value)
    if isinstance(stage, PfifoQueue):
        return Pfifo(limit_packets=stage.limit)
    if isinstance(stage, BfifoQueue):
        return Bfifo(limit_bytes=stage.limit.value)
    if isinstance(stage, NetemStage):
        return Netem(delay_ns=stage.delay.value, limit_packets=stage.limit)
    raise TypeError(f"no host-state form for {type(stage).__name__}")  # new stage kinds must be added here


def bottleneck_chain(b: Bottleneck, mtu: int) -> list[QdiscStage]:
    """[netem ->] htb (rate = ceil, burst = cburst) -> the plan's explicit leaf queue."""
    rate = b.rate.value
    burst = b.burst.value if b.burst else htb_burst_bytes(rate, mtu)
    chain: list[QdiscStage] = []
    limit = netem_limit_packets(b, mtu)
    if b.delay is not None and limit is not None:
        chain.append(Netem(delay_ns=b.delay.value, limit_packets=limit))
    chain.append(Htb(rate_bit=rate, ceil_bit=rate, burst_bytes=burst, cburst_bytes=burst))
    if isinstance(b.queue, RedQueue):
        r = red_bytes(b.queue, rate, mtu)
        chain.append(Red(limit_bytes=r.limit_bytes, min_bytes=r.min_bytes, max_bytes=r.max_bytes,
                         avpkt_bytes=r.avpkt_bytes, burst_packets=r.burst_packets, probability=r.probability,
                         bandwidth_bit=rate, ecn=b.queue.ecn, adaptive=b.queue.adaptive))
    else:
        chain.append(stage_state(b.queue, mtu))
    return chain


def merged_settings(hosts: dict[str, HostSettings], role: str) -> HostSettings:
    """`all` merged with the role's own settings; the role wins key by key."""
    base = hosts.get(ALL_HOSTS, HostSettings())
    own = hosts.get(role, HostSettings())
    flush = own.flush_tcp_metrics if own.flush_tcp_metrics is not None else base.flush_tcp_metrics
    return HostSettings(sysctls={**base.sysctls, **own.sysctls}, offloads={**base.offloads, **own.offloads},
                        flush_tcp_metrics=flush, qdiscs={**base.qdiscs, **own.qdiscs})


def host_plans(t: RunTemplate, roles: list[str]) -> dict[str, HostPlan]:
    mtu = t.mtu.value
    out = {}
    for role in roles:
        s = merged_settings(t.hosts, role)
        chains = {toward: [stage_state(st, mtu) for st in stages] for toward, stages in s.qdiscs.items()}
        if t.bottleneck is not None and t.bottleneck.at.host == role:
            chains[t.bottleneck.at.toward] = bottleneck_chain(t.bottleneck, mtu)
        out[role] = HostPlan(sysctls=dict(s.sysctls), offloads=dict(s.offloads), qdiscs=chains,
                             flush_tcp_metrics=s.flush_tcp_metrics if s.flush_tcp_metrics is not None else True)
    return out


def capture_points(t: RunTemplate) -> list[CapturePoint]:
    return [CapturePoint(link=LinkRef(host=c.host, toward=c.toward), snaplen=c.snaplen.value)
            for c in t.captures]


def qdisc_stat_links(t: RunTemplate) -> tuple[list[LinkRef], int]:
    """Links to poll and the interval in whole milliseconds (checks.py refuses other intervals)."""
    if t.qdisc_stats is None:
        return [], 10
    return ([LinkRef(host=ln.host, toward=ln.toward) for ln in t.qdisc_stats.links],
            max(1, t.qdisc_stats.interval.value // 10**6))
