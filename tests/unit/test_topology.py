"""Topology as part of the plan (pure): the default a plan's roles give, the lab's addresses and routes as
literal tables, the located errors of a bad topology, and the lab-mismatch sentence of `tcplab run`."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.engine.topology_match import topology_mismatch
from orchestrator.inventory import Inventory
from orchestrator.lab.netns import inventory_dict
from orchestrator.lab.topology import build_argv, lab_topology, neigh_argv, netns_topology, routes
from orchestrator.plan import PlanError, TopologySpec, expand, load_plan_text
from orchestrator.plan.model.topology import Graph, default_links, plan_graph

PC_ROLES = ["sender_a", "sender_b", "aqm", "receiver_a", "receiver_b"]


@pytest.mark.parametrize(("roles", "links", "switches"), [
    (["sender", "receiver"], [("sender", "receiver")], []),
    (["client", "aqm", "server"], [("client", "aqm"), ("aqm", "server")], []),
    (["sender_a", "sender_b", "aqm", "receiver"],
     [("sender_a", "aqm"), ("sender_b", "aqm"), ("aqm", "receiver")], []),
    (PC_ROLES, [("sender_a", "aqm"), ("sender_b", "aqm"), ("aqm", "switch"), ("switch", "receiver_a"),
                ("switch", "receiver_b")], ["switch"]),
    (["a", "b", "c", "d"], [("a", "b"), ("b", "c"), ("c", "d")], []),
])
def test_default_topology_follows_the_documented_rule(roles, links, switches):
    assert default_links(roles) == (tuple(links), tuple(switches))


def test_the_quickstart_lab_keeps_its_addresses_and_routes():
    topo = netns_topology("t")
    assert [(e.role, e.ifname, e.addr) for link in topo.links for e in (link.a, link.b)] == [
        ("client", "to-aqm", "10.199.1.1"), ("aqm", "to-client", "10.199.1.254"),
        ("server", "to-aqm", "10.199.2.1"), ("aqm", "to-server", "10.199.2.254")]
    assert routes(topo) == [("client", "10.199.2.0/24", "10.199.1.254", "to-aqm"),
                            ("server", "10.199.1.0/24", "10.199.2.254", "to-aqm")]
    assert ["ip", "netns", "exec", "t-aqm", "sysctl", "-qw", "net.ipv4.ip_forward=1"] in build_argv(topo)


def test_a_switch_is_one_subnet_and_the_far_hosts_route_through_the_aqm():
    topo = lab_topology(plan_graph(PC_ROLES, None), "t")
    assert [(link.a.role, link.a.ifname, link.a.addr, link.b.role, link.b.ifname, link.b.addr, link.subnet)
            for link in topo.links] == [
        ("sender_a", "to-aqm", "10.199.1.1", "aqm", "to-sender_a", "10.199.1.254", "10.199.1.0/24"),
        ("sender_b", "to-aqm", "10.199.2.1", "aqm", "to-sender_b", "10.199.2.254", "10.199.2.0/24"),
        ("aqm", "to-switch", "10.199.3.254", "switch", "to-aqm", "", "10.199.3.0/24"),
        ("receiver_a", "to-switch", "10.199.3.1", "switch", "to-receiver_a", "", "10.199.3.0/24"),
        ("receiver_b", "to-switch", "10.199.3.2", "switch", "to-receiver_b", "", "10.199.3.0/24")]
    assert routes(topo) == [
        ("sender_a", "10.199.2.0/24", "10.199.1.254", "to-aqm"),
        ("sender_a", "10.199.3.0/24", "10.199.1.254", "to-aqm"),
        ("sender_b", "10.199.1.0/24", "10.199.2.254", "to-aqm"),
        ("sender_b", "10.199.3.0/24", "10.199.2.254", "to-aqm"),
        ("receiver_a", "10.199.1.0/24", "10.199.3.254", "to-switch"),
        ("receiver_a", "10.199.2.0/24", "10.199.3.254", "to-switch"),
        ("receiver_b", "10.199.1.0/24", "10.199.3.254", "to-switch"),
        ("receiver_b", "10.199.2.0/24", "10.199.3.254", "to-switch")]
    argv = build_argv(topo)
    assert ["ip", "-n", "t-switch", "link", "add", "br0", "type", "bridge"] in argv
    assert ["ip", "-n", "t-switch", "link", "set", "to-receiver_b", "master", "br0"] in argv
    assert [a[3] for a in argv if a[-1] == "net.ipv4.ip_forward=1"] == ["t-aqm"]


def test_a_longer_chain_routes_over_two_hops_through_the_nearest_router():
    topo = lab_topology(Graph(("a", "b", "c", "d"), (), (("a", "b"), ("b", "c"), ("c", "d"))), "t")
    assert routes(topo) == [
        ("a", "10.199.2.0/24", "10.199.1.254", "to-b"), ("a", "10.199.3.0/24", "10.199.1.254", "to-b"),
        ("b", "10.199.3.0/24", "10.199.2.253", "to-c"),
        ("c", "10.199.1.0/24", "10.199.2.254", "to-b"),
        ("d", "10.199.2.0/24", "10.199.3.254", "to-c"), ("d", "10.199.1.0/24", "10.199.3.254", "to-c")]


def test_hosts_on_a_switch_get_every_other_host_on_it_as_neighbour_and_in_the_inventory():
    topo = lab_topology(plan_graph(PC_ROLES, None), "t")
    macs = {(e.role, e.ifname): f"02:00:00:00:00:{i:02x}"
            for i, e in enumerate(e for link in topo.links for e in (link.a, link.b))}
    rb = [a for a in neigh_argv(topo, macs) if a[2] == "t-receiver_b"]
    assert [(a[5], a[9]) for a in rb] == [("10.199.3.254", "to-switch"), ("10.199.3.1", "to-switch")]
    inv = Inventory.model_validate(inventory_dict(topo, "netns", Path("/tok"), macs,
                                                  {r: "unix:/x" for r in PC_ROLES}, {r: f"t-{r}" for r in PC_ROLES}))
    aqm = inv.hosts["aqm"]
    assert aqm.iface_toward("receiver_a") == aqm.iface_toward("receiver_b") == "to-switch"
    assert aqm.interfaces["to-switch"].switch_peers == {"receiver_a": "10.199.3.1", "receiver_b": "10.199.3.2"}
    assert inv.hosts["receiver_a"].iface_toward("aqm") == "to-switch"


PLAN = """version: 1
name: t
roles: [sender_a, sender_b, aqm, receiver]
{topology}
run:
  duration: 2s
  bottleneck: {{at: {{host: aqm, toward: {toward}}}, rate: 20mbit, queue: {{kind: pfifo, limit: 30}}}}
  traffic: {{src: sender_a, dst: receiver, cc: cubic, flows: 1}}
