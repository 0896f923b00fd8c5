"""kernel_trace on the labs: the plan field -> the sender's agent traces its kernel in a private tracefs
instance -> kernel_trace rows in the run's database, a G-PROBE flag, and nothing left in tracefs.

- netns lab (this machine's kernel: tracepoints, no kprobe_events): the `tcp:tcp_probe` tracepoint, filtered on
  the flow's port, recorded by kernel_trace counts exactly the hits the run's own tcp_probe sampler (another
  instance, same filter) recorded; `timer:hrtimer_expire_entry` fires; trace_printk asked and nothing printed ->
  no printk rows. A plan timing a function is refused before any host is touched, naming kprobe_events.
- VM lab (the sender a Debian 6.1 guest): a kprobe + kretprobe pair times every tcp_write_xmit of an iperf3
  flow; the DB holds thousands of durations of µs under TCG.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text

from orchestrator.storage.db import open_db
from tests.lab.conftest import one_flow_plan, run_lab_plan, run_plan_quietly, stored_flags, vm_lab_up

PREFIX = os.environ.get("TCPLAB_TEST_PREFIX", "tcplabtest")
TRACEFS = Path("/sys/kernel/tracing")


def own_leftovers() -> list[str]:
    """kernel-trace instances (the lab's agents name them `<prefix>-kt-...`; in-process tasks `tcplab-kt-...`) and
    tcplab kprobe events on this machine's tracefs (the netns lab's agents share it)."""
    inst = [p.name for p in (TRACEFS / "instances").iterdir() if p.name.startswith((f"{PREFIX}-kt-", "tcplab-kt-"))]
    kp = TRACEFS / "kprobe_events"
    events = [ln for ln in kp.read_text().splitlines() if "tcplab/" in ln] if kp.exists() else []
    return inst + events


def kt_plan(tmp: Path, name: str, kernel_trace: str, duration: str = "3s", tags: str = "smoke, timing") -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(one_flow_plan(name, "kernel_trace lab test", duration=duration, tags=tags,
                                  run_extra=kernel_trace))
    return path


NETNS_TRACE = """  kernel_trace:
    hosts: [server]
    trace_printk: true
    tracepoints:
      - timer:hrtimer_expire_entry
      - {name: "tcp:tcp_probe", filter: "dport == 5201"}   # the run's tcp_probe sampler's filter
    buffer: 4MiB
