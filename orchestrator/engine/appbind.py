"""The tasks of the app-limited (thin-stream) and `bulk` flows (pure): a sink per flow on the receiver,
listening from the run's start like an iperf3 server; on the sender a writer per app-limited flow, and one
bulk sender per (host, start instant) holding all the bulk flows that start then. The children are started as
soon as the schedule arrives (start_ns in the past: a Python process on a loaded host or TCG guest took 2 s to
start); the writers and senders connect once the captures run (so they see the SYN, the stream's ISN), their
first write is at the flow's start, their last before the flow's end."""
from __future__ import annotations

from typing import TYPE_CHECKING

from schemas import protocol

if TYPE_CHECKING:
    from orchestrator.engine.bind import Timeline
    from orchestrator.plan import RunSpec
    from orchestrator.plan.expansion.runspec import FlowSpec

SEED_MODULUS = 2**63
SPAWN_EARLY_NS = 10_000_000_000   # before the run's start: in the past when the schedule arrives
CONNECT_AFTER_START_NS = 800_000_000   # after the captures start (bind.LEAD_NS before T0)


# The writer and sink are Python processes: in a QEMU TCG guest (9p root) one took ~3.9 s from the schedule
# to its first connect, so a run with app-limited flows starts this much later than the others
APP_START_LEAD_NS = 4_000_000_000


CHILD_TOOLS = ("app_limited", "bulk")   # the tools whose flows are tcplab's own Python children


def app_start_lead_ns(spec: RunSpec) -> int:
    """Extra time between the schedule and T0 for a run with app-limited or bulk flows (0 without)."""
    return APP_START_LEAD_NS if any(f.tool in CHILD_TOOLS for f in spec.flows) else 0


def writer_seed(run_seed: int, flow_id: int) -> int:
    """The seed of one flow's exponential gaps: the run's seed, distinct per flow (reproducible)."""
    return (run_seed * 1_000_003 + flow_id) % SEED_MODULUS


def first_ns(f: FlowSpec, tl: Timeline) -> int:
    return tl.t0_ns + round(f.start_s * 1e9)


def connect_ns(first: int, tl: Timeline) -> int:
    return min(first, tl.start_ns + CONNECT_AFTER_START_NS)


def sink_task(f: FlowSpec, tl: Timeline) -> tuple[str, protocol.AppSinkTask]:
    return f.dst, protocol.AppSinkTask(task_id=f"app-sink-{f.flow_id}", start_ns=tl.start_ns - SPAWN_EARLY_NS,
                                       port=f.port, stop_ns=tl.stop_ns)


def app_flow_tasks(spec: RunSpec, f: FlowSpec, dst_addr: str, tl: Timeline) -> list[tuple[str, protocol._TaskBase]]:
    assert f.write_size is not None and f.write_interval_s is not None
    first = first_ns(f, tl)
    writer = protocol.AppWriterTask(
        task_id=f"app-writer-{f.flow_id}", start_ns=tl.start_ns - SPAWN_EARLY_NS, port=f.port, dst_addr=dst_addr,
        cc=f.cc, nodelay=f.nodelay, write_size=f.write_size, interval_ns=round(f.write_interval_s * 1e9),
        dist=f.write_interval_dist or "fixed", seed=writer_seed(spec.seed, f.flow_id),
        connect_ns=connect_ns(first, tl), first_ns=first, end_ns=first + round(f.duration_s * 1e9))
    return [sink_task(f, tl), (f.src, writer)]


def bulk_tasks(flows: list[FlowSpec], dst_addrs: dict[str, str], tl: Timeline) -> list[tuple[str, protocol._TaskBase]]:
    """A sink per bulk flow, and one sender per (sending host, start instant) holding that instant's flows
    (ordered by flow id), named after its first flow."""
    out: list[tuple[str, protocol._TaskBase]] = [sink_task(f, tl) for f in flows]
    groups: dict[tuple[str, int], list[FlowSpec]] = {}
    for f in sorted(flows, key=lambda f: f.flow_id):
        groups.setdefault((f.src, first_ns(f, tl)), []).append(f)
    for (src, first), group in groups.items():
        out.append((src, protocol.BulkSenderTask(
            task_id=f"bulk-send-{group[0].flow_id}", start_ns=tl.start_ns - SPAWN_EARLY_NS,
            connect_ns=connect_ns(first, tl), first_ns=first,
            flows=[protocol.BulkFlow(port=f.port, dst_addr=dst_addrs[f.dst], cc=f.cc, nodelay=f.nodelay,
                                     bytes=f.bytes, end_ns=first + round(f.duration_s * 1e9)) for f in group])))
    return out
