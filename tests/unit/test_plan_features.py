"""Plan features beyond the skeleton: relative thresholds and buffers, flow groups, kernel variants, ACK
policy, events and analysis windows - resolved into RunSpecs, and refused clearly when wrong."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engine.verify import capability_problems
from orchestrator.plan import PlanError, expand, load_plan, load_plan_text
from orchestrator.plan.model.quantities import Buffer, Threshold
from schemas import protocol
from schemas.hoststate import Bfifo, Mark, Red

PLANS = Path(__file__).resolve().parents[1] / "plans"

BASE = """
name: feat
roles: [sender, aqm, receiver]
run:
  duration: 20s
  base_rtt: 30ms
  bottleneck:
    at: {host: aqm, toward: receiver}
    rate: 100mbit
    queue: QUEUE
  traffic: {src: sender, dst: receiver, cc: dctcp, flows: 2, stagger: 5s}
"""


def one_run(queue: str, extra: str = "") -> object:
    (run,) = expand(load_plan_text(BASE.replace("QUEUE", queue) + extra, "feat.yaml"))
    return run


def test_threshold_and_buffer_units() -> None:
    assert Threshold("0.17bdp").in_ns(30_000_000, None) == 5_100_000      # K = 0.17 x BDP, in time
    assert Threshold("3target").in_ns(None, 250_000) == 750_000
    assert Threshold("500us").value == ("ns", 500_000)
    assert Buffer("1bdp").in_bytes(10_000_000, 30_000_000) == 37_500         # timer study: 1 x BDP
    assert Buffer("200ms").in_bytes(200_000_000, None) == 5_000_000
    assert Buffer("18750").value == ("bytes", 18_750) and Buffer(18750).in_bytes(None, None) == 18_750
    with pytest.raises(ValueError, match="relative to the target"):
        Threshold("2target").in_ns(30_000_000, None)
    with pytest.raises(ValueError, match="relative"):
        Threshold("0.17rtt")


def test_step_k_relative_to_the_bdp() -> None:
    # Paced Chirping: K = 0.17 x BDP; 100 Mbit/s x 30 ms = 375 000 B -> K = 63 750 B
    run = one_run("{kind: red, mode: step, min: 0.17bdp}")
    red = run.hosts["aqm"].qdiscs["receiver"][1]
    assert isinstance(red, Red) and (red.min_bytes, red.max_bytes) == (63_750, 63_751)
    assert run.derived.step_k_bytes == 63_750 and run.derived.bdp_bytes == 375_000
    assert run.derived.target_us == 5100.0          # the step's K is the AQM's target by default


def test_bfifo_of_one_bdp_and_mark_qdisc() -> None:
    run = one_run("{kind: bfifo, limit: 1bdp}")
    assert run.hosts["aqm"].qdiscs["receiver"][1] == Bfifo(limit_bytes=375_000)
    assert run.derived.queue_capacity_bdp == 1.0
    run = one_run("{kind: mark, mode: ramp, min: 2ms, max: 4ms, metric: est}")
    assert run.hosts["aqm"].qdiscs["receiver"][1] == Mark(mode="ramp", min_ns=2_000_000, max_ns=4_000_000,
                                                          metric="est", limit_packets=10_000)


def test_flow_groups_number_on_and_keep_their_tools() -> None:
    extra = """  background:
    - {tool: udp, src: sender, dst: receiver, cc: reno, flows: 1, rate: 20mbit, base_port: 6201}
    - {src: sender, dst: receiver, cc: dctcp, flows: 3, bytes: 150KB, stagger: 3s, start: 1s, base_port: 6301}