"""


def test_netns_tracepoints_on_the_run_clock_and_no_printk(lab, tmp_path):
    _, state_dir = lab
    before = own_leftovers()
    engine = run_lab_plan(kt_plan(tmp_path, "kt-netns", NETNS_TRACE), state_dir, tmp_path)
    with engine.connect() as conn:
        (run_id, key, t0, status), = conn.execute(text("SELECT run_id, run_key, t0_ns, status FROM run")).all()
        rows = conn.execute(text("SELECT host, ts_ns, source, event, duration_ns, value, text FROM kernel_trace "
                                 "WHERE run_id = :r ORDER BY ts_ns"), {"r": run_id}).all()
        sampler = conn.execute(text("SELECT count(*) FROM tcp_probe WHERE run_key = :k"), {"k": key}).scalar()
        meta = conn.execute(text("SELECT meta FROM artifact WHERE run_id = :r AND kind = 'kernel_trace'"),
                            {"r": run_id}).scalar()
    assert status == "complete"
    by_event = {e: [r for r in rows if r.event == e] for e in {r.event for r in rows}}
    print(f"kernel_trace rows: { {e: len(v) for e, v in by_event.items()} }, tcp_probe sampler rows {sampler}; "
          f"meta {meta}")
    probe = by_event.get("tcp:tcp_probe", [])
    assert len(probe) > 100 and all("5201" in r.text for r in probe)
    assert len(probe) == sampler       # the same tracepoint and filter in two instances: the same hits
    assert len(by_event.get("timer:hrtimer_expire_entry", [])) > 10
    assert {r.host for r in rows} == {"server"} and {r.source for r in rows} == {"tracepoint"}
    assert not [r for r in rows if r.source == "printk"]          # trace_printk asked, nothing printed it
    assert all(r.duration_ns is None and r.value is None for r in rows)
    # on the run's clock: inside [T0 - 2 s, T0 + 3 s + 2 s] (lead and tail of the samplers)
    assert t0 - 2e9 < rows[0].ts_ns and rows[-1].ts_ns < t0 + 5e9
    flags = [f for fs in stored_flags(engine).values() for f in fs if f.guard == "G-PROBE"]
    assert len(flags) == 1 and flags[0].host == "server" and "timing run" in flags[0].message
    assert own_leftovers() == before                                # instance and events removed


def test_netns_function_timing_is_refused_without_kprobe_events(lab, tmp_path):
    _, state_dir = lab
    if (TRACEFS / "kprobe_events").exists():
        pytest.skip(f"kernel {os.uname().release} has kprobe_events: nothing to refuse here (the VM-lab test times)")
    plan = kt_plan(tmp_path, "kt-refused", "  kernel_trace: {hosts: [server], functions: [tcp_write_xmit]}\n")
    url = f"sqlite:///{tmp_path / 'refused.db'}"
    rc, message = run_plan_quietly(plan, url, state_dir, tmp_path / "results")
    print(message)
    assert rc == 3 and "refused before touching any host" in message
    want = (f"host server (kernel {os.uname().release}) lacks kprobe_events (CONFIG_KPROBE_EVENTS): "
            "kernel_trace.functions tcp_write_xmit cannot be timed by kprobe/kretprobe pairs")
    assert want in message
    with open_db(url).connect() as conn:
        (status, error), = conn.execute(text("SELECT status, error FROM run")).all()
    assert status == "refused" and want in error


@pytest.fixture(scope="module")
def sender_guest(tmp_path_factory):
    """aqm and server (the sender) are guests, the client a namespace."""
    yield from vm_lab_up(tmp_path_factory, f"{PREFIX}kt", ("aqm", "server"))


VM_TRACE = """  kernel_trace:
    hosts: [server]
    functions: [tcp_write_xmit]
    tracepoints: [timer:hrtimer_expire_entry]
    buffer: 8MiB
