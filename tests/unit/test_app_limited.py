"""The app-limited (thin-stream) flow: plan checks, the tasks bind makes, the writer's argv and schedule, its
log format, and the application-layer latency mapped on a real capture (tests/fixtures/app/, made as
tests/fixtures/app/make_fixture.py says: sequence numbers wrap past 0, one data packet in eight is dropped
before the capture)."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from agents.appflows import sink_argv, writer_argv
from agents.appwriter import MAGIC, WRITE_RECORD, schedule, writes_planned
from orchestrator.engine.appbind import APP_START_LEAD_NS, app_flow_tasks, app_start_lead_ns
from orchestrator.engine.bind import Timeline
from orchestrator.guards.appwrite import off_schedule, writer_findings
from orchestrator.ingest import applat
from orchestrator.ingest.applog import SKIPPED, parse_read_log, parse_write_log
from orchestrator.ingest.assemble import clock_offsets
from orchestrator.ingest.pcap import read_pcap
from orchestrator.ingest.record import RunRecord
from orchestrator.plan import PlanError, expand, load_plan_text
from schemas import limits, protocol

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "app"
FIRST_SEQ = (1 << 32) - 1000          # make_fixture.py: the writer's first data byte
PLAN = """name: thin
roles: [sender, aqm, receiver]
seed: 11
run:
  duration: 10s
  traffic: {tool: app_limited, src: sender, dst: receiver, cc: reno, flows: 2, write_size: 50B,
            write_interval: 50ms, nodelay: true, base_port: 6000EXTRA}
