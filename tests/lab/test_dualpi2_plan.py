"""A plan's `dualpi2` stage through the agent (`tcplab run experiments/vm/dualpi2.yaml`).

The VM lab boots the aqm guest on Debian's 7.2 kernel with sch_dualpi2.ko built for it (`vm.up(kernel=...,
modules=("sch_dualpi2",))`: the aqm's agent gets the build directory as --module-dir). The agent's probe loads
the module, adds the qdisc to a scratch veth and unloads it, so the hello reports `dualpi2`; apply loads the
module, builds netem -> htb by tc and dualpi2 by netlink (iproute2 6.1 knows no dualpi2) and reads the kernel's
dump back, option by option. One classic flow (cubic, ECN: ECT(0), the C queue) runs from the server namespace.

What the run must show: tests/lab/dualpi2_plan_checks.py.

Needs root, QEMU, busybox-static, gcc, make and Debian's archive (unstable for the 7.2 packages); skips naming
what is missing. The lab uses its own state dir and prefix and always goes down.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.plan import expand, load_plan
from schemas.qdiscs import dualpi2_netlink as dn
from tests.lab.conftest import TEST_PREFIX, build_guest_module, run_lab_plan, vm_lab_up, vm_unavailable
from tests.lab.dualpi2_plan_checks import AS_ASKED, check_dualpi2_run

KERNEL = "linux-image-7.2.13+deb14-amd64"
PREFIX = f"{TEST_PREFIX}dq"[:12]
PLAN = Path(__file__).resolve().parents[2] / "experiments" / "vm" / "dualpi2.yaml"
MODULE = "sch_dualpi2"


@pytest.fixture(scope="module")
def dualpi2_plan_lab(tmp_path_factory):
    if reason := vm_unavailable():  # before building: the build writes to the root-owned cache
        pytest.skip(reason)
    build_guest_module(MODULE, KERNEL, ("make", "gcc", "modinfo", "dpkg-deb", "apt-get", "tar", "xz"), 900)
    yield from vm_lab_up(tmp_path_factory, PREFIX, ("aqm",), timeout_s=300, kernel=KERNEL, modules=(MODULE,))


@pytest.mark.parametrize("plan", [PLAN, PLAN.parents[1] / "kernels" / "uml-7.2.yaml"], ids=["vm", "uml"])
def test_the_plan_asks_for_what_the_test_expects(plan):
    (spec,) = expand(load_plan(plan))
    stage = spec.hosts["aqm"].qdiscs["client"][-1]
    assert dn.held_options(stage) == AS_ASKED


def test_a_dualpi2_plan_runs_through_the_agent(dualpi2_plan_lab, tmp_path):
    inv, state_dir = dualpi2_plan_lab
    release = inv["vm"]["release"]
    assert inv["vm"]["modules"][MODULE]["vermagic"].startswith(release + " ")
    engine = run_lab_plan(PLAN, state_dir, tmp_path)
    caps = check_dualpi2_run(engine, release)
    assert MODULE in caps.loadable_modules     # the agent loaded the module for its probe
