"""Binding a RunSpec to a testbed (pure): concrete host states from the inventory, the run's timeline and
the tasks each host runs.

Timeline of one run (all absolute CLOCK_REALTIME ns): captures, tracing, pollers and iperf3 servers
start at T0 - LEAD; flow i's client starts at T0 + start_s; everything passive stops at the last flow's
end + TAIL, so the capture sees the final ACKs and FINs.
"""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.engine import ack_policy
from orchestrator.engine.appbind import CHILD_TOOLS, app_flow_tasks, bulk_tasks
from orchestrator.engine.event_tasks import event_tasks
from orchestrator.engine.ktrace import kernel_trace_task
from orchestrator.guards.cpu import kernel_groups
from orchestrator.inventory import Inventory
from orchestrator.plan import RunSpec
from schemas import protocol
from schemas.hoststate import HostState, InterfaceState
from schemas.tasks import iperf3_connect_timeout_ms

# The defaults (the engine sizes both per run from measurements, engine/timing.py): iperf3 servers must listen
# before the clients connect, and a loaded TCG guest once took more than 0.7 s to start one (the client got
# "Connection refused", which iperf3 -J reports with exit code 0)
LEAD_NS = 1_200_000_000
# the passive tasks' bound after the last flow's end; the engine stops them earlier, once the flows'
# connections are closed (captures run in --immediate-mode: nothing waits for libpcap's block timeout)
TAIL_NS = 1_500_000_000


class BindError(ValueError):
    """The run cannot be bound to this inventory (a role without a host, a peer without a MAC)."""


def host_states(spec: RunSpec, inv: Inventory) -> dict[str, HostState]:
    out = {}
    for role, hp in spec.hosts.items():
        if role not in inv.hosts:
            raise BindError(f"run {spec.run_id}: plan role {role!r} has no host in the inventory")
        entry = inv.hosts[role]
        chains = {entry.iface_toward(toward): list(chain) for toward, chain in hp.qdiscs.items()}
        ifaces = {name: InterfaceState(mtu=spec.mtu, offloads=dict(hp.offloads), coalesce=dict(hp.coalesce),
                                       pause=dict(hp.pause), qdiscs=chains.get(name, []),
                                       neighbours=peer_neighbours(inv, role, name) if hp.static_neighbours else {},
                                       quickack=ack_policy.receiver_quickack(spec, role))
                  for name in entry.interfaces}
        sysctls = {**ack_policy.receiver_sysctls(spec, role), **hp.sysctls}
        out[role] = HostState(sysctls=sysctls, module_params=dict(hp.module_params), interfaces=ifaces,
                              flush_tcp_metrics=hp.flush_tcp_metrics)
    return out


def peer_neighbours(inv: Inventory, role: str, dev: str) -> dict[str, str]:
    """The data-path peers of `role`'s interface `dev` (its link's peer, or every host behind the switch it
    faces) as {address: MAC}, from the inventory (G-ARP)."""
    out = {}
    for addr in inv.hosts[role].interfaces[dev].peer_addrs:
        peer = next((p for host in inv.hosts.values() for p in host.interfaces.values() if p.addr == addr), None)
        if peer is None:
            raise BindError(f"inventory has no host with {addr} (peer of {role} {dev})")
        if not peer.mac:
            raise BindError(f"inventory gives no MAC for {addr} (peer of {role} {dev}): "
                            "static neighbours need it (or set static_neighbours: false)")
        out[peer.addr] = peer.mac.lower()
    return out


@dataclass(frozen=True)
class Timeline:
    t0_ns: int
    start_ns: int
    stop_ns: int


def _last_flow_end_s(spec: RunSpec) -> float:
    return max((f.start_s + f.duration_s for f in spec.flows), default=spec.duration_s)