"""


def plan(extra: str = "") -> list:
    return expand(load_plan_text(PLAN.replace("EXTRA", extra), "thin.yaml"))


# ---------------------------------------------------------------- plan

def test_plan_checks_name_file_line_and_field() -> None:
    with pytest.raises(PlanError) as err:
        load_plan_text(PLAN.replace("EXTRA", ", write_interval_dist: normal"), "thin.yaml")
    assert str(err.value) == ("thin.yaml:7:88: run.traffic.write_interval_dist: 'normal' is not one of 'fixed' or "
                              "'exponential'")
    with pytest.raises(PlanError) as err:
        load_plan_text(PLAN.replace("50ms", "50us").replace("EXTRA", ""), "thin.yaml")
    assert str(err.value) == ("thin.yaml:7:29: run.traffic.write_interval: write_interval 50us is shorter than the "
                              "writer can keep (100us)")
    with pytest.raises(PlanError) as err:
        load_plan_text(PLAN.replace("10s", "3600s").replace("50ms", "500us").replace("EXTRA", ""), "thin.yaml")
    assert f"7200000 writes of one flow (every 500us for 3600s) exceed the writer's limit of {limits.MAX_APP_WRITES}" \
        in str(err.value)
    iperf = PLAN.replace("tool: app_limited", "tool: iperf3").replace(
        "write_size: 50B,\n            write_interval: 50ms, ", "").replace("EXTRA", ", write_interval_dist: fixed")
    with pytest.raises(PlanError, match=r"traffic.write_interval_dist: `write_interval_dist` has no meaning "
                                        r"for tool iperf3"):
        load_plan_text(iperf, "thin.yaml")


def test_bind_makes_a_sink_and_a_writer_per_flow_and_no_iperf3() -> None:
    (spec,) = plan(", write_interval_dist: exponential")
    tl = Timeline(t0_ns=10**18, start_ns=10**18 - 1_200_000_000, stop_ns=10**18 + 11_500_000_000)
    f0, f1 = spec.flows
    (dst, sink), (src, writer) = app_flow_tasks(spec, f1, "10.0.0.2", tl)
    assert (dst, src) == ("receiver", "sender")
    assert sink == protocol.AppSinkTask(task_id="app-sink-1", start_ns=tl.start_ns - 10_000_000_000, port=6001,
                                        stop_ns=tl.stop_ns)
    assert writer.model_dump() == {
        "task_id": "app-writer-1", "start_ns": tl.start_ns - 10_000_000_000, "kind": "app_writer", "port": 6001,
        "dst_addr": "10.0.0.2", "cc": "reno", "nodelay": True, "write_size": 50, "interval_ns": 50_000_000,
        "dist": "exponential", "seed": (spec.seed * 1_000_003 + 1) % 2**63, "connect_ns": tl.start_ns + 800_000_000,
        "first_ns": 10**18, "end_ns": 10**18 + 10_000_000_000}
    (fixed,) = plan()
    assert "write_interval_dist" not in fixed.model_dump(mode="json")["flows"][0]   # old specs keep their JSON
    assert app_start_lead_ns(spec) == APP_START_LEAD_NS                  # time for the children to start
    (bulk,) = expand(load_plan_text(PLAN.replace("tool: app_limited", "tool: iperf3").replace(
        "write_size: 50B,\n            write_interval: 50ms, ", "").replace("EXTRA", ""), "thin.yaml"))
    assert app_start_lead_ns(bulk) == 0


def test_the_protocol_refuses_a_writer_schedule_out_of_order() -> None:
    args = dict(task_id="w", start_ns=0, port=6000, dst_addr="10.0.0.2", cc="reno", write_size=50,
                interval_ns=50_000_000, connect_ns=5, first_ns=10, end_ns=10)
    with pytest.raises(ValidationError, match="start_ns <= connect_ns <= first_ns < end_ns"):
        protocol.AppWriterTask(**args)
    with pytest.raises(ValidationError, match="interval_ns"):
        protocol.AppWriterTask(**{**args, "end_ns": 11, "interval_ns": 99_999})


# ---------------------------------------------------------------- the writer's argv and schedule

def test_argv_lists() -> None:
    w = protocol.AppWriterTask(task_id="w", start_ns=0, port=6000, dst_addr="10.0.0.2", cc="cubic", nodelay=True,
                               write_size=50, interval_ns=50_000_000, connect_ns=1, first_ns=2, end_ns=3)
    argv = writer_argv(w, Path("/r/app-writer-6000.bin"))
    assert argv[1:] == ["-S", "-m", "agents.appwriter", "writer", "--dst", "10.0.0.2", "--port", "6000",
                        "--cc", "cubic",
                        "--size", "50", "--interval-ns", "50000000", "--dist", "fixed", "--seed", "0",
                        "--connect-ns", "1", "--first-ns", "2", "--end-ns", "3", "--limit",
                        str(limits.MAX_APP_WRITES), "--out", "/r/app-writer-6000.bin", "--nodelay"]
    s = protocol.AppSinkTask(task_id="s", start_ns=0, port=6000, stop_ns=9)
    assert sink_argv(s, Path("/r/s.bin"))[4:] == ["sink", "--port", "6000", "--end-ns", "9", "--out", "/r/s.bin"]


def test_a_fixed_schedule_is_absolute_and_bounded() -> None:
    first, interval = 1_700_000_000_123_456_789, 50_000_000
    t = list(schedule(first, interval, first + 10_000_000_000, "fixed", 0, 10_000))
    assert len(t) == writes_planned(interval, 10_000_000_000) == 200
    assert t[0] == first and t[-1] == first + 199 * interval and set(np.diff(t)) == {interval}
    assert len(list(schedule(first, interval, first + 10_000_000_000, "fixed", 0, 7))) == 7   # the limit
    assert len(list(schedule(first, 3, first + 10, "fixed", 0, 100))) == 4   # 0 3 6 9: none at the end


def test_an_exponential_schedule_is_seeded_and_has_the_mean() -> None:
    first, mean = 10**18, 10_000_000
    a = np.array(list(schedule(first, mean, first + 100 * 10**9, "exponential", 42, 10**6)))
    b = np.array(list(schedule(first, mean, first + 100 * 10**9, "exponential", 42, 10**6)))
    c = np.array(list(schedule(first, mean, first + 100 * 10**9, "exponential", 43, 10**6)))
    assert np.array_equal(a, b) and not np.array_equal(a[:100], c[:100])
    gaps = np.diff(a)
    assert a[0] == first and gaps.min() >= 1 and abs(gaps.mean() / mean - 1) < 0.03   # 10 000 gaps
    assert abs(np.std(gaps) / mean - 1) < 0.05        # exponential: sd = mean


# ---------------------------------------------------------------- logs

def test_write_log_round_trip_and_refusals() -> None:
    log = parse_write_log((FIX / "wrap-writer.bin").read_bytes())
    assert log.meta["local_port"] == 47004 and log.rows.size == 60 and set(log.rows["accepted"]) == {50}
    assert np.array_equal(log.rows["offset"], np.arange(60) * 50)
    assert np.all(np.diff(log.rows["sched_ns"]) == 20_000_000)
    cut = (FIX / "wrap-writer.bin").read_bytes()[:-5]
    assert parse_write_log(cut).rows.size == 59 and parse_write_log(cut).meta["trailing_bytes"] == 27
    with pytest.raises(ValueError, match="not an app log"):
        parse_write_log(b"hello\n")
    with pytest.raises(ValueError, match="line 2: metadata is not JSON"):
        parse_write_log(MAGIC + b"{nope\n")
    with pytest.raises(ValueError, match="no local_port"):
        parse_write_log(MAGIC + b"{}\n")
    back = MAGIC + b'{"local_port": 1}\n' + WRITE_RECORD.pack(5, 5, 0, 1, 1) + WRITE_RECORD.pack(4, 4, 1, 1, 1)
    with pytest.raises(ValueError, match="not increasing"):
        parse_write_log(back)
    reads = parse_read_log(MAGIC + b"{}\n" + struct.pack("<qq", 7, 100) + struct.pack("<qq", 9, 150))
    assert reads.rows["end"].tolist() == [100, 150]


# ---------------------------------------------------------------- sequence numbers -> stream offsets

def test_stream_offsets_wrap_past_zero_and_past_4_gib() -> None:
    isn = (1 << 32) - 101                          # first byte at 2^32 - 100
    seq = np.array([(1 << 32) - 100, (1 << 32) - 50, 0, 50, (1 << 32) - 50, 100], dtype=np.int64)
    assert applat.stream_offsets(seq, isn).tolist() == [0, 50, 100, 150, 50, 200]   # a retransmission goes back
    steps = [k * 3 << 29 for k in range(5)]        # 0, 1.5, 3, 4.5, 6 GiB: each step < 2 GiB
    far = np.array([(isn + 1 + o) % (1 << 32) for o in steps])
    assert applat.stream_offsets(far, isn).tolist() == steps                        # 6 GiB into the stream


def test_first_arrival_is_the_earliest_packet_holding_the_byte() -> None:
    offsets = np.array([0, 50, 100, 150])
    lo, ln = np.array([0, 100, 50, 50]), np.array([50, 100, 100, 50])     # 50..99 arrives twice
    ts = np.array([10, 20, 30, 40])
    first, hits = applat.first_arrivals(offsets, lo, ln, ts)
    assert first.tolist() == [10, 30, 20, 20] and hits.tolist() == [1, 2, 2, 1]
    first, hits = applat.first_arrivals(np.array([0, 200]), lo, ln, ts)
    assert first.tolist() == [10, applat.NONE] and hits.tolist() == [1, 0]


def test_latency_on_a_real_capture_with_wrap_around_and_losses() -> None:
    packets = read_pcap(FIX / "wrap.pcap")
    data = packets[packets["src_port"] == 47004]
    log = parse_write_log((FIX / "wrap-writer.bin").read_bytes())
    isn, how = applat.isn_of(data["seq"], data["tcp_flags"], data["payload_len"])
    assert (isn, how) == (FIRST_SEQ - 1, "lowest early data")   # the connection was made in repair mode: no SYN
    carried = data[data["payload_len"] > 0]
    assert carried["seq"].min() < 100 < FIRST_SEQ <= carried["seq"].max()   # the capture wraps past 0
    rows = applat.app_writes(log.rows, data, isn, None, (0, 0, 0))
    assert np.all(rows["arrive_ns"] > 0) and np.all(rows["arrivals"] == 1)
    lat_ms = rows["latency_ns"] / 1e6
    # a write whose packet was dropped before the capture arrives with the retransmission, which Linux sends
    # together with the next write, one interval (20 ms) later: that is its latency
    late = np.flatnonzero(lat_ms > 5)
    assert late.tolist() == [5, 13, 21, 29, 37, 45, 53] and np.all((lat_ms[late] > 15) & (lat_ms[late] < 25))
    assert np.all(lat_ms[lat_ms < 5] < 1)
    # write 5 (offset 250: sequence number 2^32 - 750) arrives in the 100-byte packet that starts there
    pkt = carried[carried["ts_ns"] == rows["arrive_ns"][5]][0]
    assert pkt["seq"] == FIRST_SEQ + 250 and pkt["payload_len"] == 100
    # the write whose bytes straddle the wrap (offset 950..999, sequence 2^32 - 50 .. 2^32 - 1) is found
    assert rows["stream_offset"][19] == 950 and lat_ms[19] < 1
    # with the SYN's ISN given wrongly by one write, every write maps to its successor's arrival
    shifted = applat.app_writes(log.rows, data, isn - 50, None, (0, 0, 0))
    assert shifted["arrive_ns"][6] == rows["arrive_ns"][5]


def test_clock_offsets_are_removed_and_hosts_on_one_kernel_share_one() -> None:
    writes = np.zeros(1, dtype=parse_write_log((FIX / "wrap-writer.bin").read_bytes()).rows.dtype)
    writes[0] = (1000, 1000, 0, 50, 50)
    data = np.zeros(1, dtype=[("ts_ns", "i8"), ("seq", "i8"), ("payload_len", "i4"), ("tcp_flags", "i2")])
    data[0] = (5000, 101, 50, 0x18)
    reads = np.array([(7000, 50)], dtype=[("t_ns", "<i8"), ("end", "<i8")])
    row = applat.app_writes(writes, data, 100, reads, (-200, 300, 700))[0]
    assert row["latency_ns"] == (5000 - 300) - (1000 + 200) and row["read_latency_ns"] == (7000 - 700) - 1200
    unseen = applat.app_writes(writes, data[:0], 100, None, (-200, 300, 700), capture_from_ns=2000)[0]
    assert unseen["arrivals"] == applat.UNOBSERVED and unseen["latency_ns"] == applat.NONE   # made at 1200 < 1700
    lost = applat.app_writes(writes, data[:0], 100, None, (-200, 300, 700), capture_from_ns=1000)[0]
    assert lost["arrivals"] == 0                                       # the capture ran: the write was lost
    ev = [{"host": h, "phase": "hello", "data": {"capabilities": {"boot_id": b}}}
          for h, b in (("a", "k1"), ("b", "k1"), ("c", "k1"), ("d", "k2"))]
    ev += [{"host": h, "phase": "clock", "data": {"offset_ns": o, "rtt_ns": 1}}
           for h, o in (("a", -10), ("b", 40), ("c", 5), ("d", 9000))]
    assert clock_offsets(RunRecord(run={}, plan=None, flows=[], evidence=ev)) == {"a": 5, "b": 5, "c": 5, "d": 9000}


def test_first_reads_map_write_ends_to_the_sinks_reads() -> None:
    ends, ts = np.array([50, 150, 200]), np.array([1, 2, 3])
    assert applat.first_reads(ends, ts, np.array([50, 100, 150, 200, 250])).tolist() == [1, 2, 2, 3, applat.NONE]


# ---------------------------------------------------------------- G-TASK: a writer off its schedule

def test_a_stalled_writer_is_flagged_on_its_host_and_an_on_time_one_is_not() -> None:
    flows = plan()[0].flows
    on_time = parse_write_log((FIX / "on-time-writer.bin").read_bytes()).rows
    stalled = parse_write_log((FIX / "stalled-writer.bin").read_bytes()).rows
    assert off_schedule(on_time, 2e6) == (120, 0, 0, pytest.approx(0.037, abs=0.001))
    assert off_schedule(stalled, 2e6)[:3] == (60, 5, 0) and 5.0 < off_schedule(stalled, 2e6)[3] < 5.1
    assert writer_findings(flows, [(flows[0].flow_id, on_time)]) == []
    (flag,) = writer_findings(flows, [(flows[0].flow_id, on_time), (flows[1].flow_id, stalled)])
    assert (flag.guard, flag.host) == ("G-TASK", "sender")
    assert f"flow {flows[1].flow_id} (port 6001): 5 of 60 writes more than 2 ms after their instant" in flag.message
    assert flag.evidence["late"] == 5 and flag.evidence["skipped"] == 0


def test_skipped_instants_count_but_not_the_ones_before_the_first_write() -> None:
    flows = plan()[0].flows
    rows = parse_write_log((FIX / "on-time-writer.bin").read_bytes()).rows.copy()
    rows["accepted"][:5] = SKIPPED           # the connection came up late: the flow's start, not a stall
    assert off_schedule(rows, 2e6)[:3] == (115, 0, 0)
    assert writer_findings(flows, [(flows[0].flow_id, rows)]) == []
    rows["accepted"][50:52] = SKIPPED        # two instants a stall made the writer leave out: 2 of 115 > 1 %
    (flag,) = writer_findings(flows, [(flows[0].flow_id, rows)])
    assert "0 of 115 writes more than 2 ms after their instant, 2 instants skipped" in flag.message
