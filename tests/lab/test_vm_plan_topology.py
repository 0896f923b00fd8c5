"""The VM lab builds a plan's topology: the two-sender dumbbell with the aqm as a guest; both senders' flows
cross the guest and land in the DB. Own prefix and state dir; the lab is taken down even when the test fails."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.lab import netns
from orchestrator.plan import load_plan
from orchestrator.plan.model.topology import plan_graph
from tests.lab.conftest import TEST_PREFIX, one_run_flows, run_lab_plan, skip_unless_vm_lab_can_run
from tests.lab.test_plan_topology import DUMBBELL


@pytest.fixture
def dumbbell_vm_lab(tmp_path) -> Iterator[tuple[Path, Path]]:
    from orchestrator.lab import vm

    skip_unless_vm_lab_can_run()
    prefix, state_dir = f"{TEST_PREFIX}v", tmp_path / "labstate"
    plan_file = tmp_path / "dumbbell.yaml"
    plan_file.write_text(DUMBBELL)
    plan = load_plan(plan_file)
    try:
        inv = vm.up(state_dir, prefix, timeout_s=240, vm_roles=("aqm",), graph=plan_graph(plan.roles, plan.topology))
        assert sorted(inv["hosts"]) == sorted(plan.roles) and inv["vm"]["roles"] == ["aqm"]
        yield plan_file, state_dir
    finally:
        vm.down(state_dir, prefix)
        assert netns.lab_namespaces(prefix) == []


def test_a_two_sender_dumbbell_crosses_the_aqm_guest(dumbbell_vm_lab, tmp_path):
    plan_file, state_dir = dumbbell_vm_lab
    flows = one_run_flows(run_lab_plan(plan_file, state_dir, tmp_path), "src_host, dst_host, src_addr, src_port")
    assert [(f.src_host, f.dst_host, f.src_addr) for f in flows] == [
        ("sender_a", "receiver", "10.199.1.1"), ("sender_b", "receiver", "10.199.2.1")]
    assert all(f.src_port for f in flows)
