"""Orchestration overhead, the pure parts: margin sizing from measured RTTs and readiness, the timeline, the
early stop's bookkeeping, a run's phase timings, and the agents' socket checks on real /proc/net/tcp text."""
from __future__ import annotations

from pathlib import Path

import pytest

from agents.sockets import listening, open_connections
from orchestrator.engine import bind, timing
from orchestrator.engine.pipeline import overlap_policy
from orchestrator.inventory import Inventory
from orchestrator.plan import expand, load_plan
from schemas import protocol

ROOT = Path(__file__).resolve().parents[2]
SOCKETS = ROOT / "tests" / "fixtures" / "sockets"
MS = 1_000_000


def _inventory(kind: str = "netns", agent: str = "ws://127.0.0.1:1") -> Inventory:
    """The quickstart chain client - aqm - server."""
    def host(toward: dict[str, str]) -> dict:
        return {"agent": agent, "interfaces": {
            f"to-{t}": {"toward": t, "addr": a, "plen": 24, "peer_addr": "10.0.0.254"} for t, a in toward.items()}}
    return Inventory.model_validate({"kind": kind, "token_file": "/dev/null", "hosts": {
        "client": host({"aqm": "10.0.1.2"}), "server": host({"aqm": "10.0.3.2"}),
        "aqm": host({"client": "10.0.1.1", "server": "10.0.3.1"})}})


@pytest.fixture
def netns_inventory() -> Inventory:
    return _inventory()


@pytest.fixture(scope="module")
def spec():
    return expand(load_plan(ROOT / "experiments" / "quickstart.yaml"))[1]   # reno, 20 Mbit/s, 2 flows


def test_margins_without_measurements_are_the_floors_and_the_first_lead():
    m = timing.size_margins(timing.floors_for("netns"), [], [], [])
    assert (m.schedule_ns, m.lead_ns, m.grace_ns) == (30 * MS, 400 * MS, 30 * MS)
    assert m.start_margin_ns == 430 * MS and m.early_stop


def test_margins_grow_with_the_control_rtt_the_schedule_op_and_readiness():
    floors = timing.floors_for("netns")
    m = timing.size_margins(floors, [100_000, 20 * MS], [5 * MS], [60 * MS, 120 * MS])
    assert m.schedule_ns == 80 * MS                      # 4 x the worst RTT beats 2 x the schedule op
    assert m.lead_ns == 180 * MS                         # 1.5 x the slowest readiness
    m = timing.size_margins(floors, [100_000], [50 * MS], [10 * MS])
    assert m.schedule_ns == 100 * MS and m.lead_ns == 150 * MS   # 2 x schedule op; the lead's floor
    assert timing.size_margins(floors, [], [], [60 * 10**9]).lead_ns == timing.LEAD_CAP_NS


def test_the_vm_lab_keeps_the_old_fixed_values_as_floors():
    m = timing.size_margins(timing.floors_for("vm"), [1 * MS], [10 * MS], [50 * MS])
    assert m.start_margin_ns == 2_000_000_000 and m.lead_ns == 1_200_000_000
    assert timing.floors_for("something-else") == timing.FLOORS["testbed"]


def test_grace_covers_the_path_rtt():
    assert timing.size_margins(timing.floors_for("netns"), [], [], [], base_rtt_ns=80 * MS).grace_ns == 80 * MS


def test_fixed_margins_are_the_reference():
    m = timing.fixed_margins()
    assert m.start_margin_ns == 2_000_000_000 and m.lead_ns == 1_200_000_000 and not m.early_stop


ARTIFACTS = {"aqm": [{"kind": "pcap", "task_id": "capture-0", "meta": {"ready_ns": 1_000 + 70 * MS}},
                     {"kind": "qdisc_stats", "task_id": "qdisc-0", "meta": {}}],
             "client": [{"kind": "iperf3_server", "task_id": "iperf3-server-0",
                         "meta": {"ready_ns": 1_000 + 250 * MS}}]}


