"""Orchestration overhead on the netns lab (issue 17, item 6): two short runs back to back with
RunEngine.run_many, each run's ingest overlapped with the next run. Per run: the overhead (wall time minus
the flows' planned duration) within a test bound looser than bench/run_overhead.py's 1 s target (the CI
machine may be loaded), the captures complete (no drops; every flow's SYN, its end and the iperf3 control
connection's close in every capture), and the start skew stored for every flow."""
from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa

from bench.capture_check import flow_ends
from orchestrator.engine.runner import RunEngine
from orchestrator.plan import expand, load_plan_text
from orchestrator.storage.db import open_db
from tests.lab.conftest import one_flow_plan

OVERHEAD_BOUND_S = 1.5
CAPTURES = """  captures:
    - {host: aqm, toward: client}
    - {host: aqm, toward: server}
  tcp_probe: true
"""


def _campaign(inv, tmp_path, attempt: int):
    plan = one_flow_plan("overhead", "two short runs back to back", duration="2s", repetitions=2,
                         run_extra=CAPTURES)
    specs = expand(load_plan_text(plan, "overhead.yaml"))
    assert len(specs) == 2
    db = open_db(f"sqlite:///{tmp_path / f'overhead-{attempt}.db'}")
    seen = []

    async def go():
        async with RunEngine(inv, db, tmp_path / f"results-{attempt}") as engine:
            return await engine.run_many([(s, None) for s in specs], seen.append)

    outcomes = asyncio.run(go())
    for o in outcomes:
        print(f"{o.run_id} {o.status}: {o.timing.line() if o.timing else '-'} flags {[str(f) for f in o.flags]}")
    assert [o.run_id for o in outcomes] == [s.run_id for s in specs] == [o.run_id for o in seen]
    return db, specs, outcomes


def test_two_runs_back_to_back_within_the_overhead_bound_with_complete_captures(lab, tmp_path):
    inv, _ = lab
    for attempt in range(2):
        db, specs, outcomes = _campaign(inv, tmp_path, attempt)
        assert all(o.status == "complete" for o in outcomes), [o.error for o in outcomes]
        slow = [o for o in outcomes if o.timing.overhead_s > OVERHEAD_BOUND_S]
        loaded = [o.run_id for o in outcomes if any(f.guard == "G-CPULOAD" for f in o.flags)]
        if not slow:
            break
        if not loaded:
            pytest.fail(f"overhead above {OVERHEAD_BOUND_S} s on an unloaded machine: "
                        + "; ".join(f"{o.run_id}: {o.timing.line()}" for o in slow))
        print(f"attempt {attempt + 1}: over the bound while G-CPULOAD flagged {loaded}: once more")
    else:
        pytest.skip(f"G-CPULOAD flagged the lab machine in both attempts and the overhead was above "
                    f"{OVERHEAD_BOUND_S} s: {[o.timing.line() for o in slow]}")
    with db.connect() as conn:
        runs = conn.execute(sa.text("SELECT run_id, timing FROM run")).all()
        points = conn.execute(sa.text("SELECT run_id, point, captured, received_by_filter, dropped_by_kernel, "
                                      "records FROM capture_point")).all()
        flows = conn.execute(sa.text("SELECT run_id, flow_id, scheduled_start_ns, measured_start_ns, start_skew_ns, "
                                     "start_point FROM flow")).all()
    # the timings are stored with the run, the last one with the campaign's wait for its ingest
    timings = {r.run_id: json.loads(r.timing) if isinstance(r.timing, str) else r.timing for r in runs}
    assert all(t["overhead_s"] <= OVERHEAD_BOUND_S and "collect" in t["phases"] for t in timings.values()), timings
    assert timings[specs[1].run_id]["drain_s"] > 0 and timings[specs[0].run_id]["phases"]["ingest"] > 0
    # no capture lost a packet
    assert len(points) == 4
    for p in points:
        assert p.dropped_by_kernel == 0 and p.captured == p.received_by_filter == p.records > 1000, p
    # every flow's SYN, its end (RST or FINs) and the control connection's FINs and last ACK, at both points
    ends = [e for s in specs for e in flow_ends(db, s.run_id)]
    assert len(ends) == 4 and all(e.complete for e in ends), ends
    # the start skew of every flow, measured at the capture facing the sender, a few ms after its schedule
    assert len(flows) == 2
    for f in flows:
        assert f.start_point == "aqm:to-server" and f.measured_start_ns - f.scheduled_start_ns == f.start_skew_ns
        assert 0 < f.start_skew_ns < 500_000_000, f