"""


def issues(topology: str, toward: str = "receiver") -> list[str]:
    with pytest.raises(PlanError) as info:
        load_plan_text(PLAN.format(topology=topology, toward=toward), "p.yaml")
    return [str(i) for i in info.value.issues]


def test_unknown_hosts_in_links_are_located():
    assert issues("topology: {links: [[sender_a, aqm], [sender_b, aqm], [aqm, reciever]]}") == [
        "p.yaml:4:60: topology.links[2][1]: unknown host 'reciever' (roles: sender_a, sender_b, aqm, receiver; "
        "switches: none)"]


def test_a_disconnected_topology_and_a_bad_switch_are_refused():
    assert issues("topology: {links: [[sender_a, aqm], [sender_b, receiver]]}") == [
        "p.yaml:4:11: topology: the topology is not connected: sender_a, aqm; sender_b, receiver cannot reach "
        "each other"]
    assert issues("topology: {links: [[sender_a, aqm], [sender_b, aqm], [aqm, aqm], [aqm, receiver]]}") == [
        "p.yaml:4:54: topology.links[2]: a link joins two different nodes, not 'aqm' to itself"]
    assert issues("topology: {links: [[sender_a, aqm], [sender_b, aqm], [aqm, receiver]], switches: [aqm]}") == [
        "p.yaml:4:83: topology.switches[0]: 'aqm' is a role: a switch is a node with no agent"]


def test_toward_a_host_that_is_not_a_neighbour_is_located():
    assert issues("topology: {links: [[sender_a, aqm], [sender_b, aqm], [aqm, receiver]]}", toward="sender_c"
                  )[0].startswith("p.yaml:7:40: run.bottleneck.at.toward: unknown role 'sender_c'")
    assert issues("topology: {links: [[sender_a, aqm], [sender_b, aqm], [sender_a, receiver]]}") == [
        "p.yaml:7:40: run.bottleneck.at.toward: 'receiver' is not a neighbour of 'aqm' in the topology "
        "(neighbours: sender_a, sender_b)"]


def test_a_stated_topology_enters_the_run_id_and_the_default_does_not():
    default = expand(load_plan_text(PLAN.format(topology="", toward="receiver")))
    same = expand(load_plan_text(PLAN.format(
        topology="topology: {links: [[sender_a, aqm], [sender_b, aqm], [aqm, receiver]]}", toward="receiver")))
    assert default[0].topology is None and "topology" not in default[0].model_dump(mode="json")
    assert default[0].testbed == same[0].topology == same[0].testbed == TopologySpec(
        hosts=["sender_a", "sender_b", "aqm", "receiver"],
        links=[("sender_a", "aqm"), ("sender_b", "aqm"), ("aqm", "receiver")])
    assert default[0].run_id != same[0].run_id


def _inv(kind: str, hosts: list[str], topology: dict | None = None) -> Inventory:
    return Inventory.model_validate({"kind": kind, "token_file": "/t", "topology": topology, "hosts": {
        h: {"agent": "unix:/x", "interfaces": {}} for h in hosts}})


def test_a_lab_of_other_hosts_or_links_is_refused_with_the_command_that_fixes_it():
    need = TopologySpec(hosts=["sender", "aqm", "receiver"], links=[("sender", "aqm"), ("aqm", "receiver")])
    assert topology_mismatch(need, _inv("netns", ["client", "aqm", "server"]), Path("p.yaml")) == (
        "the testbed has hosts client, aqm, server; the plan needs sender, aqm, receiver: run "
        "`tcplab lab up --plan p.yaml`")
    built = {"hosts": ["sender", "aqm", "receiver"], "switches": [], "links": [["sender", "receiver"],
                                                                               ["aqm", "receiver"]]}
    assert topology_mismatch(need, _inv("netns", need.hosts, built), Path("p.yaml")) == (
        "the lab is built as sender-receiver, aqm-receiver; the plan needs sender-aqm, aqm-receiver: run "
        "`tcplab lab up --plan p.yaml`")
    same = {**built, "links": [["sender", "aqm"], ["receiver", "aqm"]]}
    assert topology_mismatch(need, _inv("netns", need.hosts, same), Path("p.yaml")) is None
    assert topology_mismatch(need, _inv("physical", need.hosts), Path("p.yaml")) is None
