"""Coalescing, pause frames, static neighbours and module parameters: parsing literal ethtool/ip output,
argv building, read-back comparison, preflight refusal and the reset comparison. Pure, no root."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.host import ethtool, neighbours
from agents.host.baseline import InterfaceSnapshot, Snapshot
from agents.host.executor import snapshot_differences
from orchestrator.engine import verify
from orchestrator.engine.bind import BindError, host_states, peer_neighbours
from orchestrator.inventory import Inventory
from orchestrator.plan import expand, load_plan_text
from schemas import nic
from schemas.hoststate import HostState, InterfaceState
from schemas.neighbours import permanent_neighbours
from schemas.protocol import Capabilities, InterfaceReadback, Readback

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "ethtool"


def test_virtio_coalesce_text_keeps_only_what_the_driver_has():
    got = ethtool.parse_coalesce((FIX / "virtio_coalesce.txt").read_text())
    assert got == {"rx-usecs": 0, "rx-frames": 1, "tx-usecs": 0, "tx-frames": 1}


def test_tun_coalesce_has_rx_frames_only():
    assert ethtool.parse_coalesce((FIX / "tun_coalesce.txt").read_text()) == {"rx-frames": 0}


def test_adaptive_and_aliased_lines():
    text = ("Coalesce parameters for eth0:\nAdaptive RX: on  TX: off\nrx-usecs: 8\nrx-frame-low: 3\n"
            "CQE mode RX: n/a  TX: n/a\n")
    assert ethtool.parse_coalesce(text) == {"adaptive-rx": True, "adaptive-tx": False, "rx-usecs": 8,
                                            "rx-frames-low": 3}


@pytest.mark.parametrize("text", ["", "Pause parameters for eth0:\n", "Coalesce parameters for x:\nrx-usecs: lots\n",
                                  "Coalesce parameters for x:\nbogus-param: 1\n"])
def test_coalesce_parser_refuses_what_it_does_not_know(text):
    with pytest.raises(ethtool.EthtoolParseError):
        ethtool.parse_coalesce(text)


def test_unsupported_is_told_apart_from_failure():
    stderr = (FIX / "veth_coalesce.stderr").read_text()
    rc = int((FIX / "veth_coalesce.rc").read_text())
    assert ethtool.unsupported_reason(rc, stderr) == "netlink error: Operation not supported"
    with pytest.raises(ethtool.EthtoolParseError):   # the refusal's empty stdout is not "no parameters"
        ethtool.parse_coalesce((FIX / "veth_coalesce.txt").read_text())
    assert ethtool.unsupported_reason(1, "netlink error: No such device") is None
    assert ethtool.unsupported_reason(0, "") is None
    pause_rc = int((FIX / "veth_pause_json.rc").read_text())
    assert ethtool.unsupported_reason(pause_rc, (FIX / "veth_pause_json.stderr").read_text())
    with pytest.raises(ethtool.EthtoolParseError):   # "[ ]": the JSON a refusing driver prints
        ethtool.parse_pause_json((FIX / "veth_pause_json.txt").read_text())


def test_pause_json():
    assert ethtool.parse_pause_json((FIX / "pause_stats.json").read_text()) == {"autoneg": True, "rx": True,
                                                                               "tx": True}


def test_argv_builders():
    assert ethtool.coalesce_argv("eth1", {"tx-usecs": 0, "rx-usecs": 0, "adaptive-rx": False}) == [
        "ethtool", "-C", "eth1", "adaptive-rx", "off", "rx-usecs", "0", "tx-usecs", "0"]
    with pytest.raises(ValueError):
        ethtool.coalesce_argv("eth1", {"rx-usecs; reboot": 0})
    assert ethtool.pause_argv("eth1", {"tx": False, "autoneg": False, "rx": False}) == [
        "ethtool", "-A", "eth1", "autoneg", "off", "rx", "off", "tx", "off"]
    assert neighbours.replace_argv("to-aqm", "10.0.0.1", "52:54:00:00:00:01") == [
        "ip", "neigh", "replace", "10.0.0.1", "lladdr", "52:54:00:00:00:01", "dev", "to-aqm", "nud", "permanent"]


# literal `ip -j neigh show dev to-aqm` in a VM-lab client namespace, plus a STALE entry added by hand
NEIGH = json.loads('[{"dst":"10.199.1.254","lladdr":"52:54:00:7c:01:fe","state":["PERMANENT"]},'
                   '{"dst":"10.199.1.9","lladdr":"52:54:00:7c:01:09","state":["STALE"]}]')


def test_permanent_neighbours():
    assert permanent_neighbours(NEIGH) == {"10.199.1.254": "52:54:00:7c:01:fe"}


def _rb(**iface) -> Readback:
    base = dict(tc_qdisc=[], tc_class_text="", htb_classes=[], features={}, driver="virtio_net")
    return Readback(kernel_release="6.1.0-56-amd64", sysctls={}, module_params={"tcp_dctcp": {"dctcp_shift_g": "4"}},
                    interfaces={"to-client": InterfaceReadback(**{**base, **iface})})


def test_readback_differences_for_nic_settings_and_module_params():
    want = HostState(module_params={"tcp_dctcp": {"dctcp_shift_g": "5"}}, interfaces={"to-client": InterfaceState(
        coalesce={"rx-usecs": 0, "tx-usecs": 0}, pause={"rx": False},
        neighbours={"10.199.1.254": "52:54:00:7C:01:FE", "10.199.1.9": "52:54:00:7c:01:09"})})
    rb = _rb(coalesce={"rx-usecs": 3, "tx-usecs": 0}, pause={"autoneg": True, "rx": True, "tx": True},
             neighbours=NEIGH)
    diffs = verify.readback_differences(want, rb)
    assert diffs == ["module parameter tcp_dctcp.dctcp_shift_g: '4' != '5'",
                     "to-client coalesce rx-usecs: 3 != 0",
                     "to-client pause rx: True != False",
                     "to-client neighbour 10.199.1.9: not permanent != 52:54:00:7c:01:09 permanent"]


def test_off_holds_by_absence_and_is_noted_but_on_does_not():
    want = HostState(interfaces={"to-client": InterfaceState(coalesce={"rx-usecs": 0}, pause={"rx": False})})
    rb = _rb(driver="veth", coalesce=None, pause=None,
             unsupported={"coalesce": "netlink error: Operation not supported",
                          "pause": "netlink error: Operation not supported"})
    assert verify.readback_differences(want, rb) == []
    assert [str(f) for f in verify.nic_flags("aqm", want, rb)] == [
        "G-NIC host aqm: to-client: coalescing rx-usecs off by absence (driver veth: netlink error: Operation not "
        "supported)",
        "G-NIC host aqm: to-client: pause frames off by absence (driver veth: netlink error: Operation not supported)"]
    on = HostState(interfaces={"to-client": InterfaceState(coalesce={"rx-usecs": 8}, pause={"rx": True})})
    assert verify.readback_differences(on, rb) == [
        "to-client coalesce rx-usecs: driver veth has none, wanted 8",
        "to-client pause rx: driver veth has no pause frames, wanted on"]


def test_a_drivers_coalescing_floor_holds_off_and_is_noted():
    # UML's vector NIC as the agent read it back inside a UML host (HZ 1000) after asking rx-usecs 0 and
    # tx-usecs 0: tx-usecs 1000 (one jiffy; 2000 before), rx-usecs absent (`ethtool -c`: "rx-usecs: n/a")
    want = HostState(interfaces={"to-client": InterfaceState(coalesce={"rx-usecs": 0, "tx-usecs": 0})})
    rb = _rb(driver="uml-vector", coalesce={"tx-usecs": 1000}, unsupported={"coalesce": "no such parameter"})
    assert verify.readback_differences(want, rb) == []
    assert [str(f) for f in verify.nic_flags("aqm", want, rb)] == [
        "G-NIC host aqm: to-client: coalescing rx-usecs off by absence (driver uml-vector: no such parameter)",
        "G-NIC host aqm: to-client: coalescing off as far as it goes: tx-usecs 1000 is driver uml-vector's floor: "
        "its TX timer is at least one jiffy and runs only while the stack announces more packets (xmit_more)"]
    # a value above the floor, or a request other than off, or another driver: still a difference
    for driver, have, asked in (("uml-vector", 200_000, 0), ("uml-vector", 1000, 8), ("virtio_net", 1000, 0)):
        other = HostState(interfaces={"to-client": InterfaceState(coalesce={"tx-usecs": asked})})
        assert verify.readback_differences(other, _rb(driver=driver, coalesce={"tx-usecs": have})) == [
            f"to-client coalesce tx-usecs: {have} != {asked}"]


def test_boolean_module_parameters_compare_as_one_and_zero():
    assert verify.norm_module_param("Y") == verify.norm_module_param("1") == verify.norm_module_param("true")
    assert verify.norm_module_param("N") == verify.norm_module_param("0")
    assert verify.norm_module_param("850") == "850"


PLAN = """name: nic
roles: [client, aqm, server]
run:
  duration: 5s
  bottleneck: {at: {host: aqm, toward: client}, rate: 20mbit, queue: {kind: pfifo, limit: 100}}
  traffic: {src: server, dst: client, cc: reno, flows: 1}
  hosts:
    all:
      coalesce: {rx-usecs: COAL, tx-usecs: 0}
      pause: {autoneg: false, rx: false, tx: false}
    server:
      static_neighbours: false
      module_params: {tcp_cubic: {beta: 850}}
