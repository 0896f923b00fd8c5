"""The bounds the agents enforce (schemas/limits.py), checked on every run of a plan at load time.

An agent refuses a task outside these bounds, but only when the run is scheduled, after the hosts were
configured; the plan loader applies the same constants first, at the field a researcher has to change.
The task counts follow what `orchestrator/engine/bind.py` schedules per host: one CPU sampler, an iperf3
server per flow received and a client per flow sent, the captures and qdisc samplers on the host, and on a
sender one tcp_probe and one ss sampler over the ports of its flows.
"""
from __future__ import annotations

from collections import Counter, defaultdict

from orchestrator.plan.checks.errors import Problem
from orchestrator.plan.expansion.build import TemplateFlow, capture_points, traffic_groups
from orchestrator.plan.model.bounds import MAX_FLOWS_PER_RUN
from orchestrator.plan.model.paths import KeyPath
from orchestrator.plan.model.template import RunTemplate
from orchestrator.plan.model.units import format_rate
from schemas import limits

_SOURCE = "the agents' limit, schemas/limits.py"


def flow_count(t: RunTemplate) -> int:
    """Flows of the run over all its groups, without building them."""
    return sum(tr.flows for _, tr in traffic_groups(t))


def too_many_flows(t: RunTemplate) -> list[Problem]:
    """The plan loader's own bound on one run's flows (checked before the flows are built one by one)."""
    n = flow_count(t)
    if n <= MAX_FLOWS_PER_RUN:
        return []
    return [Problem(("traffic", "flows") if t.traffic.flows * 2 > n else ("background",),
                    f"the run has {n} flows, more than {MAX_FLOWS_PER_RUN} (docs/plans.md#limits)")]


def _interval_ms(ns: int, low: int, high: int, path: KeyPath, what: str) -> list[Problem]:
    if ns % 10**6 or not low <= ns // 10**6 <= high:
        return [Problem(path, f"the {what} polling interval must be whole milliseconds, {low}ms to {high}ms "
                        f"({_SOURCE})")]
    return []


def _tasks_per_host(t: RunTemplate, flows: list[TemplateFlow]) -> Counter[str]:
    tasks: Counter[str] = Counter()
    senders = {f.src for f in flows}
    tools = [tr.tool for _, tr in traffic_groups(t)]
    # a bulk flow's sender is one task per sending host and start instant (engine/appbind.bulk_tasks)
    bulk_senders = {(f.src, f.start_ns) for f in flows if tools[f.group] == "bulk"}
    for f in flows:
        tasks[f.src] += tools[f.group] != "bulk"
        tasks[f.dst] += 1
    for src, _ in bulk_senders:
        tasks[src] += 1
    for cp in capture_points(t):
        tasks[cp.link.host] += 1
    for ln in t.qdisc_stats.links if t.qdisc_stats else []:
        tasks[ln.host] += 1
    for role in senders:
        tasks[role] += int(t.tcp_probe) + int(t.ss is not None)
    for role in t.kernel_trace.hosts if t.kernel_trace else []:
        tasks[role] += 1
    return Counter({role: n + 1 for role, n in tasks.items()})   # + the CPU sampler (one per kernel, at most)


def _largest_group(flows: list[TemplateFlow], role: str) -> KeyPath:
    """The `flows` field of the group with the most flows to or from `role` (the one to change)."""
    by_group = Counter(f.group for f in flows if role in (f.src, f.dst))
    group = by_group.most_common(1)[0][0] if by_group else 0
    return ("traffic", "flows") if group == 0 else ("background", group - 1, "flows")


def _sampler_ports(t: RunTemplate, flows: list[TemplateFlow]) -> list[Problem]:
    if not (t.tcp_probe or t.ss is not None):
        return []
    ports: dict[str, set[int]] = defaultdict(set)
    for f in flows:
        ports[f.src].add(f.port)
    out = []
    for role, mine in sorted(ports.items()):
        if len(mine) > limits.MAX_PORTS_PER_SAMPLER:
            sampler = "tcp_probe" if t.tcp_probe else "ss"
            sent = [f for f in flows if f.src == role]
            out.append(Problem(_largest_group(sent, role), f"{role!r} sends {len(mine)} flows; its {sampler} "
                               f"sampler would follow {len(mine)} ports, more than "
                               f"{limits.MAX_PORTS_PER_SAMPLER} ({_SOURCE})"))
    return out


def agent_limit_problems(t: RunTemplate, flows: list[TemplateFlow]) -> list[Problem]:
    """Problems of one instantiated run with the agents' bounds; `flows` are the run's template flows."""
    out: list[Problem] = []
    if t.duration.value > limits.MAX_RUN_SECONDS * 10**9:
        out.append(Problem(("duration",), f"the run lasts {t.duration.raw}, longer than "
                           f"{limits.MAX_RUN_SECONDS} s ({_SOURCE})"))
    if t.qdisc_stats is not None:
        out += _interval_ms(t.qdisc_stats.interval.value, limits.MIN_SAMPLE_INTERVAL_MS,
                            limits.MAX_SAMPLE_INTERVAL_MS, ("qdisc_stats", "interval"), "qdisc statistics")
    if t.ss is not None:
        out += _interval_ms(t.ss.interval.value, limits.MIN_POLL_INTERVAL_MS, limits.MAX_SAMPLE_INTERVAL_MS,
                            ("ss", "interval"), "ss")
    for gp, tr in traffic_groups(t):
        if tr.tool == "udp" and tr.rate is not None and tr.rate.value > limits.MAX_UDP_RATE_BIT:
            out.append(Problem(gp + ("rate",), f"a UDP flow at {tr.rate.raw} is faster than "
                               f"{format_rate(limits.MAX_UDP_RATE_BIT)} ({_SOURCE})"))
    for role, n in sorted(_tasks_per_host(t, flows).items()):
        if n > limits.MAX_TASKS_PER_SCHEDULE:
            out.append(Problem(_largest_group(flows, role), f"{role!r} would run {n} tasks in this run (its flows, "
                               f"captures and samplers), more than {limits.MAX_TASKS_PER_SCHEDULE} ({_SOURCE})"))
    return out + _sampler_ports(t, flows)
