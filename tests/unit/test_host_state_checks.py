"""Host state the plan states beyond sysctls and qdiscs (agents/host/linkinfo.py, agents/host/hostos.py,
orchestrator/engine/hostchecks.py): literal `ethtool`, `ethtool -k`, `ip -d -j link` and os-release output of
this machine and of a VM-lab guest as fixtures; preflight refusals and flags as the run sees them."""
from __future__ import annotations

from pathlib import Path

import pytest

from agents.host import linkinfo
from agents.host.baseline import Baseline, InterfaceSnapshot, Snapshot, from_json, to_json
from agents.host.executor import snapshot_differences
from agents.host.hostos import host_os_from, parse_os_release
from orchestrator.engine import bind, hostchecks, verify
from orchestrator.engine.preflight import Refused, check_run
from orchestrator.inventory import Inventory
from orchestrator.plan import PlanError, expand, load_plan_text
from schemas.hoststate import HostState, InterfaceState
from schemas.protocol import Capabilities, HostOS, InterfaceReadback, LinkSpeed, Readback

FIX = Path(__file__).resolve().parents[1] / "fixtures"
ETH = FIX / "ethtool"


def text(name: str) -> str:
    return (ETH / name).read_text()


# ------------------------------------------------------------------ agent-side parsing

def test_speed_of_a_veth_a_tap_and_a_virtio_nic():
    assert linkinfo.parse_speed(text("veth_settings.txt")) == 10000       # "Speed: 10000Mb/s", a constant
    assert linkinfo.parse_speed(text("tap_settings.txt")) == 10000
    assert linkinfo.parse_speed(text("virtio_settings.txt")) is None      # "Speed: Unknown!"
    assert linkinfo.parse_speed(text("vm_guest_virtio_settings.txt")) is None   # a VM-lab guest, kernel 6.1
    assert linkinfo.parse_speed("Settings for x:\n\tLink detected: yes\n") is None


def test_a_virtual_drivers_speed_is_never_checkable():
    veth = linkinfo.link_speed(text("veth_settings.txt"), "veth")
    assert veth == LinkSpeed(mbps=10000, checkable=False, why="driver veth is virtual: its speed is not a wire's")
    assert not linkinfo.link_speed(text("virtio_settings.txt"), "virtio_net").checkable
    assert not linkinfo.link_speed(text("tap_settings.txt"), "tun").checkable
    # the same line from a physical driver is a speed the plan is held to; Unknown! from one is not
    assert linkinfo.link_speed(text("veth_settings.txt"), "ixgbe") == LinkSpeed(mbps=10000, checkable=True)
    unknown = linkinfo.link_speed(text("virtio_settings.txt"), "igb")
    assert unknown.mbps is None and not unknown.checkable and "reports no speed" in unknown.why


def test_fixed_offloads_of_a_veth_on_kernel_6_18():
    assert linkinfo.fixed_offloads(text("veth_features.txt")) == {
        "lro": False, "ntuple": False, "rxhash": False, "tx-gso-partial": False}


def test_a_feature_the_driver_set_behind_the_cores_back_is_asked_for_explicitly():
    """UML's vector NIC turns TSO on when it opens, outside the requested set; the first `ethtool -K` that
    changed anything else (gro off) made the kernel recompute the features from the requested set and TSO went
    off, so a run asking TSO on failed its read-back ("tso: off != on") on every host just booted."""
    import json

    uml = {k: v for k, v in json.loads(text("uml_vector_features_boot.json"))[0].items() if isinstance(v, dict)}
    assert uml["tx-tcp-segmentation"] == {"active": True, "fixed": False, "requested": False}
    wanted = {"sg": True, "tso": True, "gso": True, "gro": False, "lro": False, "tx-gso-partial": False}
    # every wanted feature that is not fixed, tso included although it reads active
    assert linkinfo.offload_request(uml, wanted) == {"sg": True, "tso": True, "gso": True, "gro": False}
    veth = {k: v for k, v in json.loads(text("veth_features.json"))[0].items() if isinstance(v, dict)}
    assert linkinfo.offload_request(veth, {"tso": False, "gro": False}) == {"tso": False}   # only what differs
    assert linkinfo.offload_request(veth, {"tso": True, "gro": False}) == {}


def test_fixed_offloads_of_a_virtio_guest_include_features_made_of_fixed_parts():
    raw = (FIX / "tc" / "virtio_net_ethtool_k.txt").read_text().split("\n", 1)[1]   # after the `$ ethtool` line
    fixed = linkinfo.fixed_offloads(raw)
    assert fixed["rx"] is True                       # "rx-checksumming: on [fixed]"
    # "tcp-segmentation-offload: off" has no [fixed] mark, but each tx-tcp*-segmentation part is fixed off
    assert fixed["tso"] is False and fixed["sg"] is False and fixed["tx"] is False
    assert "gso" not in fixed and "gro" not in fixed  # "off [requested on]" / "on": settable


