"""Rules of one instantiated run, each reported at the field a researcher has to change.

Roles, flows inside the run, ports, traffic tools, bursts, RED thresholds, netem sizing, kernel variants,
ACK policy, events, and the agents' bounds (agent_limits.py: run length, intervals, tasks and ports per
host). All return `Problem`s; none raises.
"""
from __future__ import annotations

from orchestrator.plan.checks.agent_limits import agent_limit_problems, too_many_flows
from orchestrator.plan.checks.app_limited import app_limited_problems
from orchestrator.plan.checks.errors import Problem
from orchestrator.plan.checks.ktrace_rules import kernel_trace_problems
from orchestrator.plan.expansion.build import TemplateFlow, template_flows, traffic_groups
from orchestrator.plan.expansion.derive import LinkRefs, link_refs, red_bytes, red_times
from orchestrator.plan.model.conditions import EVENT_FIELDS
from orchestrator.plan.model.frames import wire_frame_bytes
from orchestrator.plan.model.paths import KeyPath
from orchestrator.plan.model.qdiscs import BfifoQueue, HtbStage, MarkQueue, RedQueue
from orchestrator.plan.model.template import ALL_HOSTS, RunTemplate
from orchestrator.plan.model.units import format_rate, format_time_ns
from schemas import allowlist


def _role(roles: list[str], value: str, path: KeyPath, out: list[Problem]) -> None:
    if value not in roles:
        out.append(Problem(path, f"unknown role {value!r} (roles: {', '.join(roles)})"))


def _link(roles: list[str], host: str, toward: str, path: KeyPath, out: list[Problem]) -> None:
    _role(roles, host, path + ("host",), out)
    _role(roles, toward, path + ("toward",), out)
    if host == toward:
        out.append(Problem(path + ("toward",), "an interface cannot face its own host"))


def _hosts(t: RunTemplate, roles: list[str], out: list[Problem]) -> None:
    for role, settings in t.hosts.items():
        if role != ALL_HOSTS and role not in roles:
            out.append(Problem(("hosts", role), f"unknown role {role!r} (roles: {', '.join(roles)}, or "
                               f"{ALL_HOSTS!r})", at_key=True))
        for name in settings.sysctls:   # an agent refuses them anyway (schemas/allowlist.py): say it here, located
            if not allowlist.plan_may_set_sysctl(name):
                out.append(Problem(("hosts", role, "sysctls", name), f"sysctl {name} is outside "
                                   f"`{allowlist.PLAN_SYSCTL_ROOT}`: a plan configures the network stack only "
                                   "(kernel., vm., fs. could run code as root)", at_key=True))
        for toward, stages in settings.qdiscs.items():
            path: KeyPath = ("hosts", role, "qdiscs", toward)
            if role == ALL_HOSTS:
                out.append(Problem(path, "qdisc chains belong to one interface; set them under a role",
                                   at_key=True))
                continue
            if toward not in roles:
                out.append(Problem(path, f"unknown role {toward!r} (roles: {', '.join(roles)})", at_key=True))
            elif toward == role:
                out.append(Problem(path, "an interface cannot face its own host", at_key=True))
            b = t.bottleneck
            if b is not None and (b.at.host, b.at.toward) == (role, toward):
                out.append(Problem(path, "this interface carries the bottleneck, which sets its qdiscs",
                                   at_key=True))
            for k, st in enumerate(stages):
                if isinstance(st, HtbStage) and st.burst and st.burst.value < wire_frame_bytes(t.mtu.value):
                    out.append(Problem(path + (k, "burst"), "htb burst is smaller than one frame"))
                if isinstance(st, BfifoQueue) and st.limit.value[0] != "bytes":
                    out.append(Problem(path + (k, "limit"), "off the bottleneck a bfifo limit is in bytes (a "
                                       "time or BDP needs the bottleneck rate)"))