"""
    run = one_run("{kind: pfifo, limit: 100}", extra)
    assert [(f.flow_id, f.group, f.tool, f.port, f.start_s) for f in run.flows] == [
        (0, 0, "iperf3", 5201, 0.0), (1, 0, "iperf3", 5202, 5.0), (2, 1, "udp", 6201, 0.0),
        (3, 2, "iperf3", 6301, 1.0), (4, 2, "iperf3", 6302, 4.0), (5, 2, "iperf3", 6303, 7.0)]
    assert run.flows[2].rate_bit == 20_000_000 and {f.bytes for f in run.flows[3:]} == {150_000}
    # the UDP load is not a window-limited flow: W counts the 5 TCP flows
    assert run.derived.per_flow_window_segments == pytest.approx(100e6 * 30e-3 / (5 * 1518 * 8), abs=1e-3)


def test_conditions_resolve_into_the_run_spec() -> None:
    extra = """  ack_policy: {mode: per_segment, mechanism: quickack_route}
  events: [{at: 10s, action: set_delay, host: aqm, toward: receiver, delay: 100ms}]
  analysis: {warmup: 2s, bin_rtts: 2}
"""
    run = one_run("{kind: pfifo, limit: 100}", extra)
    assert run.ack_policy.hosts == ["receiver"] and run.ack_policy.mechanism == "quickack_route"
    assert run.events[0].delay_ns == 100_000_000 and run.events[0].link.label == "aqm:to-receiver"
    assert (run.analysis.warmup_s, run.analysis.bin_rtts) == (2.0, 2)


def test_mistakes_in_new_sections_are_all_reported() -> None:
    with pytest.raises(PlanError) as info:
        load_plan(PLANS / "bad_conditions.yaml")
    text = "\n".join(str(i) for i in info.value.issues)
    assert "bad_conditions.yaml:5:9: kernels.both: give exactly one of `package`" in text
    assert "run.events[0].at" in text     # a model error elsewhere does not hide the run-level problems
    fixed = (PLANS / "bad_conditions.yaml").read_text().replace(", source: {git: x, ref: v6.1}", "")
    with pytest.raises(PlanError) as info:
        load_plan_text(fixed, "bad_conditions.yaml")
    got: dict[tuple[int, str], str] = {}
    for i in info.value.issues:
        key = (i.line, str(i).split(": ", 2)[1])
        got[key] = got.get(key, "") + " | " + i.message
    expect = {
        (11, "run.bottleneck.queue"): "relative to the target",
        (14, "run.background[0].tool"): "tool udp needs `rate`",
        (15, "run.background[1].tool"): "tool app_limited needs `write_size`",
        (15, "run.background[1].bytes"): "byte-limited flows need tool iperf3",
        (18, "run.hosts.sender.kernel"): "no kernel variant 'lsaimd-5.0.0'",
        (20, "run.hosts.sender.qdiscs.aqm[0].limit"): "off the bottleneck a bfifo limit is in bytes",
        (21, "run.ack_policy.mechanism"): "stock cannot give per_segment ACKs",
        (23, "run.events[0].at"): "not before the run ends",
        (23, "run.events[0]"): "ack_blackout needs `duration`",
        (24, "run.events[1]"): "set_delay needs `delay`",
        (24, "run.events[1].duration"): "`duration` has no meaning for set_delay",
    }
    for key, needle in expect.items():
        assert key in got and needle in got[key], (key, got.get(key))
    assert "state `probability`" in got[(11, "run.bottleneck.queue")]


def caps(release: str = "6.18.1", qdiscs: tuple[str, ...] = ("htb", "pfifo")) -> protocol.Capabilities:
    return protocol.Capabilities(kernel_release=release, qdiscs=list(qdiscs), congestion_controls=["reno", "dctcp"],
                                 allowed_congestion_controls=["reno"], offload_features={}, tools={"iperf3": "3.12"},
                                 tracepoints=["tcp:tcp_probe"])


def test_engine_refuses_what_agents_cannot_apply_yet() -> None:
    plan = BASE.replace("QUEUE", "{kind: pfifo, limit: 100}").replace("name: feat", """name: feat
