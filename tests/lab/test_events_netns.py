"""Timed plan events on the netns lab, proven from the packets (docs/plans.md "Events").

The host kernel has htb and clsact/cls_bpf but no netem, so here: `set_rate` (htb class change on the
aqm, 20 -> 5 Mbit/s at 3 s) must show as the goodput at the aqm's capture toward the client falling to
the new rate; `ack_blackout` (the client drops everything it sends toward the aqm for 500 ms from 5 s)
must leave no ACK of the flow at the aqm's capture toward the server inside the window, with ACKs on
both sides of it. Both events' lags (effective - scheduled) come from run_event. `set_delay` needs netem:
tests/lab/test_uml_mechanisms.py (the UML lab).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from sqlalchemy import text

from analysis.load import iter_runs
from analysis.report import run_series, write_report
from analysis.summary import summarise
from tests.lab.conftest import run_lab_plan, stored_flags

RATE_BEFORE, RATE_AFTER = 20e6, 5e6
PLAN = """
version: 1
name: events
description: a rate step and an ACK blackout at absolute times
roles: [client, aqm, server]
tags: [smoke]
repetitions: 1
seed: 1
run:
  duration: 7s
  mtu: 1500
  bottleneck:
    at: {host: aqm, toward: client}
    rate: 20mbit
    queue: {kind: pfifo, limit: 30}
  traffic: {tool: iperf3, src: server, dst: client, cc: cubic, flows: 1, base_port: 5201}
  hosts:
    all:
      offloads: {tso: off, gso: off, gro: off, sg: off}
  captures:
    - {host: aqm, toward: client}
    - {host: aqm, toward: server}
  events:
    - {at: 3s, action: set_rate, host: aqm, toward: client, rate: 5mbit}
    - {at: 5s, action: ack_blackout, host: client, toward: aqm, duration: 500ms}