def test_features_text_that_is_not_ethtool_k_is_refused():
    with pytest.raises(linkinfo.LinkParseError):
        linkinfo.parse_features_text("Settings for hhv0:\n")
    with pytest.raises(linkinfo.LinkParseError, match="unexpected"):
        linkinfo.parse_features_text("Features for x:\nrx-checksumming: maybe\n")


def test_mtu_and_its_range_from_ip_link_json():
    assert linkinfo.parse_link(text("veth_ip_link.json")) == (1500, 68, 65535)
    assert linkinfo.parse_link(text("vm_guest_virtio_ip_link.json")) == (1500, 68, 65535)
    assert linkinfo.mtu_argv("to-aqm", 9000) == ["ip", "link", "set", "dev", "to-aqm", "mtu", "9000"]
    with pytest.raises(ValueError):
        linkinfo.mtu_argv("to-aqm", 70000)


def test_os_of_this_machine_from_its_os_release():
    release = (FIX / "agent" / "debian12_os_release.txt").read_text()
    assert parse_os_release(release)["PRETTY_NAME"] == "Debian GNU/Linux 12 (bookworm)"
    assert host_os_from("Linux", release) == HostOS(system="Linux", id="debian", version_id="12",
                                                    pretty="Debian GNU/Linux 12 (bookworm)")
    assert host_os_from("FreeBSD", 'NAME=FreeBSD\nID=freebsd\nVERSION_ID="14.1"\n"broken\n').version_id == "14.1"


def test_the_baseline_journal_keeps_the_mtu_and_reset_names_a_wrong_one():
    snap = Snapshot(interfaces={"to-aqm": InterfaceSnapshot(mtu=1500)})
    assert from_json(to_json(Baseline("b", snap))).snapshot.interfaces["to-aqm"].mtu == 1500
    after = Snapshot(interfaces={"to-aqm": InterfaceSnapshot(mtu=9000)})
    assert snapshot_differences(snap, after) == ["to-aqm mtu 9000 != snapshot 1500"]


# ------------------------------------------------------------------ manager side

PLAN = """name: hs
roles: [client, aqm, server]
run:
  duration: 2s
  mtu: {mtu}
  bottleneck: {{at: {{host: aqm, toward: client}}, rate: 20mbit, line_rate: 1gbit, queue: {{kind: pfifo, limit: 100}}}}
  traffic: {{src: server, dst: client, cc: reno, flows: 1}}
  hosts:
    all:
      offloads: {{tso: off, gso: off, gro: off, lro: {lro}}}
      static_neighbours: false
{extra}experiments:
  - name: one
"""


def spec(mtu=1500, lro="off", extra=""):
    [s] = expand(load_plan_text(PLAN.format(mtu=mtu, lro=lro, extra=extra), "hs.yaml"))
    return s


def inventory() -> Inventory:
    links = {"client": {"to-aqm": "aqm"}, "aqm": {"to-client": "client", "to-server": "server"},
             "server": {"to-aqm": "aqm"}}
    return Inventory.model_validate({"kind": "netns", "token_file": "/dev/null", "hosts": {
        r: {"agent": f"unix:/run/{r}.sock", "interfaces": {
            dev: {"toward": peer, "addr": "10.0.0.1", "plen": 24, "peer_addr": "10.0.0.2", "mac": "02:00:00:00:00:01"}
            for dev, peer in devs.items()}} for r, devs in links.items()}})


def caps(role: str, driver: str = "veth", speed: str = "veth_settings.txt", system="Linux") -> Capabilities:
    devs = inventory().hosts[role].interfaces
    return Capabilities(
        kernel_release="6.18.1", qdiscs=["pfifo", "htb"], congestion_controls=["reno"],
        allowed_congestion_controls=["reno"], offload_features={}, tools={}, tracepoints=["tcp:tcp_probe"],
        drivers={d: driver for d in devs}, os=host_os_from(system, (FIX / "agent/debian12_os_release.txt").read_text()),
        fixed_offloads={d: linkinfo.fixed_offloads(text("veth_features.txt")) for d in devs},
        link_speeds={d: linkinfo.link_speed(text(speed), driver) for d in devs},
        mtu_range={d: linkinfo.parse_link(text("veth_ip_link.json"))[1:] for d in devs})


def every(**kw) -> dict[str, Capabilities]:
    return {r: caps(r, **kw) for r in ("client", "aqm", "server")}


def test_a_plan_asking_a_fixed_offload_is_refused_naming_host_interface_and_feature():
    assert verify.capability_problems(spec(lro="off"), every()) == []
    problems = verify.capability_problems(spec(lro="on"), every())
    assert "host aqm (kernel 6.18.1) interface to-client (driver veth): offload lro is fixed off by the driver, " \
           "the plan asks on" in problems
    assert len([p for p in problems if "offload lro is fixed off" in p]) == 4   # every data interface


