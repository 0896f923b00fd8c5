"""The receivers' ACK policy, pure parts: route quickack argv and read-back (literal `ip -j route` output of
this machine, tests/fixtures/ack/), host states, preflight refusals, and M-ACKRATIO / G-ACK on real captures
(tests/fixtures/ack/capture_ack_fixtures.sh: one CUBIC flow through htb 4 Mbit/s, captured on the receiver)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agents.host.baseline import from_json
from agents.host.routes import RouteError, change_argv, parse_routes, quickack_changes
from orchestrator.engine import ack_policy, verify
from orchestrator.engine.bind import host_states
from orchestrator.guards.ack import AckTally, chunk_counts, expected_range, flow_windows
from orchestrator.ingest.pcap import PcapReader, read_pcap
from orchestrator.plan import expand, load_plan_text
from schemas.hoststate import HostState, InterfaceState
from schemas.protocol import Capabilities, InterfaceReadback, Readback
from schemas.routes import quickack_by_route
from tests.unit.test_nic_state import _inventory

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ack"


def routes(name: str) -> list[dict]:
    return parse_routes((FIX / name).read_text())


# ------------------------------------------------------------------ agent: argv and read-back

def test_each_route_is_restated_whole_with_quickack():
    stock = routes("routes_stock.json")
    assert change_argv("to-aqm", "inet", stock[0], True) == [
        "ip", "-4", "route", "change", "10.77.0.0/24", "proto", "kernel", "scope", "link", "src", "10.77.0.2",
        "dev", "to-aqm", "quickack", "1"]
    v4 = routes("routes_v4_metrics.json")
    assert change_argv("ha-a", "inet", v4[1], True) == ["ip", "-4", "route", "change", "10.99.2.0/24", "via",
                                                        "10.99.1.2", "dev", "ha-a", "quickack", "1"]
    assert change_argv("ha-a", "inet", v4[0], False)[-2:] == ["quickack", "0"]     # 0 removes the metric
    v6 = routes("routes_v6.json")
    assert change_argv("ha-a", "inet6", v6[0], True) == [
        "ip", "-6", "route", "change", "fd00:99::/64", "proto", "kernel", "metric", "256", "pref", "medium",
        "dev", "ha-a", "quickack", "1"]


def test_a_route_with_metrics_ip_cannot_restate_is_refused_not_rewritten():
    v4 = routes("routes_v4_metrics.json")
    with pytest.raises(RouteError, match=r"ha-a route inet 10\.99\.3\.0/24 metric 7: has metrics initcwnd, mtu, "
                                         r"rto_min"):
        quickack_changes("ha-a", {"inet": v4}, True)
    with pytest.raises(RouteError, match="cannot restate its encap"):
        change_argv("ha-a", "inet", {**v4[1], "encap": "mpls"}, True)
    with pytest.raises(RouteError, match="a blackhole route"):
        change_argv("ha-a", "inet", {**v4[1], "type": "blackhole"}, True)


def test_only_routes_that_differ_are_changed_and_reset_restores_the_snapshot():
    found = {"inet": routes("routes_quickack.json"), "inet6": routes("routes_v6_quickack.json")}
    assert quickack_by_route(found) == {"inet 10.77.0.0/24": True, "inet6 fd00:99::/64 metric 256": True,
                                        "inet6 fe80::/64 metric 256": False}
    assert [a[4] for a in quickack_changes("d", found, True)] == ["fe80::/64"]
    snapshot = quickack_by_route({"inet": routes("routes_stock.json"), "inet6": routes("routes_v6.json")})
    undo = quickack_changes("d", found, snapshot)
    assert [(a[4], a[-1]) for a in undo] == [("10.77.0.0/24", "0"), ("fd00:99::/64", "0")]
    assert quickack_changes("d", {"inet": routes("routes_stock.json")}, snapshot) == []


def test_a_journal_from_before_route_snapshots_still_loads():
    old = {"format": 1, "boot_id": "b", "sysctls": {}, "module_params": [], "touched_sysctls": [],
           "touched_params": [], "interfaces": {"to-aqm": {"features": {}, "root_kind": "noqueue", "coalesce": None,
                                                           "pause": None, "neighbours": {}}}}
    assert from_json(json.dumps(old)).snapshot.interfaces["to-aqm"].quickack == {}


# ------------------------------------------------------------------ manager: host state, read-back, preflight

PLAN = """name: acks
roles: [client, aqm, server]
run:
  duration: 5s
  bottleneck: {at: {host: aqm, toward: client}, rate: 20mbit, queue: {kind: pfifo, limit: 30}}
  traffic: {src: server, dst: client, cc: cubic, flows: 1}
  ack_policy: {mode: MODE, mechanism: MECH}