"""


def _inventory(server_mac: str = "da:00:00:00:02:01") -> Inventory:
    def iface(toward, addr, peer, mac):
        return {"toward": toward, "addr": addr, "plen": 24, "peer_addr": peer, "mac": mac}
    return Inventory.model_validate({"kind": "vm", "token_file": "/dev/null", "hosts": {
        "client": {"agent": "unix:/c",
                   "interfaces": {"to-aqm": iface("aqm", "10.9.1.1", "10.9.1.254", "aa:00:00:00:01:01")}},
        "aqm": {"agent": "tcp://127.0.0.1:1", "interfaces": {
            "to-client": iface("client", "10.9.1.254", "10.9.1.1", "52:54:00:00:01:FE"),
            "to-server": iface("server", "10.9.2.254", "10.9.2.1", "52:54:00:00:02:fe")}},
        "server": {"agent": "unix:/s", "interfaces": {"to-aqm": iface("aqm", "10.9.2.1", "10.9.2.254", server_mac)}}}})


def test_host_states_carry_nic_settings_neighbours_and_module_params():
    (run,) = expand(load_plan_text(PLAN.replace("COAL", "0"), "nic.yaml"))
    states = host_states(run, _inventory())
    aqm = states["aqm"].interfaces
    assert aqm["to-client"].neighbours == {"10.9.1.1": "aa:00:00:00:01:01"}
    assert aqm["to-server"].neighbours == {"10.9.2.1": "da:00:00:00:02:01"}
    assert states["client"].interfaces["to-aqm"].neighbours == {"10.9.1.254": "52:54:00:00:01:fe"}
    assert states["server"].interfaces["to-aqm"].neighbours == {}          # static_neighbours: false
    assert states["server"].module_params == {"tcp_cubic": {"beta": "850"}}
    assert aqm["to-client"].coalesce == {"rx-usecs": 0, "tx-usecs": 0}
    assert aqm["to-client"].pause == {"autoneg": False, "rx": False, "tx": False}


def test_a_peer_without_a_mac_is_an_error_not_a_silent_skip():
    with pytest.raises(BindError, match=r"no MAC for 10\.9\.2\.1 \(peer of aqm to-server\)"):
        peer_neighbours(_inventory(server_mac=""), "aqm", "to-server")


def _caps(coalesce: list[str], pause: bool) -> Capabilities:
    return Capabilities(kernel_release="6.18.1", qdiscs=["pfifo", "htb"], congestion_controls=["reno", "cubic"],
                        allowed_congestion_controls=["reno"], offload_features={}, tools={}, tracepoints=[],
                        coalesce_params={"to-aqm": coalesce}, pause_frames={"to-aqm": pause},
                        drivers={"to-aqm": "veth"})


def test_preflight_refuses_coalescing_a_driver_lacks_but_accepts_off():
    (off,) = expand(load_plan_text(PLAN.replace("COAL", "0"), "nic.yaml"))
    (on,) = expand(load_plan_text(PLAN.replace("COAL", "8"), "nic.yaml"))
    caps = {r: _caps([], False) for r in ("client", "aqm", "server")}
    assert verify.nic_problems(off, caps) == []
    assert "host client (kernel 6.18.1) interface to-aqm (driver veth) has no coalescing parameter rx-usecs" \
        in verify.nic_problems(on, caps)
    assert verify.nic_problems(on, {r: _caps(["rx-usecs", "tx-usecs"], False) for r in caps}) == []


def test_reset_comparison_names_every_leftover():
    want = Snapshot(sysctls={"net.ipv4.tcp_ecn": "2"}, module_params={("tcp_dctcp", "dctcp_shift_g"): "4"},
                    interfaces={"eth1": InterfaceSnapshot(features={"tso": True}, root_kind="pfifo_fast",
                                                          coalesce={"rx-usecs": 0}, pause=None,
                                                          neighbours={"10.0.0.1": "aa:bb:cc:dd:ee:ff"})})
    same = Snapshot(sysctls=dict(want.sysctls), module_params=dict(want.module_params),
                    interfaces={"eth1": InterfaceSnapshot(**vars(want.interfaces["eth1"]))})
    assert snapshot_differences(want, same) == []
    got = Snapshot(sysctls={"net.ipv4.tcp_ecn": "1"}, module_params={("tcp_dctcp", "dctcp_shift_g"): "5"},
                   interfaces={"eth1": InterfaceSnapshot(features={"tso": False}, root_kind="htb",
                                                         coalesce={"rx-usecs": 8}, pause=None, neighbours={})})
    assert snapshot_differences(want, got) == [
        "sysctl net.ipv4.tcp_ecn: '1' != snapshot '2'",
        "module parameter tcp_dctcp.dctcp_shift_g: '5' != snapshot '4'",
        "eth1 offload tso: False != snapshot True",
        "eth1 root qdisc htb != snapshot pfifo_fast",
        "eth1 coalesce {'rx-usecs': 8} != snapshot {'rx-usecs': 0}",
        "eth1 neighbours {} != snapshot {'10.0.0.1': 'aa:bb:cc:dd:ee:ff'}"]


def test_plan_names_match_the_nic_tables_both_sides_use():
    """The plan accepts exactly the NIC setting names the agent can apply and the manager can verify: a name
    added to one and not the other would be refused by the agent mid-campaign, or never checked on read-back."""
    schema = json.loads((Path(__file__).resolve().parents[2] / "schemas" / "plan.schema.json").read_text())
    props = schema["$defs"]["HostSection"]["properties"]
    assert set(props["offloads"]["propertyNames"]["enum"]) == set(nic.OFFLOAD_LONG_NAMES)
    assert set(props["coalesce"]["propertyNames"]["enum"]) == nic.COALESCE_NAMES
    assert tuple(props["pause"]["propertyNames"]["enum"]) == nic.PAUSE_NAMES


def test_offload_long_names_are_what_ethtool_reports():
    """Every short name maps to the feature `ethtool --json -k` really reports (ethtool 6.1, virtio_net in the
    VM lab's aqm guest, tests/fixtures/tc/README.md): a misspelt long name would make read-back miss it."""
    reported = json.loads((FIX.parent / "tc" / "virtio_net_ethtool_k.json").read_text())[0]
    assert {short: long for short, long in nic.OFFLOAD_LONG_NAMES.items() if long not in reported} == {}
    assert set(reported["tcp-segmentation-offload"]) == {"active", "fixed", "requested"}
