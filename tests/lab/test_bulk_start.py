"""Flows that start together on the netns lab: tests/plans/lab_bulk_start.yaml (4 `bulk` flows and 4 iperf3 flows
from server to client at T0 through a 40 Mbit/s htb). From the database: every bulk flow's first data packet
(M-STARTSKEW, at the aqm's interface facing the server) within 1 ms of T0 and of the other bulk flows; their
goodput from the sinks' logs adds up with the iperf3 flows' to about the bottleneck rate; the hosts were reset
clean. The iperf3 flows' skews are printed for contrast."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.lab.conftest import run_lab_plan_unloaded

PLAN = Path(__file__).resolve().parents[1] / "plans" / "lab_bulk_start.yaml"
RATE_BIT = 40e6
SKEW_NS = 1_000_000


@pytest.fixture(scope="module")
def bulk_db(lab, tmp_path_factory):
    _, state_dir = lab
    out = tmp_path_factory.mktemp("bulk")
    return run_lab_plan_unloaded(PLAN, state_dir, out, hosts=("server",)), out


def flows(engine) -> list:
    with engine.connect() as conn:
        (run,) = conn.execute(text("SELECT run_id, status, t0_ns FROM run")).all()
        assert run.status == "complete", run
        return conn.execute(text(
            "SELECT flow_id, tool, src_port, scheduled_start_ns, measured_start_ns, start_skew_ns, start_point, "
            "sink_bytes, sink_goodput_bps, fct_ns FROM flow ORDER BY flow_id")).all()


def test_bulk_flows_start_within_a_millisecond_of_t0_and_of_each_other(bulk_db):
    engine, _ = bulk_db
    rows = flows(engine)
    bulk = [f for f in rows if f.tool == "bulk"]
    iperf = [f for f in rows if f.tool == "iperf3"]
    assert len(bulk) == len(iperf) == 4
    for name, group in (("bulk", bulk), ("iperf3", iperf)):
        skews = [f.start_skew_ns / 1e6 if f.start_skew_ns is not None else None for f in group]
        print(f"{name}: start skew ms {skews}")
    for f in rows:
        assert f.src_port and f.start_point == "aqm:to-server", f
        assert f.measured_start_ns - f.scheduled_start_ns == f.start_skew_ns
    skews = [f.start_skew_ns for f in bulk]
    assert all(abs(s) <= SKEW_NS for s in skews), skews                 # within 1 ms of T0
    assert max(skews) - min(skews) <= SKEW_NS, skews                     # and of each other
    assert all(f.start_skew_ns > 0 for f in iperf)                        # an iperf3 flow starts after its T0
    assert {f.scheduled_start_ns for f in rows} == {rows[0].scheduled_start_ns}


def test_goodput_from_the_sinks_is_sane_against_the_bottleneck(bulk_db):
    engine, _ = bulk_db
    rows = flows(engine)
    bulk = [f for f in rows if f.tool == "bulk"]
    with engine.connect() as conn:
        iperf = dict(conn.execute(text("SELECT flow_id, goodput_bps FROM v_flow WHERE tool = 'iperf3'")).all())
    shown = [round(f.sink_goodput_bps / 1e6, 2) for f in bulk]
    print(f"bulk goodput Mbit/s {shown}; iperf3 {[round(v / 1e6, 2) for v in iperf.values()]}")
    assert all(f.sink_bytes > 0 and f.fct_ns is None for f in bulk)      # not byte-limited: no completion time
    total = sum(f.sink_goodput_bps for f in bulk) + sum(iperf.values())
    assert 0.8 * RATE_BIT < total < 1.02 * RATE_BIT, total               # the 8 flows share the htb's rate
    assert all(f.sink_goodput_bps > 0.02 * RATE_BIT for f in bulk)        # each bulk flow got a share


def test_the_hosts_were_reset_clean(bulk_db):
    engine, _ = bulk_db
    with engine.connect() as conn:
        resets = conn.execute(text("SELECT host, data FROM host_evidence WHERE phase = 'reset'")).all()
        flags = conn.execute(text("SELECT flags FROM run")).scalar_one()
    assert len(resets) == 3
    for host, data in resets:
        data = data if isinstance(data, dict) else json.loads(data)
        assert data["restored"] and not data["differences"], (host, data)
    assert "G-RESET" not in str(flags)