"""


def test_vm_guest_times_tcp_write_xmit_per_call(sender_guest, tmp_path):
    inv, state_dir = sender_guest
    engine = run_lab_plan(kt_plan(tmp_path, "kt-vm", VM_TRACE, duration="4s", tags="vm-lab, timing"),
                          state_dir, tmp_path)
    with engine.connect() as conn:
        (run_id, t0), = conn.execute(text("SELECT run_id, t0_ns FROM run WHERE status = 'complete'")).all()
        calls = conn.execute(text("SELECT ts_ns, cpu, pid, duration_ns FROM kernel_trace WHERE run_id = :r AND "
                                  "source = 'kprobe' AND event = 'tcp_write_xmit' ORDER BY ts_ns"),
                             {"r": run_id}).all()
        packets = conn.execute(text("SELECT count(*) FROM packet p JOIN conn c ON p.run_key = c.run_key AND "
                                    "p.conn_id = c.conn_id WHERE c.point = 'aqm:to-server' AND c.dst_port = 5201 "
                                    "AND p.payload_len > 0 AND "
                                    "p.run_key = (SELECT run_key FROM run WHERE run_id = :r)"), {"r": run_id}).scalar()
        meta = conn.execute(text("SELECT meta FROM artifact WHERE run_id = :r AND kind = 'kernel_trace'"),
                            {"r": run_id}).scalar()
    d = np.array([c.duration_ns for c in calls], dtype=float)
    print(f"tcp_write_xmit: {len(d)} calls, median {np.median(d) / 1e3:.1f} us, p10 {np.percentile(d, 10) / 1e3:.1f} "
          f"us, p99 {np.percentile(d, 99) / 1e3:.1f} us, max {d.max() / 1e3:.1f} us; data packets captured {packets}; "
          f"meta {meta}")
    assert len(d) > 1000                                     # thousands of calls for a 4 s flow at 20 Mbit/s
    assert np.all(d > 0)
    assert 1_000 < np.median(d) < 1_000_000                  # µs under TCG, not ns and not seconds
    # every data packet the sender put on the wire left through a tcp_write_xmit call (or a retransmission):
    # calls are of the order of the packets, each sending one or a few segments
    assert packets / 20 < len(d) < packets * 5
    assert t0 - 2e9 < calls[0].ts_ns < calls[-1].ts_ns < t0 + 6e9
    flags = [f for fs in stored_flags(engine).values() for f in fs if f.guard == "G-PROBE"]
    assert len(flags) == 1


def test_a_failing_task_leaves_nothing_and_touches_no_other_instance(tmp_path):
    """The runner on this machine's tracefs (root): a filter the kernel refuses fails the task with the kernel's
    error; its instance is gone, and an instance it did not create is untouched."""
    import asyncio
    import time

    from agents.ktrace import KernelTrace
    from schemas.protocol import KernelTraceTask

    if os.geteuid() != 0 or not (TRACEFS / "instances").is_dir():
        pytest.skip("needs root and tracefs at /sys/kernel/tracing")
    foreign = TRACEFS / "instances" / f"{PREFIX}-foreign"
    foreign.mkdir()
    try:
        (foreign / "events/timer/hrtimer_expire_entry/enable").write_text("1")
        now = time.time_ns()
        task = KernelTraceTask(task_id="kernel-trace", start_ns=now, stop_ns=now + 300_000_000,
                               tracepoints=["timer:hrtimer_expire_entry"],
                               filters={"timer:hrtimer_expire_entry": "no_such_field == 1"})
        runner = KernelTrace(task, tmp_path)
        asyncio.run(runner.run())
        assert runner.state == "failed" and "Invalid argument" in runner.detail, runner.detail
        assert not [p for p in (TRACEFS / "instances").iterdir() if p.name.startswith(f"tcplab-kt-{os.getpid()}-")]
        assert (foreign / "events/timer/hrtimer_expire_entry/enable").read_text().strip() == "1"
    finally:
        (foreign / "events/timer/hrtimer_expire_entry/enable").write_text("0")
        foreign.rmdir()


def test_a_stopped_task_reads_out_and_removes_its_instance(tmp_path):
    """Reset stops the tasks (stop_event): tracing ends there, the artifact is written, the instance is gone."""
    import asyncio
    import time

    from agents.ktrace import KernelTrace
    from orchestrator.ingest.ktrace import parse_kernel_trace
    from schemas.protocol import KernelTraceTask

    if os.geteuid() != 0 or not (TRACEFS / "instances").is_dir():
        pytest.skip("needs root and tracefs at /sys/kernel/tracing")
    now = time.time_ns()
    task = KernelTraceTask(task_id="kernel-trace", start_ns=now, stop_ns=now + 600 * 10**9,
                           tracepoints=["timer:hrtimer_expire_entry"])
    runner = KernelTrace(task, tmp_path)

    async def stop_soon() -> None:
        job = asyncio.ensure_future(runner.run())
        await asyncio.sleep(0.5)
        runner.stop_event.set()
        await asyncio.wait_for(job, 30)

    started = time.monotonic()
    asyncio.run(stop_soon())
    assert runner.state == "done" and time.monotonic() - started < 30
    rows = parse_kernel_trace((tmp_path / "kernel-trace.txt").read_bytes(), ["timer:hrtimer_expire_entry"])
    assert len(rows) > 0 and rows["ts_ns"][-1] < time.time_ns()
    assert not [p for p in (TRACEFS / "instances").iterdir() if p.name.startswith(f"tcplab-kt-{os.getpid()}-")]
