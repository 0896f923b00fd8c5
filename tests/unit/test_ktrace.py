"""kernel_trace: the strings the agent writes to tracefs, the artifact parser on literal agent output (a VM
guest's Debian 6.1 and this machine's 6.18), call pairing, the clock conversion, the cost statistics, the plan
field and the preflight refusals."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from agents.ktrace import copy_bounded, probe_counts, selected_clock
from analysis.kernel_cost import cell_of, cost_stats, cost_table, is_timing_run
from orchestrator.engine.ktrace import kernel_trace_problems, kernel_trace_task, kernel_trace_unsupported
from orchestrator.ingest.ktrace import KtraceError, pair_calls, parse_kernel_trace, split_sections
from orchestrator.plan.expansion.runspec import KernelTraceSpec
from schemas import ktrace, protocol

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ktrace"
GUEST = (FIX / "guest-6.1-tcp_write_xmit.txt").read_bytes()
GUEST_PRINTK = (FIX / "guest-6.1-printk-top-level.txt").read_bytes()
HOST = (FIX / "host-6.18-hrtimer.txt").read_bytes()
HRTIMER = ["timer:hrtimer_expire_entry"]


# ------------------------------------------------------------------ strings written to tracefs

def test_kprobe_definitions_are_exact_bounded_strings():
    base = ktrace.event_base(4242, "kernel-trace")
    assert base == "kt4242_kerneltrace"
    assert ktrace.kprobe_definitions(base, ["tcp_write_xmit", "foo.isra.0"]) == [
        ("kt4242_kerneltrace_0e", "p:tcplab/kt4242_kerneltrace_0e tcp_write_xmit", "entry"),
        ("kt4242_kerneltrace_0r", "r64:tcplab/kt4242_kerneltrace_0r tcp_write_xmit", "return"),
        ("kt4242_kerneltrace_1e", "p:tcplab/kt4242_kerneltrace_1e foo.isra.0", "entry"),
        ("kt4242_kerneltrace_1r", "r64:tcplab/kt4242_kerneltrace_1r foo.isra.0", "return")]
    assert ktrace.kprobe_removal("kt4242_kerneltrace_0e") == "-:tcplab/kt4242_kerneltrace_0e"
    # the longest task id still fits the kernel's 64-character event names
    assert len(ktrace.kprobe_event_names(ktrace.event_base(4194304, "x" * 64), 15)[1]) <= 64


@pytest.mark.parametrize("bad", ["tcp_write_xmit\np:evil do_exit", "1abc", "a b", "sym/../x", "x" * 129, ""])
def test_a_symbol_that_is_not_one_is_refused(bad):
    with pytest.raises(ValueError, match="not a kernel symbol"):
        ktrace.kprobe_definitions("kt1_t", [bad])
    with pytest.raises(ValueError):
        protocol.KernelTraceTask(task_id="k", start_ns=0, stop_ns=1, kprobes=[bad])


def test_tracepoints_and_filters_are_checked_before_they_become_paths():
    assert ktrace.tracepoint_dir("timer:hrtimer_expire_entry") == "events/timer/hrtimer_expire_entry"
    for bad in ("kprobes:anything", "timer:../../x", "ftrace:function", "timer"):
        with pytest.raises(ValueError):
            ktrace.tracepoint_dir(bad)
    assert ktrace.filter_text("sport == 5201 || dport == 5201") == "sport == 5201 || dport == 5201"
    for bad in ("a\nb", "x == 'y'", "$(reboot)", "a" * 257):
        with pytest.raises(ValueError):
            ktrace.filter_text(bad)


def test_copy_bounded_stops_at_the_limit_and_ends_a_line(tmp_path):
    src = tmp_path / "trace"
    src.write_bytes(b"a" * 100)
    with open(tmp_path / "out", "wb") as out:
        assert copy_bounded(src, out, limit=40) == (40, True)
    assert (tmp_path / "out").read_bytes() == b"a" * 40 + b"\n"
    with open(tmp_path / "out2", "wb") as out:
        assert copy_bounded(src, out, limit=1000) == (100, False)
    assert (tmp_path / "out2").read_bytes() == b"a" * 100 + b"\n"


def test_the_selected_clock_and_the_probe_profile():
    assert selected_clock("[local] global counter uptime perf mono mono_raw boot tai x86-tsc\n") == "local"
    assert selected_clock("local global counter uptime perf [mono] mono_raw\n") == "mono"
    profile = ("  kt359_kerneltrace_0e                                     145               0\n"
               "  kt359_kerneltrace_0r                                     145               2\n"
               "  hk_e                                                      57               0\n")
    assert probe_counts(profile, {"kt359_kerneltrace_0e", "kt359_kerneltrace_0r"}) == {
        "kt359_kerneltrace_0e": {"hits": 145, "misses": 0}, "kt359_kerneltrace_0r": {"hits": 145, "misses": 2}}


# this machine's per_cpu/cpu0/stats (literal), the overrun made 1234 for the test
STATS = """entries: 0
overrun: 0
commit overrun: 0
bytes: 0
oldest event ts:     0.000000
now ts:  1909.672834
dropped events: 0
read events: 0
"""


def test_overruns_sum_over_the_cpus(tmp_path):
    from agents.ktrace import overruns

    for cpu, n in (("cpu0", 0), ("cpu1", 1234)):
        (tmp_path / "per_cpu" / cpu).mkdir(parents=True)
        (tmp_path / "per_cpu" / cpu / "stats").write_text(STATS.replace("overrun: 0\n", f"overrun: {n}\n", 1))
    assert overruns(tmp_path) == 1234


# ------------------------------------------------------------------ pairing (pure)

def test_nested_calls_pair_inside_out_and_cut_calls_are_dropped():
    # key (pid 7, cpu 0): R(cut) E1 E2 R2 R1 E3 (cut); key (pid 9, cpu 1) interleaved: E R
    pid = np.array([7, 7, 9, 7, 7, 9, 7, 7])
    cpu = np.array([0, 0, 1, 0, 0, 1, 0, 0])
    ts = np.array([1, 2, 3, 4, 5, 6, 7, 9])
    entry = np.array([False, True, True, True, False, False, False, True])
    e, r = pair_calls(pid, cpu, ts, entry)
    pairs = sorted(zip(ts[e].tolist(), ts[r].tolist(), strict=True))
    assert pairs == [(2, 7), (3, 6), (4, 5)]


def test_the_same_pid_on_two_cpus_is_two_stacks():
    pid, cpu = np.array([0, 0, 0, 0]), np.array([0, 1, 0, 1])   # the idle task runs on every CPU
    ts, entry = np.array([1, 2, 3, 4]), np.array([True, True, False, False])
    e, r = pair_calls(pid, cpu, ts, entry)
    assert sorted(zip(ts[e].tolist(), ts[r].tolist(), strict=True)) == [(1, 3), (2, 4)]


# ------------------------------------------------------------------ the literal artifacts

def test_guest_kprobe_pairs_give_one_duration_per_call():
    rows = parse_kernel_trace(GUEST, HRTIMER)
    calls = rows[rows["source"] == "kprobe"]
    assert len(calls) == 145                                 # kprobe_profile: 145 hits each, nothing cut
    assert set(calls["event"]) == {"tcp_write_xmit"}
    assert np.all(calls["duration_ns"] > 0)
    # under TCG a call (loopback: the receive path runs inside it) takes µs to ms
    assert 10_000 < np.median(calls["duration_ns"]) < 2_000_000
    # the first raw pair of the artifact: `361 0 658941580980 type: 1367`, `361 0 658947008050 type: 1368`
    first = calls[calls["pid"] == 361][0]
    offset = (1795568604652754070 + 1795568604653615220) // 2
    assert first["ts_ns"] == 658941580980 + offset
    assert first["duration_ns"] == 658947008050 - 658941580980
    assert np.all(np.isnan(calls["value"]))


def test_raw_stamps_are_nanoseconds_text_stamps_microseconds():
    rows = parse_kernel_trace(GUEST, HRTIMER)
    tp = rows[rows["source"] == "tracepoint"]
    assert len(tp) == 60 - 10          # the 60 text entries kept, of which 10 are the agent's own probe lines
    offset = (1795568604652754070 + 1795568604653615220) // 2
    assert np.all((tp["ts_ns"] - offset) % 1000 == 0)
    assert tp[0]["text"].startswith("hrtimer=") and "now=" in tp[0]["text"]
    assert np.all(tp["duration_ns"] == -1)


def test_rows_are_on_the_run_clock_in_time_order():
    rows = parse_kernel_trace(GUEST, HRTIMER)
    assert np.all(np.diff(rows["ts_ns"]) >= 0)
    # the run was traced on 2026-11-25 (CLOCK_REALTIME); mono alone would be ~659 s
    assert 1795500000 * 10**9 < rows["ts_ns"][0] < 1795600000 * 10**9


def test_top_level_trace_printk_lines_are_mapped_by_the_sync_marks_and_parsed():
    rows = parse_kernel_trace(GUEST_PRINTK, HRTIMER)
    pk = rows[rows["source"] == "printk"]
    # three timing lines; the sync lines of this run and of four earlier runs in that buffer are not rows
    assert pk["event"].tolist() == ["pc_chirp_compute"] * 3
    assert pk["value"].tolist() == [812.0, 1930.0, 655.0]
    assert pk["text"].tolist()[0] == "pc_chirp_compute took 812 ns"
    # this run's sync lines: local 699.444662 s carries mono 695575817860, local 703.020377 s mono 699154555710;
    # local -> mono is the mean of the two differences
    offset = (1795568604653620205 + 1795568604653616010) // 2
    local_to_mono = ((695575817860 - 699444662000) + (699154555710 - 703020377000)) // 2
    assert pk[0]["ts_ns"] == 702563912000 + local_to_mono + offset
    assert 695575817860 + offset <= pk[0]["ts_ns"] <= 699154555710 + offset


def test_host_tracepoints_without_probes():
    rows = parse_kernel_trace(HOST, HRTIMER)
    assert len(rows) == 40 and set(rows["source"]) == {"tracepoint"}
    assert set(rows["event"]) == {"timer:hrtimer_expire_entry"}


def test_a_file_that_is_not_an_artifact_or_has_no_offsets_is_refused():
    with pytest.raises(KtraceError, match="not a kernel_trace artifact"):
        parse_kernel_trace(b"# tracer: nop\n", HRTIMER)
    with pytest.raises(KtraceError, match="offset"):
        parse_kernel_trace(b"#@ tcplab-kernel-trace 1\n#@ section text mono\n", HRTIMER)
    body = GUEST_PRINTK.replace(b"tcplab-sync", b"other-sync")
    with pytest.raises(KtraceError, match="sync"):
        parse_kernel_trace(body, HRTIMER)


def test_the_numpy_read_of_the_raw_section_equals_the_line_regex():
    from orchestrator.ingest.ktrace import RAW_LINE, raw_columns

    raw = split_sections(GUEST)[1]["raw mono"]
    by_regex = np.array(RAW_LINE.findall(raw), dtype=np.int64)
    assert by_regex.shape == (2223, 4)
    assert np.array_equal(raw_columns(raw), by_regex)
    # the kernel's lost-events line is not an event; a line numpy cannot read sends the section to the regex
    assert np.array_equal(raw_columns(raw + b"CPU:0 [LOST 12 EVENTS]\n"), by_regex)
    assert np.array_equal(raw_columns(raw + b"1 0 x type: 9\n"), by_regex)
    assert raw_columns(b"# tracer: nop\n").shape == (0, 4)


def test_sections_split():
    header, sections = split_sections(GUEST)
    assert list(sections) == ["text mono", "raw mono", "printk local"]
    assert header["probe"] == ["1367 entry tcp_write_xmit", "1368 return tcp_write_xmit"]


# ------------------------------------------------------------------ statistics (M-KCOST)

def test_cost_stats():
    n, lo, hi, mean, sd, p99 = cost_stats(np.array([100, 200, 300, 400]))
    assert (n, lo, hi, mean) == (4, 100.0, 400.0, 250.0)
    assert sd == pytest.approx(129.0994, rel=1e-5)              # sample sd (ddof 1)
    assert p99 == pytest.approx(397.0)                          # linear: 300 + 0.97 * 100
    assert cost_stats(np.array([5]))[4] is None


def test_cost_table_and_timing_runs():
    t = cost_table({("pc-timing-e10-pc-abc", "sender_a", "printk", "pc_chirp_compute"): np.array([812., 1930., 655.])})
    assert t.columns == ("cell", "host", "source", "event", "unit", "n", "min", "max", "mean", "sd", "p99")
    assert t.rows[0][:8] == ("pc-timing-e10-pc-abc", "sender_a", "printk", "pc_chirp_compute", "ns", 3, 655.0, 1930.0)
    assert cell_of("tbtcp-timing-tb-e11-tb-timing-3f2a-r4") == "tbtcp-timing-tb-e11-tb-timing-3f2a"
    assert is_timing_run(["G-PROBE host sender: timing run: ..."])
    assert not is_timing_run(["G-CPULOAD host aqm: ...", "a G-PROBE in the middle"])


# ------------------------------------------------------------------ engine: task and preflight

def caps(**kw) -> protocol.Capabilities:
    base = dict(kernel_release="6.18.0", qdiscs=[], congestion_controls=["cubic"], allowed_congestion_controls=[],
                offload_features={}, tools={}, tracepoints=["tcp:tcp_probe", "timer:hrtimer_expire_entry"])
    return protocol.Capabilities(**{**base, **kw})


def test_the_task_carries_the_spec():
    k = KernelTraceSpec(hosts=["sender"], trace_printk=True, tracepoints={"timer:hrtimer_expire_entry": None,
                        "tcp:tcp_probe": "sport == 5201"}, kprobes=["tcp_write_xmit"], buffer_kib=4096)
    task = kernel_trace_task(k, 10, 20)
    assert task.kind == "kernel_trace" and (task.start_ns, task.stop_ns) == (10, 20)
    assert task.filters == {"tcp:tcp_probe": "sport == 5201"} and task.kprobes == ["tcp_write_xmit"]


def test_preflight_names_host_kernel_and_what_is_missing():
    k = KernelTraceSpec(hosts=["sender"], tracepoints={"timer:hrtimer_expire_entry": None,
                                                        "sched:sched_switch": None}, kprobes=["tcp_write_xmit"])
    problems = kernel_trace_problems(k, {"sender": caps()})
    assert problems == [
        "host sender (kernel 6.18.0) lacks kprobe_events (CONFIG_KPROBE_EVENTS): kernel_trace.functions "
        "tcp_write_xmit cannot be timed by kprobe/kretprobe pairs",
        "host sender (kernel 6.18.0) lacks tracepoint sched:sched_switch (no events/sched/sched_switch in tracefs)"]
    assert kernel_trace_problems(k, {"sender": caps(kprobe_events=True, tracepoints=[
        "timer:hrtimer_expire_entry", "sched:sched_switch"])}) == []
    graph = KernelTraceSpec(hosts=["sender"], function_graph=["tcp_write_xmit"])
    assert "not executed by this agent version" in kernel_trace_unsupported(graph, {"sender": caps()})[0]


# ------------------------------------------------------------------ the plan field

PLAN = """
version: 1
name: kt
description: kernel_trace
roles: [client, aqm, server]
tags: [{tags}]
run:
  duration: 2s
  bottleneck: {{at: {{host: aqm, toward: client}}, rate: 20mbit, queue: {{kind: pfifo, limit: 30}}}}
  traffic: {{tool: iperf3, src: server, dst: client, cc: cubic, flows: 1}}
  kernel_trace:
{body}
"""


def load(tmp_path, body: str, tags: str = "timing"):
    from orchestrator.plan import load_plan

    p = tmp_path / "kt.yaml"
    p.write_text(PLAN.format(tags=tags, body=textwrap.indent(textwrap.dedent(body), "    ")))
    return load_plan(p)


def test_the_plan_field_expands_into_the_run_spec(tmp_path):
    from orchestrator.plan import expand

    plan = load(tmp_path, """\
        hosts: [server]
        trace_printk: true
        tracepoints: [timer:hrtimer_expire_entry, {name: "tcp:tcp_probe", filter: "sport == 5201"}]
        functions: [tcp_write_xmit, {symbol: tcp_rcv_established, method: function_graph}]
        buffer: 4MiB
        """)
    (run,) = expand(plan)
    assert run.kernel_trace == KernelTraceSpec(
        hosts=["server"], trace_printk=True, tracepoints={"timer:hrtimer_expire_entry": None,
                                                          "tcp:tcp_probe": "sport == 5201"},
        kprobes=["tcp_write_xmit"], function_graph=["tcp_rcv_established"], buffer_kib=4096)
    assert "kernel_trace" in run.model_dump()


def test_plan_errors_name_line_and_field(tmp_path):
    from orchestrator.plan.checks.errors import PlanError

    with pytest.raises(PlanError) as err:
        load(tmp_path, """\
            hosts: [server, nobody]
            functions: ["tcp_write_xmit; reboot"]
            buffer: 512MiB
            """, tags="smoke")
    text = str(err.value)
    assert "kt.yaml:" in text
    assert "run.kernel_trace.functions.0" in text or "kernel_trace.functions" in text
    with pytest.raises(PlanError) as err:
        load(tmp_path, """\
            hosts: [server, nobody]
            functions: [tcp_write_xmit, tcp_write_xmit]
            buffer: 512MiB
            """)
    text = str(err.value)
    assert "kt.yaml:12:21: run.kernel_trace.hosts[1]: unknown role 'nobody'" in text
    assert "kt.yaml:13:33: run.kernel_trace.functions[1]: tcp_write_xmit is listed twice" in text
    assert "kt.yaml:14:13: run.kernel_trace.buffer: the trace buffer is whole KiB from 1 MiB to 256 MiB per CPU" in text
    with pytest.raises(PlanError) as err:
        load(tmp_path, "hosts: [server]\nfunctions: [tcp_write_xmit]\n", tags="smoke")
    assert "kt.yaml:6:7: tags: runs with kernel_trace are timing runs: tag the plan `timing` (G-PROBE" in str(err.value)


def test_a_plan_without_kernel_trace_keeps_its_run_ids(tmp_path):
    """kernel_trace is out of the run hash while absent: existing plans' run ids do not change."""
    from orchestrator.plan import expand, load_plan

    p = tmp_path / "plain.yaml"
    p.write_text(PLAN.split("  kernel_trace:")[0].format(tags="smoke"))
    (run,) = expand(load_plan(p))
    assert run.kernel_trace is None and "kernel_trace" not in run.model_dump()


