"""Labs built from a plan's topology: the Paced Chirping study's hosts around an aqm and a switch come up with
every host reaching every other, and a two-sender dumbbell runs staggered flows from both senders into the DB.
Each test builds its own lab (own prefix and state dir) and takes it down by prefix, even when it fails."""
from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from analysis.summary import run_table
from orchestrator.inventory import load_inventory
from orchestrator.lab import netns
from orchestrator.plan import load_plan
from orchestrator.plan.model.topology import plan_graph
from tests.lab.conftest import TEST_PREFIX, lab_unavailable, one_run_flows, run_lab_plan, run_plan_quietly

ROOT = Path(__file__).resolve().parents[2]
PC_PLAN = ROOT / "experiments/paced-chirping/chirping.yaml"

DUMBBELL = """
version: 1
name: dumbbell
description: two senders share one htb bottleneck on the aqm toward one receiver; flows staggered by 1 s
roles: [sender_a, sender_b, aqm, receiver]
topology:
  links: [[sender_a, aqm], [sender_b, aqm], [aqm, receiver]]
tags: [smoke]
seed: 1
run:
  duration: 3s
  bottleneck:
    at: {host: aqm, toward: receiver}
    rate: 20mbit
    queue: {kind: pfifo, limit: 30}
  traffic:
    src: sender_a
    dst: receiver
    cc: cubic
    flows: 2
    stagger: 1s
    base_port: 5201
    per_flow: {1: {src: sender_b}}
  hosts:
    all:
      offloads: {tso: off, gso: off, gro: off, sg: off}
"""


SWITCHED = """
version: 1
name: switched
description: the default topology of these roles puts both receivers behind one switch port of the aqm
roles: [sender_a, sender_b, aqm, receiver_a, receiver_b]
tags: [smoke]
seed: 1
run:
  duration: 3s
  bottleneck:
    at: {host: aqm, toward: receiver_a}
    rate: 20mbit
    queue: {kind: pfifo, limit: 30}
  traffic:
    src: sender_a
    dst: receiver_a
    cc: cubic
    flows: 2
    base_port: 5201
    per_flow: {1: {src: sender_b, dst: receiver_b}}
  qdisc_stats: {links: [{host: aqm, toward: receiver_b}]}
  hosts:
    all:
      offloads: {tso: off, gso: off, gro: off, sg: off}
"""


@pytest.fixture
def plan_lab(tmp_path) -> Iterator[tuple[str, Path]]:
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    prefix, state_dir = f"{TEST_PREFIX}t", tmp_path / "labstate"
    try:
        yield prefix, state_dir
    finally:
        netns.down(state_dir, prefix)
        assert netns.lab_namespaces(prefix) == []


def test_the_paced_chirping_topology_comes_up_and_every_host_reaches_every_other(plan_lab):
    prefix, state_dir = plan_lab
    plan = load_plan(PC_PLAN)
    inv = netns.up(state_dir, prefix, graph=plan_graph(plan.roles, plan.topology), timeout_s=60)
    assert sorted(inv["hosts"]) == sorted(plan.roles)
    assert netns.lab_namespaces(prefix) == sorted(f"{prefix}-{n}" for n in [*plan.roles, "switch"])
    assert netns.status(state_dir, prefix)["healthy"]
    addrs = {role: [i["addr"] for i in h["interfaces"].values()] for role, h in inv["hosts"].items()}
    unreachable = []
    for src, dst in itertools.permutations(plan.roles, 2):
        for addr in addrs[dst]:
            done = subprocess.run(["ip", "netns", "exec", f"{prefix}-{src}", "ping", "-c1", "-W1", "-n", addr],
                                  capture_output=True, text=True, timeout=10)
            if done.returncode != 0:
                unreachable.append(f"{src} -> {dst} {addr}")
    assert unreachable == []
    # the receivers share the aqm's one port to the switch: one bottleneck for both
    aqm = load_inventory(netns.inventory_path(state_dir)).hosts["aqm"]
    assert aqm.iface_toward("receiver_a") == aqm.iface_toward("receiver_b") == "to-switch"


def test_a_two_sender_dumbbell_runs_and_both_senders_flows_are_in_the_db(plan_lab, tmp_path):
    prefix, state_dir = plan_lab
    plan_file = tmp_path / "dumbbell.yaml"
    plan_file.write_text(DUMBBELL)
    plan = load_plan(plan_file)
    netns.up(state_dir, prefix, graph=plan_graph(plan.roles, plan.topology), timeout_s=60)
    db = run_lab_plan(plan_file, state_dir, tmp_path)
    flows = one_run_flows(db, "flow_id, src_host, dst_host, src_addr, dst_addr, src_port, start_s")
    assert [(f.flow_id, f.src_host, f.dst_host, f.src_addr, f.dst_addr, f.start_s) for f in flows] == [
        (0, "sender_a", "receiver", "10.199.1.1", "10.199.3.1", 0.0),
        (1, "sender_b", "receiver", "10.199.2.1", "10.199.3.1", 1.0)]
    assert all(f.src_port for f in flows)       # iperf3 reported each flow's data stream: both ran


def test_a_run_on_a_lab_of_another_topology_says_how_to_fix_it(plan_lab, tmp_path):
    prefix, state_dir = plan_lab
    netns.up(state_dir, prefix, timeout_s=60)        # the quickstart's client <-> aqm <-> server
    plan_file = tmp_path / "dumbbell.yaml"
    plan_file.write_text(DUMBBELL)
    rc, out = run_plan_quietly(plan_file, f"sqlite:///{tmp_path / 'x.db'}", state_dir, tmp_path / "results")
    assert rc == 3
    assert (f"the testbed has hosts client, aqm, server; the plan needs sender_a, sender_b, aqm, receiver: run "
            f"`tcplab lab up --plan {plan_file}`") in " ".join(out.split())


def test_flows_to_both_receivers_behind_the_switch_share_the_one_bottleneck(plan_lab, tmp_path):
    prefix, state_dir = plan_lab
    plan_file = tmp_path / "switched.yaml"
    plan_file.write_text(SWITCHED)
    plan = load_plan(plan_file)
    netns.up(state_dir, prefix, graph=plan_graph(plan.roles, plan.topology), timeout_s=60)
    db = run_lab_plan(plan_file, state_dir, tmp_path)
    flows = one_run_flows(db, "src_host, dst_host, src_port")
    assert [(f.src_host, f.dst_host) for f in flows] == [("sender_a", "receiver_a"), ("sender_b", "receiver_b")]
    assert all(f.src_port for f in flows)
    (row,) = run_table(db)
    # a machine under load only lowers goodput; a flow that bypassed the 20 Mbit/s htb would add hundreds
    assert 0 < row.goodput_bps <= 1.05 * 20e6, row.goodput_bps
    assert all(g > 0 for g in row.flow_goodput_bps), row.flow_goodput_bps
