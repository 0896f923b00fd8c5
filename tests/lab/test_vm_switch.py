"""The VM lab builds a topology with a switch: the Paced Chirping study's hosts with the aqm as a guest, whose
port on the switch is a tap in the switch's namespace, and again with receiver_a a guest on the switch too
(two guests meet at the bridge). Every host reaches every other (from the namespaces and from the guests), and
flows of both sender/receiver pairs cross the aqm guest and the switch into the DB. One lab per guest set
(own prefix and state dir), always taken down, and no namespace left behind."""
from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.lab import netns
from orchestrator.plan import load_plan
from orchestrator.plan.model.topology import plan_graph
from tests.lab.conftest import TEST_PREFIX, one_run_flows, run_lab_plan, vm_lab_up
from tests.lab.test_plan_topology import PC_PLAN, SWITCHED

PREFIX = f"{TEST_PREFIX}w"


@pytest.fixture(scope="module", params=[("aqm",), ("aqm", "receiver_a")], ids=["aqm", "aqm+receiver_a"])
def switch_vm_lab(tmp_path_factory, request) -> Iterator[tuple[dict, Path]]:
    plan = load_plan(PC_PLAN)
    try:
        yield from vm_lab_up(tmp_path_factory, PREFIX, request.param, graph=plan_graph(plan.roles, plan.topology))
    finally:
        assert netns.lab_namespaces(PREFIX) == []


def _pings(src: str, addr: str, state_dir: Path, guests: list[str]) -> bool:
    argv = ["ping", "-c1", "-W1", "-n", addr]
    if src in guests:
        from orchestrator.lab import vm

        return vm.guest_exec(argv, state_dir, timeout_s=10, role=src).returncode == 0
    return subprocess.run(["ip", "netns", "exec", f"{PREFIX}-{src}", *argv], capture_output=True,
                          timeout=10).returncode == 0


def test_every_host_reaches_every_other_across_the_aqm_guest_and_the_switch(switch_vm_lab):
    from orchestrator.lab import vm

    inv, state_dir = switch_vm_lab
    roles = list(inv["hosts"])
    guests = inv["vm"]["roles"]
    assert netns.lab_namespaces(PREFIX) == sorted(f"{PREFIX}-{n}" for n in [*roles, "switch"] if n not in guests)
    assert vm.status(state_dir, PREFIX)["healthy"]
    addrs = {role: [i["addr"] for i in h["interfaces"].values()] for role, h in inv["hosts"].items()}
    unreachable = [f"{src} -> {dst} {addr}" for src, dst in itertools.permutations(roles, 2)
                   for addr in addrs[dst] if not _pings(src, addr, state_dir, guests)]
    assert unreachable == []
    # a guest's port is a tap enslaved to the switch's bridge, next to the namespaces' veth ends
    ports = subprocess.run(["ip", "-n", f"{PREFIX}-switch", "-o", "link", "show", "master", "br0"],
                           capture_output=True, text=True, check=True).stdout
    assert sorted(line.split(":")[1].strip().split("@")[0] for line in ports.splitlines()) == [
        "to-aqm", "to-receiver_a", "to-receiver_b"]


def test_flows_of_both_pairs_cross_the_aqm_guest_and_the_switch(switch_vm_lab, tmp_path):
    _inv, state_dir = switch_vm_lab
    plan_file = tmp_path / "switched.yaml"
    plan_file.write_text(SWITCHED)
    db = run_lab_plan(plan_file, state_dir, tmp_path)
    flows = one_run_flows(db, "src_host, dst_host, src_addr, dst_addr, src_port")
    assert [(f.src_host, f.dst_host, f.src_addr, f.dst_addr) for f in flows] == [
        ("sender_a", "receiver_a", "10.199.1.1", "10.199.3.1"), ("sender_b", "receiver_b", "10.199.2.1", "10.199.3.2")]
    assert all(f.src_port for f in flows)       # iperf3 reported each flow's data stream: both ran