def _groups(t: RunTemplate, out: list[Problem]) -> None:
    for gp, tr in traffic_groups(t):
        for k in tr.per_flow:
            if k >= tr.flows:
                out.append(Problem(gp + ("per_flow", k), f"flow {k} does not exist: there are {tr.flows} "
                                   "flows (indices from 0)", at_key=True))
        needs = {"udp": ("rate",), "app_limited": ("write_size", "write_interval")}.get(tr.tool, ())
        for name in needs:
            if getattr(tr, name) is None:
                out.append(Problem(gp + ("tool",), f"tool {tr.tool} needs `{name}`"))
        for name in ("rate", "write_size", "write_interval"):
            if getattr(tr, name) is not None and name not in needs:
                out.append(Problem(gp + (name,), f"`{name}` has no meaning for tool {tr.tool}"))
        if tr.tool not in ("iperf3", "bulk") and tr.bytes is not None:
            out.append(Problem(gp + ("bytes",), "byte-limited flows need tool iperf3 or bulk"))
        out += app_limited_problems(gp, tr, t.duration.value)


def _flows(t: RunTemplate, roles: list[str], flows: list[TemplateFlow], out: list[Problem]) -> None:
    run_ns = t.duration.value
    _groups(t, out)
    ports: dict[int, int] = {}
    for f in flows:
        _role(roles, f.src, f.src_path, out)
        _role(roles, f.dst, f.dst_path, out)
        if f.src == f.dst:
            out.append(Problem(f.dst_path, f"flow {f.index} sends from {f.src!r} to itself"))
        if f.start_ns >= run_ns:
            out.append(Problem(f.start_path, f"flow {f.index} starts at {format_time_ns(f.start_ns)}, "
                               f"not before the run ends ({format_time_ns(run_ns)})"))
        elif f.duration_ns is not None and f.start_ns + f.duration_ns > run_ns:
            out.append(Problem(f.duration_path, f"flow {f.index} would end at "
                               f"{format_time_ns(f.start_ns + f.duration_ns)}, after the run ends at "
                               f"{format_time_ns(run_ns)} (flow longer than the run)"))
        if f.port > 65535:
            out.append(Problem(f.port_path, f"flow {f.index} would listen on port {f.port} (> 65535)"))
        elif f.port in ports:
            out.append(Problem(f.port_path, f"flows {ports[f.port]} and {f.index} share port {f.port}"))
        ports.setdefault(f.port, f.index)


def _red(q: RedQueue, refs: LinkRefs, out: list[Problem]) -> None:
    path: KeyPath = ("bottleneck", "queue")
    rate = refs.rate_bit
    if q.mode in ("ramp", "inst") and q.max is None:
        out.append(Problem(path, f"a RED {q.mode} needs `max` (above `min`)"))
    elif q.mode == "step" and q.max is not None:
        out.append(Problem(path + ("max",), "a step has one threshold, `min` (K); max is set to K + 1 byte"))
    if q.mode == "inst" and q.probability is None:
        out.append(Problem(path, "state `probability` for an instantaneous ramp (the studies leave it "
                           "unstated, so the plan must choose)"))
    if q.nodrop and not q.ecn:
        out.append(Problem(path + ("nodrop",), "nodrop keeps non-ECT packets instead of dropping them when "
                           "RED would mark: it needs `ecn: true`"))
    if q.mode != "ramp" and q.adaptive:
        out.append(Problem(path + ("adaptive",), f"adaptive RED tunes max_p of an averaged ramp; a {q.mode} "
                           "must not adapt"))
    try:
        lo_ns, hi_ns = red_times(q, refs)
        r = red_bytes(q, refs)
    except ValueError as exc:
        out.append(Problem(path, str(exc)))
        return
    if q.mode != "step" and hi_ns is not None:
        if hi_ns <= lo_ns:
            def shown(th: object, ns: int) -> str:
                return str(th) if str(th) == format_time_ns(ns) else f"{th} = {format_time_ns(ns)}"
            out.append(Problem(path + ("max",), f"RED max ({shown(q.max, hi_ns)}) must be above min "
                               f"({shown(q.min, lo_ns)})"))
        elif r.max_bytes <= r.min_bytes:
            out.append(Problem(path + ("max",), f"at {format_rate(rate)} min and max both come to "
                               f"{r.min_bytes} B"))
    if r.limit_bytes < r.max_bytes:
        out.append(Problem(path + ("limit",), f"the buffer ({r.limit_bytes} B at {format_rate(rate)}) is "
                           f"smaller than the upper threshold ({r.max_bytes} B)"))