def timeline(spec: RunSpec, t0_ns: int, lead_ns: int = LEAD_NS, tail_ns: int = TAIL_NS) -> Timeline:
    """`lead_ns`, `tail_ns`: sized per run by the engine (engine/timing.py); the defaults are the bounds a run
    without measurements gets."""
    end_ns = t0_ns + int(_last_flow_end_s(spec) * 1e9)
    return Timeline(t0_ns=t0_ns, start_ns=t0_ns - lead_ns, stop_ns=end_ns + tail_ns)


def flows_s(spec: RunSpec) -> float:
    """The flows' own planned duration: T0 to the last flow's scheduled end."""
    return _last_flow_end_s(spec)


def passive_processes(spec: RunSpec) -> int:
    """The most processes one host starts before T0 for this run (pure): an iperf3 server per flow it
    receives, a tcpdump per capture on it."""
    count: dict[str, int] = {}
    for f in spec.flows:
        if f.tool not in CHILD_TOOLS:
            count[f.dst] = count.get(f.dst, 0) + 1
    for cp in spec.captures:
        count[cp.link.host] = count.get(cp.link.host, 0) + 1
    return max(count.values(), default=0)


def flow_processes(spec: RunSpec) -> int:
    """The most flow processes one host starts at or after T0 for this run (pure): an iperf3 client per flow it
    sends; the bulk sender and the app writers are one process per host whatever their flow count."""
    count: dict[str, int] = {}
    for f in spec.flows:
        count[f.src] = count.get(f.src, 0) + 1 if f.tool not in CHILD_TOOLS else 1
    return max(count.values(), default=0)


def connect_allowance_ns(spec: RunSpec) -> int:
    """How late an iperf3 flow of this run may connect and still run its whole duration (pure): its client's
    connect timeout (schemas/tasks.py), the longest among the run's iperf3 flows; 0 without any."""
    return max((iperf3_connect_timeout_ms(f.duration_s) * 1_000_000 for f in spec.flows
                if f.tool in ("iperf3", "udp")), default=0)


def egress_queue_sites(spec: RunSpec) -> list[tuple[str, str]]:
    """(host, toward) of every qdisc chain on a sender's own egress that a capture follows (pure): no capture
    can see packets enter such a queue, so the queue's tracepoints time them (M-QDELAY, method (a)) and the
    capture after it names their flows."""
    senders = set(spec.senders)
    return sorted({(cp.link.host, cp.link.toward) for cp in spec.captures if cp.link.host in senders
                   and spec.hosts[cp.link.host].qdiscs.get(cp.link.toward)})


QUEUE_TRACEPOINTS = ("net:net_dev_queue", "qdisc:qdisc_dequeue", "net:net_dev_xmit")


FLOW_TASK_KINDS = ("iperf3_client", "app_writer", "bulk_sender")


def flow_task_ids(tasks: dict[str, list]) -> dict[str, list[str]]:
    """Per role, the ids of the tasks that are the flows themselves (the others are passive): the engine
    stops the passive tasks once these are done."""
    out = {role: [t.task_id for t in ts if t.kind in FLOW_TASK_KINDS] for role, ts in tasks.items()}
    return {role: ids for role, ids in out.items() if ids}


def flows_over(flow_ids: dict[str, list[str]], statuses: dict[str, list[protocol.TaskStatus]]) -> bool:
    """Whether every flow task of every role has ended (done or failed), from the roles' `status` answers."""
    if set(flow_ids) - set(statuses):
        return False
    states = {(r, t.task_id): t.state for r, ts in statuses.items() for t in ts}
    return all(states.get((r, i)) in ("done", "failed") for r, ids in flow_ids.items() for i in ids)


CPU_LOAD_INTERVAL_MS = 100