def test_the_report_leaves_timing_runs_out_and_shows_their_costs(tmp_path):
    """A run flagged G-PROBE gives the kernel cost table and no row in any performance table."""
    import sqlalchemy as sa

    from analysis.report import write_report
    from orchestrator.storage import tables as T
    from schemas.flag import Flag
    from tests.unit.test_report import engine as report_db

    db = report_db.__wrapped__(tmp_path)   # the report tests' literal-rows DB
    flag = Flag(guard="G-PROBE", host="server", message="timing run: function timings tcp_write_xmit traced; "
                "no performance metric is reported from it").stored()
    rows = parse_kernel_trace(GUEST, HRTIMER)
    with db.begin() as conn:
        conn.execute(sa.update(T.run).where(T.run.c.run_id == "q-bbr-50").values(flags=[flag]))
        conn.execute(T.kernel_trace.insert(), [
            {"run_id": "q-bbr-50", "host": "server", "ts_ns": int(r["ts_ns"]), "cpu": int(r["cpu"]),
             "pid": int(r["pid"]), "source": str(r["source"]), "event": str(r["event"]),
             "duration_ns": int(r["duration_ns"]) if r["duration_ns"] >= 0 else None, "value": None,
             "text": str(r["text"])} for r in rows])
    page = write_report(db, tmp_path / "out", ["q-reno-20", "q-bbr-50"]).read_text()
    runs_csv = (tmp_path / "out" / "runs.csv").read_text()
    assert "q-reno-20" in runs_csv and "q-bbr-50" not in runs_csv
    assert "<h2>Timing runs</h2>" in page and "1 timing run(s) (G-PROBE" in page and "q-bbr-50" in page
    cost = (tmp_path / "out" / "tables" / "kernel_cost.csv").read_text().splitlines()
    assert cost[0] == "cell,host,source,event,unit,n,min,max,mean,sd,p99"
    assert cost[1].startswith("q-bbr-50,server,kprobe,tcp_write_xmit,ns,145,")
