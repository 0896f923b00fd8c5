"""On this machine's netns lab (no netem in the kernel), a plan that needs netem is refused before any host is
touched, and the message names the host, its kernel release and `netem`; each run is recorded as `refused`."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from orchestrator.storage.db import open_db
from tests.lab.conftest import run_plan_quietly

VM_PLAN = Path(__file__).resolve().parents[2] / "experiments" / "vm" / "red-ecn.yaml"


def _host_view(ns: str, dev: str) -> tuple[str, str]:
    def run(*argv: str) -> str:
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=True).stdout
    return run("tc", "-j", "qdisc", "show", "dev", dev), run("sysctl", "-n", "net.ipv4.tcp_ecn")


def kernel_has_netem() -> bool:
    ns = "tcplabtest-netemprobe"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        return subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem"],
                              capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


def test_netem_plan_is_refused_naming_host_kernel_and_netem(lab, tmp_path):
    inv, state_dir = lab
    if kernel_has_netem():
        pytest.skip(f"kernel {os.uname().release} has netem: nothing to refuse here (the VM-lab test runs the plan)")
    aqm_ns = inv.hosts["aqm"].namespace
    dev = inv.hosts["aqm"].iface_toward("client")
    before = _host_view(aqm_ns, dev)
    url = f"sqlite:///{tmp_path / 'refused.db'}"
    rc, message = run_plan_quietly(VM_PLAN, url, state_dir, tmp_path / "results")
    print(message)
    assert rc == 3
    assert "refused before touching any host" in message
    assert f"host aqm (kernel {os.uname().release}) lacks qdisc netem" in message
    assert f"host aqm (kernel {os.uname().release}) lacks qdisc red" in message
    assert _host_view(aqm_ns, dev) == before             # no qdisc and no sysctl was changed
    engine = open_db(url)
    with engine.connect() as conn:      # every run recorded as refused with its reasons, none ran
        rows = conn.execute(text("SELECT status, error FROM run")).all()
    assert rows and {r.status for r in rows} == {"refused"}
    assert all(f"host aqm (kernel {os.uname().release}) lacks qdisc netem" in r.error for r in rows)
    assert not any((tmp_path / "results").glob("*/runspec.json"))
    assert json.loads(before[0])                          # the view compared above was real tc output


DCTCP_PLAN = VM_PLAN.parent / "dctcp.yaml"


def test_dctcp_plan_is_refused_on_a_kernel_without_dctcp(lab, tmp_path):
    """The VM lab's DCTCP plan needs the sender guest's kernel: here the server is a namespace."""
    inv, state_dir = lab
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        if "dctcp" in f.read().split():
            pytest.skip(f"kernel {os.uname().release} has dctcp loaded: nothing to refuse here")
    rc, message = run_plan_quietly(DCTCP_PLAN, f"sqlite:///{tmp_path / 'refused.db'}", state_dir,
                                   tmp_path / "results")
    assert rc == 3, message
    assert f"host server (kernel {os.uname().release}) lacks congestion control dctcp" in message


MARK_PLAN = VM_PLAN.parent / "mark.yaml"


def refusal(plan: Path, state_dir: Path, tmp_path: Path) -> str:
    """`tcplab run PLAN` on the netns lab, which must refuse every run before touching a host: its message."""
    rc, message = run_plan_quietly(plan, f"sqlite:///{tmp_path / 'refused.db'}", state_dir, tmp_path / "results")
    print(message)
    assert rc == 3, message
    assert "refused before touching any host" in message
    return message


def test_mark_plan_is_refused_where_no_agent_can_load_the_studys_modules(lab, tmp_path):
    """The netns lab's agents have no --module-dir and this kernel loads no modules: the `mark` queue and the
    cc of tcp_dctcp_flaws are refused before any host is touched, naming host, kernel and module."""
    inv, state_dir = lab
    message = refusal(MARK_PLAN, state_dir, tmp_path)
    release = os.uname().release
    assert (f"host aqm (kernel {release}) lacks qdisc mark (module sch_aqm_mark: not loaded, and not in the module "
            "directories of this host's agent, --module-dir)") in message
    assert f"host server (kernel {release}) lacks congestion control dctcp_flaws" in message


DUALPI2_PLAN = VM_PLAN.parent / "dualpi2.yaml"


def test_dualpi2_plan_is_refused_where_no_agent_can_create_the_qdisc(lab, tmp_path):
    """This kernel has no dualpi2 and the netns lab's agents no --module-dir: the plan's dualpi2 stage is refused
    before any host is touched, naming host, kernel, qdisc and module."""
    inv, state_dir = lab
    aqm_ns = inv.hosts["aqm"].namespace
    dev = inv.hosts["aqm"].iface_toward("client")
    before = _host_view(aqm_ns, dev)
    message = refusal(DUALPI2_PLAN, state_dir, tmp_path)
    release = os.uname().release
    assert (f"host aqm (kernel {release}) lacks qdisc dualpi2 (module sch_dualpi2: not loaded, and not in the module "
            "directories of this host's agent, --module-dir)") in message
    assert _host_view(aqm_ns, dev) == before