def test_the_run_mtu_goes_to_every_data_interface_and_is_read_back():
    s = spec(mtu=9000)
    assert s.mtu == 9000
    states = bind.host_states(s, inventory())
    assert {dev: st.mtu for role in states for dev, st in states[role].interfaces.items()} == {
        "to-aqm": 9000, "to-client": 9000, "to-server": 9000}
    want = HostState(interfaces={"to-aqm": InterfaceState(mtu=9000)})
    rb = Readback(kernel_release="6.18.1", sysctls={}, interfaces={"to-aqm": InterfaceReadback(
        tc_qdisc=[], tc_class_text="", htb_classes=[], features={}, mtu=1500)})
    assert verify.readback_differences(want, rb) == ["to-aqm mtu: 1500 != 9000"]
    rb.interfaces["to-aqm"].mtu = 9000
    assert verify.readback_differences(want, rb) == []


def test_an_mtu_beyond_an_interfaces_range_is_refused():
    c = every()
    c["server"] = c["server"].model_copy(update={"mtu_range": {"to-aqm": (68, 1500)}})
    assert verify.capability_problems(spec(mtu=9000), c) == [
        "host server interface to-aqm (driver veth) takes an MTU of 68..1500, the plan's mtu is 9000"]


def test_an_mtu_across_a_switch_is_refused():
    plan = """name: sw
roles: [a, b, c]
topology: {switches: [sw1], links: [[a, sw1], [b, sw1], [c, sw1]]}
run:
  duration: 2s
  mtu: 9000
  traffic: {src: a, dst: b, cc: reno, flows: 1}
experiments:
  - name: one
"""
    [s] = expand(load_plan_text(plan, "sw.yaml"))
    assert verify.unsupported_features(s, {}) == [
        "mtu 9000 with switches (sw1): a switch has no agent to set its ports' MTU, which stays 1500"]


def test_a_plan_naming_freebsd_is_refused_and_a_host_of_another_os_too():
    fbsd = spec(extra="    server: {os: freebsd}\n")
    assert fbsd.hosts["server"].os == "freebsd" and fbsd.hosts["client"].os is None
    problems = verify.capability_problems(fbsd, every())
    assert "host server: OS freebsd is not supported: the agent's mechanisms (tc, ethtool, tracefs, netlink) " \
           "are Linux-only" in problems
    assert "host server runs Debian GNU/Linux 12 (bookworm) (Linux), the plan needs OS freebsd" in problems
    linux = spec(extra="    all: {os: linux}\n".replace("    all", "    server"))
    assert verify.capability_problems(linux, every()) == []
    assert verify.capability_problems(linux, {**every(), "server": caps("server", system="FreeBSD")}) == [
        "host server runs Debian GNU/Linux 12 (bookworm) (FreeBSD), the plan needs OS linux"]
    old = every()
    old["server"] = old["server"].model_copy(update={"os": None})
    assert "its agent does not report its OS" in verify.capability_problems(linux, old)[0]


def test_an_unknown_os_name_is_a_plan_error():
    with pytest.raises(PlanError, match="os"):
        spec(extra="    server: {os: windows}\n")


def test_os_stays_out_of_the_spec_json_and_the_run_id_unless_named():
    plain, named = spec(), spec(extra="    server: {os: linux}\n")
    assert "os" not in plain.model_dump(mode="json")["hosts"]["server"]
    assert named.model_dump(mode="json")["hosts"]["server"]["os"] == "linux"
    assert plain.run_id != named.run_id


def test_line_rate_on_a_virtual_nic_is_flagged_and_on_a_physical_one_checked():
    s, inv = spec(), inventory()
    assert hostchecks.bottleneck_links(s) == [hostchecks.LinkRef(host="aqm", toward="client")]
    [flag] = hostchecks.line_rate_flags(s, every(), inv)
    assert str(flag) == ("G-NIC host aqm: to-client: line rate not checkable on driver veth (driver veth is "
                         "virtual: its speed is not a wire's; it reports 10000 Mb/s); the plan states 1000 Mbit/s")
    [flag] = hostchecks.line_rate_flags(s, every(driver="virtio_net", speed="virtio_settings.txt"), inv)
    assert "driver virtio_net" in flag.message and "Unknown!" in flag.message
    old = every()
    old["aqm"] = old["aqm"].model_copy(update={"link_speeds": {}})   # an agent from before link speeds
    [flag] = hostchecks.line_rate_flags(s, old, inv)
    assert "its agent reports no link speed" in flag.message
    # a physical NIC reporting 10000 Mb/s (the same `Speed:` line) under a 1gbit line_rate: refused
    physical = every(driver="ixgbe")
    assert hostchecks.line_rate_flags(s, physical, inv) == []
    verdict = check_run(s, physical, inv)
    assert isinstance(verdict, Refused)
    assert ("host aqm interface to-client (driver ixgbe) links at 10000 Mb/s, the plan's bottleneck line_rate is "
            "1000 Mbit/s (G-NIC)") in verdict.reasons