"""


@pytest.fixture(scope="module")
def events_run(lab, tmp_path_factory):
    _, state_dir = lab
    out = tmp_path_factory.mktemp("events")
    plan = out / "events.yaml"
    plan.write_text(PLAN)
    # not run_lab_plan_unloaded: the lags and the blackout are claims under whatever load the lab has; only
    # the goodput check is physics that a saturated lab host invalidates (it skips then, naming G-CPULOAD)
    db = run_lab_plan(plan, state_dir, out)
    with db.connect() as conn:
        rows = {r.action: r for r in conn.execute(text("SELECT * FROM run_event ORDER BY event_index")).all()}
    (data,) = list(iter_runs(db, detail=True))
    loaded = [str(f) for fs in stored_flags(db).values() for f in fs if f.guard == "G-CPULOAD"]
    return db, rows, data, out, loaded


def _goodput_bit(pkts: np.ndarray, a_ns: int, b_ns: int) -> float:
    inside = (pkts["ts_ns"] >= a_ns) & (pkts["ts_ns"] < b_ns)
    return float(pkts["payload_len"][inside].sum()) * 8 / ((b_ns - a_ns) / 1e9)


def test_event_lags_are_small(events_run):
    db, rows, data, _, _ = events_run
    assert set(rows) == {"set_rate", "ack_blackout"}
    t0 = data.meta.t0_ns
    for r in rows.values():
        print(f"{r.action}: scheduled T0+{(r.scheduled_ns - t0) / 1e9:.3f} s, issued "
              f"+{(r.issued_ns - r.scheduled_ns) / 1e6:.2f} ms, effective +{r.lag_ns / 1e6:.2f} ms")
        assert 0 <= r.lag_ns < 20_000_000, r
    assert rows["set_rate"].scheduled_ns == t0 + 3_000_000_000
    blackout = rows["ack_blackout"]
    assert blackout.end_scheduled_ns == blackout.scheduled_ns + 500_000_000
    assert 0 <= blackout.end_effective_ns - blackout.end_scheduled_ns < 20_000_000
    # events this much in time raise no G-FAULT (its bounds: issued 20 ms, in force 100 ms)
    assert not [f for fs in stored_flags(db).values() for f in fs if f.guard == "G-FAULT"]


def test_set_rate_reads_back_and_shows_in_goodput(events_run):
    _, rows, data, _, loaded = events_run
    detail = rows["set_rate"].detail
    detail = json.loads(detail) if isinstance(detail, str) else detail
    assert "rate 5Mbit" in detail["readback"]["tc_class_text"]
    (pkts,) = data.packets.values()
    eff = rows["set_rate"].effective_ns
    before = _goodput_bit(pkts, eff - 1_500_000_000, eff)
    # the 30-packet pfifo (~73 ms at 5 Mbit/s) drains at the new rate: skip 300 ms, stop before the blackout
    after = _goodput_bit(pkts, eff + 300_000_000, rows["ack_blackout"].scheduled_ns)
    print(f"goodput at aqm:to-client: {before / 1e6:.2f} Mbit/s before, {after / 1e6:.2f} Mbit/s after set_rate")
    if loaded:
        pytest.skip(f"G-CPULOAD: the lab host was saturated, goodput is not the network's: {loaded[0]}")
    assert 0.85 * RATE_BEFORE <= before <= RATE_BEFORE
    assert 0.85 * RATE_AFTER <= after <= 1.02 * RATE_AFTER


def test_ack_blackout_silences_the_receiver(events_run):
    _, rows, data, _, _ = events_run
    b = rows["ack_blackout"]
    ((_, acks),) = data.sender_side.values()
    ts = acks["ts_ns"]
    detail = json.loads(b.detail) if isinstance(b.detail, str) else b.detail
    # ACKs sent before the filter was in place are on the veth for microseconds: 1 ms grace
    inside = ts[(ts >= b.effective_ns + 1_000_000) & (ts < detail["end"]["issued_ns"])]
    before = ts[(ts >= b.scheduled_ns - 200_000_000) & (ts < b.issued_ns)]
    after = ts[(ts >= b.end_effective_ns) & (ts < b.end_effective_ns + 1_500_000_000)]
    gap_ms = (after.min() - before.max()) / 1e6 if before.size and after.size else None
    print(f"ACKs at aqm:to-server: {before.size} in the 200 ms before, {inside.size} in the blackout, "
          f"{after.size} in the 1.5 s after; gap between the last before and the first after {gap_ms} ms")
    assert before.size > 10 and inside.size == 0 and after.size > 0


def test_a_late_event_record_flags_the_run_when_ingested(events_run, tmp_path):
    """G-FAULT through `tcplab ingest`'s path: the run's own artifacts, its set_rate record moved 30 ms later
    (as a loaded host would have written it), ingested into a new database, carry the flag; the run as
    recorded does not."""
    import shutil

    from orchestrator.guards.finalise import finalise_run
    from orchestrator.ingest.record import RunRecord
    from orchestrator.storage.db import open_db

    db, rows, data, out, _ = events_run
    run_dir = tmp_path / data.meta.run_id
    shutil.copytree(out / "results" / data.meta.run_id, run_dir)
    (record,) = [p for p in run_dir.rglob("event-*.json") if json.loads(p.read_text())["action"] == "set_rate"]
    doc = json.loads(record.read_text())
    for key in ("issued_ns", "returned_ns", "exited_ns"):
        doc["start"][key] = doc["scheduled_ns"] + 30_000_000 + (doc["start"][key] - doc["start"]["issued_ns"])
    record.write_text(json.dumps(doc))
    late_db = open_db(f"sqlite:///{tmp_path / 'late.db'}")
    outcome = finalise_run(late_db, run_dir, RunRecord.load(run_dir))
    (flag,) = [f for f in outcome.flags if f.guard == "G-FAULT"]
    assert flag.host == "aqm" and "event 0 (set_rate on to-client) issued 30.0 ms after" in flag.message
    as_recorded, late = stored_flags(db)[data.meta.run_id], stored_flags(late_db)[data.meta.run_id]
    assert sorted(map(str, late)) == sorted(map(str, [*as_recorded, flag]))


def test_report_marks_the_events(events_run):
    db, rows, data, out, _ = events_run
    marks = run_series(data, summarise(data)).events
    assert [m.label for m in marks] == ["set_rate 5mbit", "ack_blackout"]
    assert marks[0].t_s == pytest.approx((rows["set_rate"].effective_ns - data.meta.t0_ns) / 1e9)
    assert marks[1].end_s is not None and marks[1].end_s - marks[1].t_s == pytest.approx(0.5, abs=0.02)
    page = write_report(db, out / "report").read_text()
    assert page.count("<img") >= 4


STOP_PLAN = """
version: 1
name: events-stop
description: a background flow stopped at 2 s
roles: [client, aqm, server]
tags: [smoke]
repetitions: 1
seed: 1
run:
  duration: 4s
  mtu: 1500
  bottleneck:
    at: {host: aqm, toward: client}
    rate: 20mbit
    queue: {kind: pfifo, limit: 30}
  traffic: {tool: iperf3, src: server, dst: client, cc: cubic, flows: 1, base_port: 5201}
  background: [{tool: iperf3, src: server, dst: client, cc: reno, flows: 1, base_port: 5401}]
  hosts:
    all:
      offloads: {tso: off, gso: off, gro: off, sg: off}
  captures:
    - {host: aqm, toward: client}
    - {host: aqm, toward: server}
  events:
    - {at: 2s, action: stop_flows, host: server, group: 1}
"""


def test_stop_flows_ends_the_group_and_keeps_the_rest(lab, tmp_path):
    """The background group's iperf3 client is stopped at 2 s: its data stops at the aqm within the socket
    buffer's drain time, the main flow goes on to the end, and the run completes."""
    _, state_dir = lab
    plan = tmp_path / "stop.yaml"
    plan.write_text(STOP_PLAN)
    db = run_lab_plan(plan, state_dir, tmp_path)
    with db.connect() as conn:
        (ev,) = conn.execute(text("SELECT * FROM run_event")).all()
        (status,) = conn.execute(text("SELECT status FROM run")).one()
    (data,) = list(iter_runs(db))
    detail = json.loads(ev.detail) if isinstance(ev.detail, str) else ev.detail
    main, background = data.packets[0], data.packets[1]
    last_bg = int(background["ts_ns"].max())
    print(f"stop_flows: effective +{ev.lag_ns / 1e6:.2f} ms, stopped {detail['start']['stopped']}; background's "
          f"last data packet +{(last_bg - ev.effective_ns) / 1e6:.1f} ms after it, main flow's last "
          f"+{(int(main['ts_ns'].max()) - ev.effective_ns) / 1e6:.0f} ms")
    assert status == "complete" and ev.action == "stop_flows" and 0 <= ev.lag_ns < 20_000_000
    assert detail["start"]["stopped"] == [{"task_id": "iperf3-client-1", "state": "running"}]
    assert background["ts_ns"].min() < ev.scheduled_ns < last_bg < ev.effective_ns + 500_000_000
    assert (main["ts_ns"] > ev.effective_ns + 1_500_000_000).sum() > 100
