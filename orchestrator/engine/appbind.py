"""The tasks of one app-limited (thin-stream) flow (pure): a sink on the receiver, listening from the run's
start like an iperf3 server, and a writer on the sender. Both children are started as soon as the schedule
arrives (start_ns in the past: a Python process on a loaded host or TCG guest took 2 s to start); the writer
connects once the captures run (so they see the SYN, the stream's ISN), its first write is at the flow's
start, its last before the flow's end."""
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


def app_start_lead_ns(spec: RunSpec) -> int:
    """Extra time between the schedule and T0 for a run with app-limited flows (0 without)."""
    return APP_START_LEAD_NS if any(f.tool == "app_limited" for f in spec.flows) else 0


def writer_seed(run_seed: int, flow_id: int) -> int:
    """The seed of one flow's exponential gaps: the run's seed, distinct per flow (reproducible)."""
    return (run_seed * 1_000_003 + flow_id) % SEED_MODULUS


def app_flow_tasks(spec: RunSpec, f: FlowSpec, dst_addr: str, tl: Timeline) -> list[tuple[str, protocol._TaskBase]]:
    assert f.write_size is not None and f.write_interval_s is not None
    first = tl.t0_ns + round(f.start_s * 1e9)
    spawn = tl.start_ns - SPAWN_EARLY_NS
    sink = protocol.AppSinkTask(task_id=f"app-sink-{f.flow_id}", start_ns=spawn, port=f.port,
                                stop_ns=tl.stop_ns)
    writer = protocol.AppWriterTask(
        task_id=f"app-writer-{f.flow_id}", start_ns=spawn, port=f.port, dst_addr=dst_addr, cc=f.cc,
        nodelay=f.nodelay, write_size=f.write_size, interval_ns=round(f.write_interval_s * 1e9),
        dist=f.write_interval_dist or "fixed", seed=writer_seed(spec.seed, f.flow_id),
        connect_ns=min(first, tl.start_ns + CONNECT_AFTER_START_NS), first_ns=first,
        end_ns=first + round(f.duration_s * 1e9))
    return [(f.dst, sink), (f.src, writer)]