def test_ready_latencies_and_late_readiness_from_the_artifacts_meta():
    assert sorted(timing.ready_latencies(ARTIFACTS, 1_000)) == [70 * MS, 250 * MS]
    late = timing.late_ready(ARTIFACTS, t0_ns=1_000 + 200 * MS)
    assert [(role, a["task_id"], ms) for role, a, ms in late] == [("client", "iperf3-server-0", 50.0)]


def test_timeline_with_a_measured_lead_and_tail_bound(spec):
    tl = bind.timeline(spec, 10**18, lead_ns=150 * MS, tail_ns=1_500 * MS)
    assert tl.start_ns == 10**18 - 150 * MS and tl.stop_ns == 10**18 + 5_000 * MS + 1_500 * MS
    assert bind.timeline(spec, 10**18).start_ns == 10**18 - bind.LEAD_NS   # the defaults stay the bounds
    assert bind.flows_s(spec) == 5.0


def test_flow_tasks_and_when_they_are_over(spec, netns_inventory):
    tl = bind.timeline(spec, 10**18)
    tasks = bind.schedule_tasks(spec, netns_inventory, tl)
    ids = bind.flow_task_ids(tasks)
    assert ids == {"server": ["iperf3-client-0", "iperf3-client-1"]}

    def status(*states):
        return {"server": [protocol.TaskStatus(task_id=f"iperf3-client-{i}", kind="iperf3_client", state=s)
                           for i, s in enumerate(states)]}
    assert not bind.flows_over(ids, status("done", "running"))
    assert bind.flows_over(ids, status("done", "failed"))
    assert not bind.flows_over(ids, {})


def test_run_timing_overhead_and_its_line():
    now = iter([0.0, 0.0, 0.2, 5.4, 5.9]).__next__
    t = timing.RunTiming(flows_s=5.0)
    clock = timing.PhaseClock(t, now=now)
    clock.enter("apply")
    clock.enter("flows")
    clock.enter("collect")
    clock.close()
    assert t.phases == pytest.approx({"apply": 0.2, "flows": 5.2, "collect": 0.5})
    assert t.wall_s == pytest.approx(5.9) and t.overhead_s == pytest.approx(0.9)
    assert t.line().startswith("overhead 0.90 s (wall 5.90 s, flows 5 s; ms: apply=200 collect=500")
    assert t.as_json()["overhead_s"] == pytest.approx(0.9)


def test_a_netns_lab_keeps_the_ingest_off_the_flows_and_the_reference_is_serial(netns_inventory):
    assert overlap_policy(netns_inventory, fixed=False) == "between_flows"
    assert overlap_policy(netns_inventory, fixed=True) == "serial"
    # a physical testbed: overlapped fully unless an agent runs on the manager's own machine
    assert overlap_policy(_inventory("testbed", "wss://192.0.2.10:8765"), fixed=False) == "full"
    assert overlap_policy(_inventory("testbed", "wss://127.0.0.1:8765"), fixed=False) == "between_flows"


def test_listening_and_open_connections_on_real_proc_net_tcp():
    listen, running, after = ((SOCKETS / f"proc_net_tcp_{n}.txt").read_text() for n in ("listen", "running", "after"))
    assert listening(listen, 5299) and not listening(listen, 5201)
    assert open_connections(listen, 5299) == 0
    assert open_connections(running, 5299) == 2          # the client's control and data connections
    assert open_connections(after, 5299) == 0            # gone or in TIME_WAIT


def test_a_phase_divided_at_the_last_hosts_step_ends():
    now = iter([0.0, 1.0, 2.0]).__next__
    t = timing.RunTiming()
    clock = timing.PhaseClock(t, now=now)      # began at 0.0
    clock.enter("stop")                        # 1.0
    clock.divide(("stop", "collect", "reset"), [1.1, 1.7])   # now 2.0
    assert t.phases == pytest.approx({"stop": 0.1, "collect": 0.6, "reset": 0.3})
    now2 = iter([0.0, 1.0, 2.0]).__next__
    t2 = timing.RunTiming()
    clock2 = timing.PhaseClock(t2, now=now2)
    clock2.enter("stop")
    clock2.divide(("stop", "collect", "reset"), [0.0, 0.0])  # no host got past its stop: all reset
    assert t2.phases == pytest.approx({"stop": 0.0, "collect": 0.0, "reset": 1.0})