def _queue(t: RunTemplate, refs: LinkRefs, out: list[Problem]) -> None:
    q, path = t.bottleneck.queue if t.bottleneck else None, ("bottleneck", "queue")
    if isinstance(q, RedQueue):
        _red(q, refs, out)
    elif isinstance(q, MarkQueue):
        if (q.mode == "ramp") != (q.max is not None):
            out.append(Problem(path + ("max",), "a ramp needs `max`; a step has only `min`"))
        try:
            q.state(refs.mtu, refs.rtt_ns, refs.target_ns)
        except ValueError as exc:
            out.append(Problem(path, str(exc)))
    elif isinstance(q, BfifoQueue):
        try:
            q.limit.in_bytes(refs.rate_bit, refs.rtt_ns)
        except ValueError as exc:
            out.append(Problem(path + ("limit",), str(exc)))


def _bottleneck(t: RunTemplate, roles: list[str], out: list[Problem]) -> None:
    b, mtu = t.bottleneck, t.mtu.value
    if b is None:
        return
    _link(roles, b.at.host, b.at.toward, ("bottleneck", "at"), out)
    if b.burst is not None and b.burst.value < wire_frame_bytes(mtu):
        out.append(Problem(("bottleneck", "burst"), f"htb burst {b.burst.value} B is smaller than one "
                           f"frame ({wire_frame_bytes(mtu)} B): the shaper could not send a full packet"))
    refs = link_refs(t)
    if refs is not None:
        _queue(t, refs, out)
    if b.line_rate is not None and b.line_rate.value <= b.rate.value:
        out.append(Problem(("bottleneck", "line_rate"), "the interface is not faster than the bottleneck "
                           "rate: the NIC, not the qdisc, would shape (docs/guards.md#g-nic)"))
    if b.delay is None and b.netem_limit is not None:
        out.append(Problem(("bottleneck", "netem_limit"), "netem_limit without a delay has no netem to size"))
    if b.delay is not None and b.netem_limit is None and b.line_rate is None:
        out.append(Problem(("bottleneck", "delay"), "state line_rate (the interface speed netem sees) or an "
                           "explicit netem_limit, so netem cannot drop packets silently (G-NETEM)"))


def _kernels(t: RunTemplate, kernels: set[str] | None, out: list[Problem]) -> None:
    if kernels is None:
        return
    for role, settings in t.hosts.items():
        if settings.kernel is not None and settings.kernel not in kernels:
            out.append(Problem(("hosts", role, "kernel"), f"no kernel variant {settings.kernel!r} in the plan's "
                               f"`kernels` ({', '.join(sorted(kernels)) or 'none defined'})"))


def _event(t: RunTemplate, roles: list[str], i: int, e, out: list[Problem]) -> None:
    run_ns = t.duration.value
    if e.action == "stop_flows":
        _role(roles, e.host, ("events", i, "host"), out)
        if e.toward is not None:
            out.append(Problem(("events", i, "toward"), "`toward` has no meaning for stop_flows"))
        if e.group is not None and e.host not in {f.src for f in template_flows(t) if f.group == e.group}:
            out.append(Problem(("events", i, "group"), f"{e.host} sends no flow of group {e.group}"))
    elif e.toward is None:
        out.append(Problem(("events", i), f"{e.action} needs `toward` (the interface it acts on)"))
    else:
        _link(roles, e.host, e.toward, ("events", i), out)
    if e.at.value >= run_ns:
        out.append(Problem(("events", i, "at"), f"at {e.at.raw} is not before the run ends "
                           f"({format_time_ns(run_ns)})"))
    need = EVENT_FIELDS[e.action]
    if getattr(e, need) is None:
        out.append(Problem(("events", i), f"{e.action} needs `{need}`"))
    for other in sorted(set(EVENT_FIELDS.values()) - {need}):
        if getattr(e, other) is not None:
            out.append(Problem(("events", i, other), f"`{other}` has no meaning for {e.action}"))
    if e.duration is not None and e.at.value + e.duration.value > run_ns:
        out.append(Problem(("events", i, "duration"), "the event would outlast the run"))