def schedule_tasks(spec: RunSpec, inv: Inventory, tl: Timeline,
                   boot_ids: dict[str, str] | None = None) -> dict[str, list]:
    """Per host role, the protocol tasks of this run. `boot_ids` (role -> the agent's boot_id) places one CPU
    sampler on each kernel the run's hosts share."""
    tasks: dict[str, list] = {role: [] for role in inv.hosts}
    for role in kernel_groups(boot_ids or {r: "" for r in inv.hosts}):
        tasks[role].append(protocol.CpuLoadTask(task_id="cpu-load", start_ns=tl.start_ns, stop_ns=tl.stop_ns,
                                                interval_ms=CPU_LOAD_INTERVAL_MS))
    bulk = [f for f in spec.flows if f.tool == "bulk"]
    for role, task in bulk_tasks(bulk, {f.dst: inv.hosts[f.dst].data_addr for f in bulk}, tl):
        tasks[role].append(task)
    for f in spec.flows:
        if f.tool == "bulk":
            continue
        if f.tool == "app_limited":
            for role, task in app_flow_tasks(spec, f, inv.hosts[f.dst].data_addr, tl):
                tasks[role].append(task)
            continue
        tasks[f.dst].append(protocol.Iperf3ServerTask(task_id=f"iperf3-server-{f.flow_id}",
                                                      start_ns=tl.start_ns, port=f.port))
        tasks[f.src].append(protocol.Iperf3ClientTask(
            task_id=f"iperf3-client-{f.flow_id}", start_ns=tl.t0_ns + int(f.start_s * 1e9), port=f.port,
            dst_addr=inv.hosts[f.dst].data_addr, cc=f.cc, duration_s=f.duration_s, bytes=f.bytes,
            udp_rate_bit=f.rate_bit if f.tool == "udp" else None, nodelay=f.nodelay))
    for i, cp in enumerate(spec.captures):
        iface = inv.hosts[cp.link.host].iface_toward(cp.link.toward)
        tasks[cp.link.host].append(protocol.CaptureTask(task_id=f"capture-{i}", start_ns=tl.start_ns,
                                                        stop_ns=tl.stop_ns, interface=iface,
                                                        snaplen=cp.snaplen))
    for i, (host, toward) in enumerate(egress_queue_sites(spec)):
        tasks[host].append(protocol.QueueTraceTask(task_id=f"queue-trace-{i}", start_ns=tl.start_ns,
                                                   stop_ns=tl.stop_ns, interface=inv.hosts[host].iface_toward(toward)))
    for i, link in enumerate(spec.qdisc_stats):
        iface = inv.hosts[link.host].iface_toward(link.toward)
        tasks[link.host].append(protocol.QdiscStatsTask(task_id=f"qdisc-{i}", start_ns=tl.start_ns,
                                                        stop_ns=tl.stop_ns, interface=iface,
                                                        interval_ms=spec.qdisc_stats_interval_ms))
    for role in spec.senders:
        mine = [f for f in spec.flows if f.src == role]
        ports = sorted({f.port for f in mine})
        if spec.tcp_probe:
            tasks[role].append(protocol.TcpProbeTask(task_id="tcp-probe", start_ns=tl.start_ns,
                                                     stop_ns=tl.stop_ns, ports=ports))
        if spec.ss_interval_ms:
            tasks[role].append(protocol.SsSampleTask(
                task_id="ss-sample", start_ns=tl.start_ns, stop_ns=tl.stop_ns, interval_ms=spec.ss_interval_ms,
                ports=ports, dst_addrs=sorted({inv.hosts[f.dst].data_addr for f in mine})))
    if spec.kernel_trace is not None:
        for role in spec.kernel_trace.hosts:
            tasks[role].append(kernel_trace_task(spec.kernel_trace, tl.start_ns, tl.stop_ns))
    for role, events in event_tasks(spec, inv, tl.t0_ns).items():
        tasks[role].extend(events)
    return {role: t for role, t in tasks.items() if t}


def capture_point_names(spec: RunSpec, inv: Inventory) -> dict[tuple[str, str], str]:
    """(host, interface) -> capture point label, e.g. ("aqm", "to-client") -> "aqm:to-client"."""
    return {(cp.link.host, inv.hosts[cp.link.host].iface_toward(cp.link.toward)): cp.link.label
            for cp in spec.captures}
