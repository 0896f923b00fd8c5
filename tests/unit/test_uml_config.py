"""The UML lab's layout as data (orchestrator.lab.uml_config) and its pure neighbours: no root, nothing started."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engine.runner import clock_evidence
from orchestrator.lab.netns import LabError
from orchestrator.lab.topology import lab_topology, netns_topology
from orchestrator.lab.uml_config import (
    CONTROL_BRIDGE,
    console_hint,
    control_addr,
    host_config,
    host_nics,
    segment_bridges,
    stage1_env,
    uml_argv,
    wire_argv,
    wire_namespace,
)
from orchestrator.netns_socket import socket_in_netns
from orchestrator.plan.model.topology import Graph

CHAIN = netns_topology("tl")
SWITCHED = lab_topology(Graph(("sender_a", "sender_b", "aqm", "receiver_a", "receiver_b"), ("switch",),
                              (("sender_a", "aqm"), ("sender_b", "aqm"), ("aqm", "switch"),
                               ("switch", "receiver_a"), ("switch", "receiver_b"))), "tl")


def test_every_name_carries_the_prefix_or_lives_in_the_lab_namespace():
    cmds = wire_argv(CHAIN)
    assert cmds[0] == ["ip", "netns", "add", "tl-uml-net"]
    # every other command acts inside that namespace, never in the root namespace
    for argv in cmds[1:]:
        assert argv[:3] == ["ip", "-n", "tl-uml-net"] or argv[:4] == ["ip", "netns", "exec", "tl-uml-net"], argv
    assert wire_namespace("other") == "other-uml-net"


def test_links_and_switches_become_bridges_with_a_tap_per_nic():
    assert sorted(set(segment_bridges(CHAIN).values())) == ["l0", "l1"]
    # the three links to the switch share one bridge; the two sender links each their own
    assert sorted(set(segment_bridges(SWITCHED).values())) == ["l0", "l1", "s0"]
    aqm = host_nics(SWITCHED, "aqm")
    assert [(n.ifname, n.bridge) for n in aqm] == [("to-sender_a", "l0"), ("to-sender_b", "l1"),
                                                   ("to-switch", "s0"), ("ctl", CONTROL_BRIDGE)]
    taps = [n.tap for role in SWITCHED.hosts for n in host_nics(SWITCHED, role)]
    assert len(taps) == len(set(taps)) and all(len(t) <= 15 for t in taps)
    macs = [n.mac for role in SWITCHED.hosts for n in host_nics(SWITCHED, role)]
    assert len(macs) == len(set(macs))


def test_every_tap_has_sg_off_on_the_host_side_so_tso_frames_are_cut_on_the_wire():
    cmds = wire_argv(CHAIN)
    taps = [n.tap for role in CHAIN.hosts for n in host_nics(CHAIN, role)]
    for tap in taps:
        assert ["ip", "netns", "exec", "tl-uml-net", "ethtool", "-K", tap, "sg", "off"] in cmds
        add = cmds.index(["ip", "-n", "tl-uml-net", "tuntap", "add", "dev", tap, "mode", "tap"])
        assert cmds.index(["ip", "netns", "exec", "tl-uml-net", "ethtool", "-K", tap, "sg", "off"]) > add


def test_host_config_is_the_vm_guests_on_the_lab_control_network():
    cfg = host_config(CHAIN, "aqm")
    ctl = [i for i in cfg["interfaces"] if i["ifname"] == "ctl"][0]
    assert ctl["addr"] == control_addr(CHAIN, "aqm") == "10.198.0.2"
    assert cfg["exec_listen"] == ["10.198.0.2", 7101] and "clock" not in cfg
    agent = cfg["agent"]
    assert agent[agent.index("--listen") + 1] == "tcp://10.198.0.2:7100"
    assert agent[agent.index("--trace-prefix") + 1] == "tl"
    assert cfg["sysctls"]["net.ipv4.ip_forward"] == "1"
    assert cfg["sysctls"]["net.ipv6.conf.all.disable_ipv6"] == "1"
    client = host_config(CHAIN, "client")
    assert client["routes"] == [["10.199.2.0/24", "10.199.1.254", "to-aqm"]]


def test_uml_argv_runs_in_the_lab_namespace_with_its_prefixed_umid():
    env = stage1_env(Path("/run/x/uml-aqm/guest"), "/usr/bin/python3", Path("/repo"), ["/tmp/clone"], None)
    argv = uml_argv(Path("/usr/bin/linux.uml"), CHAIN, "aqm", Path("/run/x"), Path("/repo/init.sh"), env)
    assert argv[:5] == ["ip", "netns", "exec", "tl-uml-net", "/usr/bin/linux.uml"]
    assert "umid=tl-aqm" in argv and "uml_dir=/run/x/uml" in argv and "ro" in argv
    nics = host_nics(CHAIN, "aqm")
    assert [w for w in argv if w.startswith("vec")] == [
        f"vec{i}:transport=tap,ifname={n.tap},depth=128,gro=0,mac={n.mac}" + ("" if n.bridge == "ctl" else ",mtu=9000")
        for i, n in enumerate(nics)]
    assert [n.bridge for n in nics].count("ctl") == 1 and len(nics) == 3      # two data NICs can take jumbo frames
    cfg = host_config(CHAIN, "aqm")
    assert {i["ifname"]: i.get("mtu") for i in cfg["interfaces"]} == {"to-client": 1500, "to-server": 1500,
                                                                      "ctl": None}
    assert "TCPLAB_KEEP=/tmp/clone" in argv and not any(w.startswith("TCPLAB_MODULES") for w in argv)
    with pytest.raises(LabError, match="without spaces"):
        uml_argv(Path("/usr/bin/linux.uml"), CHAIN, "aqm", Path("/run/my lab"), Path("/repo/init.sh"), env)


def test_a_shared_clock_records_the_measured_offset_but_corrects_by_none():
    assert clock_evidence(7_131_000, 400_000, shared_clock=True) == {
        "offset_ns": 0, "rtt_ns": 400_000, "measured_offset_ns": 7_131_000, "shared_clock": True}
    assert clock_evidence(7_131_000, 400_000, shared_clock=False) == {"offset_ns": 7_131_000, "rtt_ns": 400_000}


@pytest.mark.parametrize("name", ["", "..", "a/b", "."])
def test_a_socket_is_opened_only_in_a_named_namespace(name):
    with pytest.raises(ValueError):
        socket_in_netns(name)


def test_the_lead_grows_with_the_processes_a_uml_host_starts_before_t0():
    from orchestrator.engine import timing

    uml, netns_ = timing.floors_for("uml"), timing.floors_for("netns")
    m = timing.size_margins(uml, [400_000], [], [])
    assert timing.lead_for_processes(m, uml, 1).lead_ns == m.lead_ns
    assert timing.lead_for_processes(m, uml, 8).lead_ns == uml.lead_ns + 7 * uml.per_process_ns
    n = timing.size_margins(netns_, [100_000], [], [])
    assert timing.lead_for_processes(n, netns_, 16) == n      # cheap process starts: unchanged


def test_the_tail_bound_grows_with_the_flow_processes_a_uml_host_starts():
    from orchestrator.engine import timing

    uml, netns_ = timing.floors_for("uml"), timing.floors_for("netns")
    m = timing.size_margins(uml, [400_000], [], [])
    assert timing.tail_for_processes(m, uml, 8).tail_max_ns == uml.tail_max_ns + 16 * uml.per_process_ns
    assert timing.tail_for_processes(m, uml, 8).lead_ns == m.lead_ns
    assert timing.tail_for_processes(m, uml, 0) == m
    late = timing.tail_for_processes(m, uml, 1, late_ns=20_000_000_000)     # a 40 s iperf3 flow may connect 20 s late
    assert late.tail_max_ns == uml.tail_max_ns + 2 * uml.per_process_ns + 20_000_000_000
    n = timing.size_margins(netns_, [100_000], [], [])
    assert timing.tail_for_processes(n, netns_, 16) == n


def test_a_kernel_too_old_for_the_cpus_xsave_area_is_named_with_the_fix():
    """A real console: the build without the xstate patch on an AMX CPU; the hint names the patch and the command.
    What the lab shows is the console without the panic's stack dump (uml._console_tail)."""
    from orchestrator.lab.uml import _console_tail

    tail = _console_tail(Path(__file__).resolve().parents[1] / "fixtures" / "uml" / "console-xstate-panic.log")
    assert "[<" not in tail and "Attempted to kill init" in tail
    hint = console_hint(tail)
    assert hint is not None and "uml-host-xstate.patch" in hint and "tcplab kernel uml --build" in hint
    assert console_hint("Kernel panic - not syncing: VFS: Unable to mount root fs") is None


def test_a_uml_hosts_data_nics_start_at_1500_before_they_take_addresses():
    from orchestrator.lab import vm_guest

    cfg = host_config(CHAIN, "aqm")
    names = {i["mac"].lower(): f"eth{n}" for n, i in enumerate(cfg["interfaces"])}
    cmds = vm_guest.setup_argv(cfg, names)
    mtu = [c for c in cmds if "mtu" in c]
    assert mtu == [["ip", "link", "set", "dev", "to-client", "mtu", "1500"],
                   ["ip", "link", "set", "dev", "to-server", "mtu", "1500"]]
    assert cmds.index(mtu[0]) < cmds.index(next(c for c in cmds if c[:3] == ["ip", "addr", "add"]))