"""


def spec(mode: str = "per_segment", mech: str = "quickack_route"):
    (run,) = expand(load_plan_text(PLAN.replace("MODE", mode).replace("MECH", mech), "acks.yaml"))
    return run


def test_receivers_get_quickack_on_every_data_interface_and_nobody_else():
    states = host_states(spec(), _inventory())
    assert states["client"].interfaces["to-aqm"].quickack is True
    assert {i.quickack for r in ("aqm", "server") for i in states[r].interfaces.values()} == {None}
    stock = host_states(spec("delayed", "stock"), _inventory())
    assert {i.quickack for s in stock.values() for i in s.interfaces.values()} == {None}
    sysctl = host_states(spec(mech="tcp_delayed_acks_sysctl"), _inventory())
    assert sysctl["client"].sysctls == {"net.ipv4.tcp_delayed_acks": "0"} and not sysctl["server"].sysctls


def _readback(name: str) -> Readback:
    irb = InterfaceReadback(tc_qdisc=[], tc_class_text="", htb_classes=[], features={},
                            routes={"inet": routes(name)})
    return Readback(kernel_release="6.18.44", sysctls={}, interfaces={"to-aqm": irb})


def test_quickack_is_compared_with_the_routes_the_kernel_shows():
    want = HostState(interfaces={"to-aqm": InterfaceState(quickack=True)})
    assert verify.readback_differences(want, _readback("routes_quickack.json")) == []
    assert verify.readback_differences(want, _readback("routes_stock.json")) == [
        "to-aqm route inet 10.77.0.0/24: quickack off != on"]
    assert verify.readback_differences(HostState(interfaces={"to-aqm": InterfaceState()}),
                                       _readback("routes_quickack.json")) == []     # None: not looked at


def caps(delayed_acks: bool = False) -> dict[str, Capabilities]:
    c = Capabilities(kernel_release="6.18.44", qdiscs=["pfifo", "htb"], congestion_controls=["cubic"],
                     allowed_congestion_controls=["cubic"], offload_features={}, tools={}, tracepoints=[],
                     tcp_delayed_acks=delayed_acks)
    return {r: c for r in ("client", "aqm", "server")}


def test_preflight_refuses_what_a_receiver_cannot_be_given():
    assert verify.unsupported_features(spec(), caps()) == []
    assert verify.unsupported_features(spec("delayed", "stock"), caps()) == []
    assert verify.unsupported_features(spec(mech="tcp_delayed_acks_sysctl"), caps()) == [
        "host client (kernel 6.18.44) lacks sysctl net.ipv4.tcp_delayed_acks (patched kernels only): ack_policy "
        "mechanism tcp_delayed_acks_sysctl cannot be applied"]
    assert verify.unsupported_features(spec(mech="tcp_delayed_acks_sysctl"), caps(delayed_acks=True)) == []
    [why] = verify.unsupported_features(spec(mech="module_param"), caps())
    assert why.startswith("host client (kernel 6.18.44): ack_policy mechanism module_param is not applied")
    assert ack_policy.refusals(spec(mech="module_param"), {}) == [why.replace("6.18.44", "?")]


# ------------------------------------------------------------------ M-ACKRATIO and G-ACK on real captures

def _span(pcap: np.ndarray) -> tuple[int, int]:
    return int(pcap["ts_ns"].min()), int(pcap["ts_ns"].max()) + 1


def test_ack_counts_of_the_stock_and_the_quickack_capture():
    delayed, quick = read_pcap(FIX / "delayed.pcap"), read_pcap(FIX / "quickack.pcap")
    d = chunk_counts(delayed, {5201: _span(delayed)})
    q = chunk_counts(quick, {5201: _span(quick)})
    # data to the server port / pure ACKs back (the iperf3 control connection has a few of each)
    assert d[(46406, 5201)].tolist() == [1128, 0] and d[(5201, 46406)].tolist() == [0, 142]
    assert q[(42554, 5201)].tolist() == [1158, 0] and q[(5201, 42554)].tolist() == [0, 945]
    assert d[(46404, 5201)].tolist() == [7, 0]           # the control connection: its own counts
    # outside the window nothing is counted; a port that is no flow's is ignored
    assert chunk_counts(delayed, {5201: (0, 1)}) == {} and chunk_counts(delayed, {5301: _span(delayed)}) == {}


def _tally(pcap_name: str, mode: str, mech: str, block_bytes: int = 1 << 20) -> AckTally:
    run = spec(mode, mech)
    pcap = read_pcap(FIX / pcap_name)
    t0 = int(pcap["ts_ns"].min())
    tally = AckTally(run, [{"flow_id": 0, "src_port": None}], t0, (t0, t0 + 10**10))
    for chunk in PcapReader(FIX / pcap_name, block_bytes=block_bytes):
        tally.observe("client:to-aqm", chunk)
    return tally


def test_quickack_capture_is_one_segment_per_ack_and_passes():
    tally = _tally("quickack.pcap", "per_segment", "quickack_route")
    (r,) = tally.ratios().values()
    assert (r.data_segments, r.pure_acks, r.src_port) == (831, 618, 42554)       # after the first second
    assert r.ratio < expected_range("per_segment", 1)[1] and tally.flags() == []
    assert tally.flow_values() == {0: {"ack_ratio": round(831 / 618, 4)}}


def test_stock_receiver_of_this_kernel_stretches_its_acks_and_is_flagged():
    """At 4 Mbit/s the 6.18 receiver's delayed ACK covers ~13-29 segments between loss episodes (ACKs ~60 ms
    apart): neither per-segment nor the textbook two."""
    for mode, mech, want in (("delayed", "stock", "1.5..2.5"), ("per_segment", "quickack_route", "<= 1.5")):
        [flag] = _tally("delayed.pcap", mode, mech).flags()
        assert flag == {"guard": "G-ACK", "host": "client", "message":
                        f"flow 0 (46406 -> 5201) at client:to-aqm: 13.56 data segments per ACK (800 / 59), "
                        f"ack_policy {mode}/{mech} expects {want}"}


def test_the_fold_does_not_depend_on_the_chunking():
    whole = _tally("delayed.pcap", "delayed", "stock").totals
    small = _tally("delayed.pcap", "delayed", "stock", block_bytes=4096).totals
    assert whole.keys() == small.keys() and all((whole[k] == small[k]).all() for k in whole)


def test_no_point_with_both_directions_is_flagged_as_not_checked():
    run = spec()
    pcap = read_pcap(FIX / "quickack.pcap")
    t0 = int(pcap["ts_ns"].min())
    tally = AckTally(run, [{"flow_id": 0, "src_port": 42554}], t0, (t0, t0 + 10**10))
    tally.observe("aqm:to-server", pcap[pcap["dst_port"] == 5201])     # data only, as a one-way capture
    assert tally.flow_values() == {}
    [flag] = tally.flags()
    assert flag["host"] == "client" and "not checked: no capture point saw both its data and the receiver's ACKs" \
        in flag["message"]


def test_steady_part_skips_the_first_second_unless_the_flow_is_that_short():
    run = spec()
    assert flow_windows(run, 0, (0, 10**12)) == {5201: (10**9, 5 * 10**9)}
    assert flow_windows(run, 0, (2 * 10**9, 3 * 10**9)) == {5201: (2 * 10**9, 3 * 10**9)}
    short = run.model_copy(update={"flows": [run.flows[0].model_copy(update={"duration_s": 0.5})]})
    assert flow_windows(short, 0, (0, 10**12)) == {5201: (0, 5 * 10**8)}
    assert expected_range("stretch", 4) == (3.0, 5.0) and expected_range("delayed", 1) == (1.5, 2.5)