kernels:
  deb61: {vanilla: true, package: linux-image-6.1.0-28-cloud-amd64}""") + """  hosts:
    aqm: {kernel: deb61, module_params: {tcp_dctcp: {dctcp_shift_g: 4}}}
  background: [{tool: app_limited, src: sender, dst: receiver, cc: reno, flows: 1, write_size: 50B,
                write_interval: 10ms, nodelay: true, base_port: 7000}]
  events: [{at: 1s, action: ack_blackout, host: receiver, toward: aqm, duration: 1s},
           {at: 2s, action: set_rate, host: receiver, toward: aqm, rate: 5mbit}]
"""
    (run,) = expand(load_plan_text(plan, "feat.yaml"))
    problems = capability_problems(run, {r: caps() for r in ("sender", "aqm", "receiver")})
    assert "host aqm runs kernel 6.18.1, the plan needs variant deb61 (release 6.1.0-28-cloud-amd64)" in problems
    assert not any("tcp_dctcp" in p for p in problems)   # module parameters are applied (and read back)
    assert not any("app-limited" in p or "flow 2" in p for p in problems)   # the writer exists (agents/appwriter.py)
    # events run; one whose interface has no stage to change is refused, naming it
    assert not any("ack_blackout" in p for p in problems)
    assert any("events[1] (set_rate at 2s on receiver): receiver:to-aqm has no htb stage" in p for p in problems)
    assert capability_problems(run, {r: caps("6.1.0-28-cloud-amd64") for r in ("sender", "aqm", "receiver")})


def test_table_with_an_experiment_without_arms() -> None:
    from orchestrator.plan.expansion.table import render, study_table
    text = """name: mixed
run:
  duration: 10s
  traffic: {src: server, dst: client, cc: reno, flows: 1}
arms:
  - {name: a-x, set: {traffic.cc: reno}}
  - {name: b-y, set: {traffic.cc: cubic}}
experiments:
  - {name: e1, arms: []}
  - {name: e2, set: {duration: 20s}}
"""
    header, rows, fixed = study_table(expand(load_plan_text(text, "mixed.yaml"), order="cells"))
    assert header == ["parameter", "e1", "e2"]
    assert ["cc [no arm, a-x]", "reno", "reno"] in rows and ["cc [b-y]", "–", "cubic"] in rows
    assert "duration" in render(header, rows, fixed)


def test_default_capture_points_are_both_sides_of_the_bottleneck() -> None:
    text = """name: caps
roles: [client, aqm, server, server2]
run:
  duration: 5s
  bottleneck: {at: {host: aqm, toward: client}, rate: 20mbit, queue: {kind: pfifo, limit: 100}}
  traffic: {src: server, dst: client, cc: reno, flows: 1}
  background: [{tool: iperf3, src: server2, dst: client, cc: cubic, flows: 1, base_port: 6000}]
"""
    (run,) = expand(load_plan_text(text, "caps.yaml"))
    assert [(c.link.host, c.link.toward) for c in run.captures] == [("aqm", "client"), ("aqm", "server"),
                                                                    ("aqm", "server2")]
    (none,) = expand(load_plan_text(text + "  captures: []\n", "caps.yaml"))
    assert none.captures == []
    (own,) = expand(load_plan_text(text + "  captures: [{host: client, toward: aqm}]\n", "caps.yaml"))
    assert [(c.link.host, c.link.toward) for c in own.captures] == [("client", "aqm")]


def test_ss_sampling_needs_tcp_diag_on_the_senders() -> None:
    plan = BASE.replace("QUEUE", "{kind: pfifo, limit: 100}") + "  ss: {interval: 100ms}\n"
    (run,) = expand(load_plan_text(plan, "feat.yaml"))
    hosts = {r: caps() for r in ("sender", "aqm", "receiver")}
    assert not capability_problems(run, hosts)
    hosts["sender"] = caps().model_copy(update={"socket_diag": False})
    assert capability_problems(run, hosts) == [
        "host sender (kernel 6.18.1) lacks tcp_diag: `ss -ti` would print no TCP_INFO for the ss sampler "
        "(load the tcp_diag module)"]
