"""From an instantiated run template to the typed parts of a RunSpec: host specs, qdisc chains, flows,
captures.

Pure functions. Plan units become kernel units here (`Rate` -> bit/s, `Size` -> bytes) and defaults are
filled in (htb burst, per-flow ports and start times), so the engine and the agents never parse text.
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan.expansion.derive import link_refs, netem_limit_packets, red_bytes
from orchestrator.plan.expansion.runspec import (
    AckPolicySpec,
    AnalysisSpec,
    CapturePoint,
    EventSpec,
    FlowSpec,
    HostSpec,
    KernelRef,
    KernelTraceSpec,
    LinkRef,
)
from orchestrator.plan.model.frames import htb_burst_bytes
from orchestrator.plan.model.kernels import KernelVariant
from orchestrator.plan.model.paths import KeyPath
from orchestrator.plan.model.qdiscs import BfifoQueue, MarkQueue, RedQueue
from orchestrator.plan.model.template import ALL_HOSTS, HostSection, RunTemplate
from orchestrator.plan.model.traffic import FlowOverride, Traffic
from schemas.hoststate import Bfifo, Htb, Netem, QdiscStage, Red


@dataclass(frozen=True)
class TemplateFlow:
    """One flow of a run template: its group's values with the per-flow overrides and defaults applied (in
    ns), plus the template paths its values came from (for the checks' messages); becomes a FlowSpec."""

    index: int                   # flow id within the run (groups number on from the main traffic)
    group: int                   # 0 = traffic, k = background[k - 1]
    cc: str
    src: str
    dst: str
    start_ns: int
    duration_ns: int | None      # None: until the run ends
    bytes: int | None
    port: int
    start_path: KeyPath
    duration_path: KeyPath
    port_path: KeyPath
    src_path: KeyPath
    dst_path: KeyPath


_NO_OVERRIDE = FlowOverride()   # frozen; built once, not once per flow


def traffic_groups(t: RunTemplate) -> list[tuple[KeyPath, Traffic]]:
    """The run's flow groups with their template paths: the main traffic first, then `background`."""
    return [(("traffic",), t.traffic)] + [(("background", k), g) for k, g in enumerate(t.background)]


def group_template_flows(tr: Traffic, gp: KeyPath, group: int = 0, first_id: int = 0) -> list[TemplateFlow]:
    """Flow i starts at start + i x stagger and listens on base_port + i unless `per_flow` says otherwise."""
    out = []
    for i in range(tr.flows):
        o = tr.per_flow.get(i, _NO_OVERRIDE)
        pf: KeyPath = gp + ("per_flow", i)

        def origin(name: str, own: object, default: KeyPath, pf: KeyPath = pf) -> KeyPath:
            return pf + (name,) if own is not None else default

        duration = o.duration if o.duration is not None else tr.duration
        size = o.bytes if o.bytes is not None else tr.bytes
        out.append(TemplateFlow(
            index=first_id + i, group=group,
            cc=o.cc or tr.cc,
            src=o.src or tr.src,
            dst=o.dst or tr.dst,
            start_ns=o.start.value if o.start is not None else tr.start.value + i * tr.stagger.value,
            duration_ns=duration.value if duration is not None else None,
            bytes=size.value if size is not None else None,
            port=o.port if o.port is not None else tr.base_port + i,
            start_path=origin("start", o.start, gp + ("stagger",) if i and tr.stagger.value
                              else gp + ("start",)),
            duration_path=origin("duration", o.duration, gp + ("duration",)),
            port_path=origin("port", o.port, gp + ("base_port",)),
            src_path=origin("src", o.src, gp + ("src",)),
            dst_path=origin("dst", o.dst, gp + ("dst",))))
    return out


def template_flows(t: RunTemplate) -> list[TemplateFlow]:
    out: list[TemplateFlow] = []
    for k, (gp, tr) in enumerate(traffic_groups(t)):
        out += group_template_flows(tr, gp, k, len(out))
    return out


def flow_specs(t: RunTemplate) -> list[FlowSpec]:
    run_ns = t.duration.value
    groups = [g for _, g in traffic_groups(t)]
    out = []
    for f in template_flows(t):
        g = groups[f.group]
        out.append(FlowSpec(
            flow_id=f.index, group=f.group, src=f.src, dst=f.dst, cc=f.cc, start_s=f.start_ns / 1e9,
            duration_s=(f.duration_ns if f.duration_ns is not None else run_ns - f.start_ns) / 1e9,
            port=f.port, tool=g.tool, bytes=f.bytes, rate_bit=g.rate.value if g.rate else None,
            write_size=g.write_size.value if g.write_size else None,
            write_interval_s=g.write_interval.seconds if g.write_interval else None,
            write_interval_dist=g.write_interval_dist if g.write_interval_dist == "exponential" else None,
            nodelay=g.nodelay))
    return out


def bottleneck_chain(t: RunTemplate) -> list[QdiscStage]:
    """[netem ->] htb (rate = ceil, burst = cburst) -> the plan's explicit leaf queue."""
    b, refs, mtu = t.bottleneck, link_refs(t), t.mtu.value
    assert b is not None and refs is not None
    rate = b.rate.value
    burst = b.burst.value if b.burst else htb_burst_bytes(rate, mtu)
    chain: list[QdiscStage] = []
    limit = netem_limit_packets(b, refs)
    if b.delay is not None and limit is not None:
        chain.append(Netem(delay_ns=b.delay.value, limit_packets=limit))
    chain.append(Htb(rate_bit=rate, ceil_bit=rate, burst_bytes=burst, cburst_bytes=burst))
    if isinstance(b.queue, RedQueue):
        r = red_bytes(b.queue, refs)
        chain.append(Red(limit_bytes=r.limit_bytes, min_bytes=r.min_bytes, max_bytes=r.max_bytes,
                         avpkt_bytes=r.avpkt_bytes, burst_packets=r.burst_packets, probability=r.probability,
                         bandwidth_bit=rate, ecn=b.queue.ecn, adaptive=b.queue.adaptive, nodrop=b.queue.nodrop))
    elif isinstance(b.queue, MarkQueue):
        chain.append(b.queue.state(mtu, refs.rtt_ns, refs.target_ns))
    elif isinstance(b.queue, BfifoQueue):
        chain.append(Bfifo(limit_bytes=b.queue.limit.in_bytes(rate, refs.rtt_ns)))
    else:
        chain.append(b.queue.state(mtu))
    return chain


def merged_host_section(hosts: dict[str, HostSection], role: str) -> HostSection:
    """`all` merged with the role's own settings; the role wins key by key."""
    base = hosts.get(ALL_HOSTS, HostSection())
    own = hosts.get(role, HostSection())
    def pick(name: str):
        mine = getattr(own, name)
        return mine if mine is not None else getattr(base, name)

    modules = {m: {**base.module_params.get(m, {}), **own.module_params.get(m, {})}
               for m in {**base.module_params, **own.module_params}}
    return HostSection(sysctls={**base.sysctls, **own.sysctls}, offloads={**base.offloads, **own.offloads},
                        coalesce={**base.coalesce, **own.coalesce}, pause={**base.pause, **own.pause},
                        flush_tcp_metrics=pick("flush_tcp_metrics"), static_neighbours=pick("static_neighbours"),
                        qdiscs={**base.qdiscs, **own.qdiscs}, kernel=own.kernel or base.kernel,
                        os=pick("os"),
                        module_params=modules)


def kernel_ref(name: str | None, kernels: dict[str, KernelVariant]) -> KernelRef | None:
    if name is None or name not in kernels:   # checks/run_rules.py reports unknown names
        return None
    v = kernels[name]
    return KernelRef(name=name, vanilla=v.vanilla, release=v.expected_release, sha256=v.content_hash())


def host_specs(t: RunTemplate, roles: list[str], kernels: dict[str, KernelVariant]) -> dict[str, HostSpec]:
    mtu = t.mtu.value
    out = {}
    for role in roles:
        s = merged_host_section(t.hosts, role)
        chains = {toward: [st.state(mtu) for st in stages] for toward, stages in s.qdiscs.items()}
        if t.bottleneck is not None and t.bottleneck.at.host == role:
            chains[t.bottleneck.at.toward] = bottleneck_chain(t)
        out[role] = HostSpec(kernel=kernel_ref(s.kernel, kernels), module_params=s.module_params,
                             sysctls=dict(s.sysctls), offloads=dict(s.offloads), coalesce=dict(s.coalesce),
                             pause=dict(s.pause), qdiscs=chains,
                             flush_tcp_metrics=s.flush_tcp_metrics is not False,
                             static_neighbours=s.static_neighbours is not False, os=s.os)
    return out


def capture_points(t: RunTemplate) -> list[CapturePoint]:
    if t.captures is not None:
        return [CapturePoint(link=LinkRef(host=c.host, toward=c.toward), snaplen=c.snaplen.value)
                for c in t.captures]
    return default_capture_points(t)


def default_capture_points(t: RunTemplate) -> list[CapturePoint]:
    """The bottleneck host's egress toward the bottleneck and its interfaces toward the other ends of the
    flows crossing it: one clock on both sides of the queue, so every packet gets its queue delay."""
    if t.bottleneck is None:
        return []
    host, toward = t.bottleneck.at.host, t.bottleneck.at.toward
    others = sorted({end for f in template_flows(t) if toward in (f.src, f.dst)
                     for end in (f.src, f.dst) if end not in (host, toward)})
    return [CapturePoint(link=LinkRef(host=host, toward=role)) for role in [toward, *others]]


def qdisc_stat_links(t: RunTemplate) -> tuple[list[LinkRef], int]:
    """Links to poll and the interval in whole milliseconds (checks/run_rules.py refuses other intervals)."""
    if t.qdisc_stats is None:
        return [], 10
    return ([LinkRef(host=ln.host, toward=ln.toward) for ln in t.qdisc_stats.links],
            max(1, t.qdisc_stats.interval.value // 10**6))


def ss_interval_ms(t: RunTemplate) -> int | None:
    """The ss polling interval in whole milliseconds, None when the plan does not ask for it."""
    return None if t.ss is None else max(1, t.ss.interval.value // 10**6)


def kernel_trace_spec(t: RunTemplate) -> KernelTraceSpec | None:
    k = t.kernel_trace
    if k is None:
        return None
    return KernelTraceSpec(
        hosts=list(dict.fromkeys(k.hosts)), trace_printk=k.trace_printk,
        tracepoints={tp.name: tp.filter for tp in k.tracepoints},
        kprobes=[f.symbol for f in k.functions if f.method == "kprobe"],
        function_graph=[f.symbol for f in k.functions if f.method == "function_graph"],
        buffer_kib=k.buffer.value // 1024)


def ack_policy_spec(t: RunTemplate) -> AckPolicySpec | None:
    a = t.ack_policy
    if a is None:
        return None
    hosts = a.hosts if a.hosts is not None else sorted({f.dst for f in template_flows(t)})
    return AckPolicySpec(mode=a.mode, mechanism=a.mechanism, segments_per_ack=a.segments_per_ack, hosts=hosts)


def event_specs(t: RunTemplate) -> list[EventSpec]:
    return [EventSpec(at_s=e.at.seconds, action=e.action, host=e.host,
                      link=LinkRef(host=e.host, toward=e.toward) if e.toward is not None else None,
                      duration_s=e.duration.seconds if e.duration else None,
                      delay_ns=e.delay.value if e.delay is not None else None,
                      loss=float(e.loss.value) if e.loss is not None else None,
                      rate_bit=int(e.rate.value) if e.rate is not None else None, group=e.group) for e in t.events]


def analysis_spec(t: RunTemplate) -> AnalysisSpec:
    a = t.analysis
    return AnalysisSpec(warmup_s=a.warmup.seconds, measure_s=a.measure.seconds if a.measure else None,
                        window=a.window, bin_s=a.bin.seconds if a.bin else None, bin_rtts=a.bin_rtts)