def _conditions(t: RunTemplate, roles: list[str], out: list[Problem]) -> None:
    a = t.ack_policy
    if a is not None:
        fits = {"per_segment": {"quickack_route", "tcp_delayed_acks_sysctl", "module_param"},
                "delayed": {"stock"}, "stretch": {"module_param", "stock"}}[a.mode]
        if a.mechanism not in fits:
            out.append(Problem(("ack_policy", "mechanism"), f"{a.mechanism} cannot give {a.mode} ACKs (use "
                               f"{' or '.join(sorted(fits))})"))
        if (a.mode == "stretch") != (a.segments_per_ack > 1):
            out.append(Problem(("ack_policy", "segments_per_ack"), "stretch ACKs cover more than one segment; "
                               "other modes one"))
        for k, role in enumerate(a.hosts or []):
            _role(roles, role, ("ack_policy", "hosts", k), out)
    run_ns = t.duration.value
    for i, e in enumerate(t.events):
        _event(t, roles, i, e, out)
    w = t.analysis
    if w.bin is not None and w.bin_rtts is not None:
        out.append(Problem(("analysis", "bin_rtts"), "give the bin width as `bin` or as `bin_rtts`, not both"))
    if w.bin_rtts is not None and t.base_rtt is None and (t.bottleneck is None or t.bottleneck.delay is None):
        out.append(Problem(("analysis", "bin_rtts"), "bins in RTTs need `base_rtt` (or a bottleneck delay)"))
    if w.warmup.value + (w.measure.value if w.measure else 0) > run_ns:
        out.append(Problem(("analysis", "measure" if w.measure else "warmup"), "the analysis window ends "
                           f"after the run ({format_time_ns(run_ns)})"))


def run_problems(t: RunTemplate, roles: list[str], kernels: set[str] | None = None) -> list[Problem]:
    """Rules of one instantiated run; paths are relative to the run document. `kernels`: the plan's variant
    names (None skips that check, for the bare template)."""
    out: list[Problem] = []
    _kernels(t, kernels, out)
    _conditions(t, roles, out)
    mtu = t.mtu.value
    if not 68 <= mtu <= 65535:
        out.append(Problem(("mtu",), f"MTU {mtu} is outside 68..65535"))
    _bottleneck(t, roles, out)
    _hosts(t, roles, out)
    out += kernel_trace_problems(t, roles)
    many = too_many_flows(t)   # before the flows are built one by one
    if many:
        out += many
    else:
        flows = template_flows(t)
        _flows(t, roles, flows, out)
        out += agent_limit_problems(t, flows)
    seen: dict[tuple[str, str], int] = {}
    for i, c in enumerate(t.captures or []):
        _link(roles, c.host, c.toward, ("captures", i), out)
        if not 96 <= c.snaplen.value <= 65535:
            out.append(Problem(("captures", i, "snaplen"), "snaplen must be 96..65535 bytes (96 keeps the "
                               "Ethernet, IP and TCP headers with options)"))
        if (c.host, c.toward) in seen:
            out.append(Problem(("captures", i), f"same interface as captures[{seen[(c.host, c.toward)]}]"))
        seen.setdefault((c.host, c.toward), i)
    if t.qdisc_stats is not None:
        for i, ln in enumerate(t.qdisc_stats.links):
            _link(roles, ln.host, ln.toward, ("qdisc_stats", "links", i), out)
    return out
