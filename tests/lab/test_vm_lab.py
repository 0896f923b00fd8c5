"""The VM lab: `lab up --kind vm` boots a Debian 6.1 kernel as the aqm (QEMU, TCG), the repository's own
agent runs inside it, TCP crosses it between the namespaces, the checked-in tc fixtures still match what its
kernel prints, and `down` leaves nothing behind even after a crash.

Needs root, QEMU and busybox-static (`make vm-deps`): it installs nothing and skips naming what is missing.
The kernel image is built into the cache if absent (bounded; skips if the apt download fails).
"""
from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress
from sqlalchemy import text

from orchestrator.agent_client import AgentClient
from orchestrator.engine.campaign import run_plan
from orchestrator.lab import netns, vm, vm_image
from orchestrator.storage.db import open_db
from schemas import protocol
from tests.lab.conftest import lab_unavailable

PREFIX = "tcplabvmt"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tc"
AQM_QDISCS = {"netem", "red", "fq_codel", "codel", "pie", "fq_pie", "cake", "fq", "htb", "tbf"}


def vm_unavailable() -> str | None:
    reason = lab_unavailable()
    if reason:
        return reason
    if missing := vm.missing_tools():
        return f"the VM lab needs {', '.join(missing)}: run `make vm-deps`"
    if not os.path.exists("/dev/net/tun"):
        return "the VM lab needs /dev/net/tun"
    return None


def _capture_module():
    spec = importlib.util.spec_from_file_location("capture_in_vm", FIXTURES / "capture_in_vm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vm_lab(tmp_path_factory):
    reason = vm_unavailable()
    if reason:
        pytest.skip(reason)
    try:
        vm_image.ensure_image(timeout_s=300)
    except vm_image.ImageError as exc:
        pytest.skip(f"no kernel image for the VM lab (apt download failed?): {exc}")
    state_dir = tmp_path_factory.mktemp("vmlab")
    try:
        inv = vm.up(state_dir, PREFIX, timeout_s=240)
        print(f"\nvm lab: {inv['vm']['package']} {inv['vm']['accel']}, agent ready after {inv['vm']['boot_s']} s")
        yield inv, state_dir
    finally:
        vm.down(state_dir, PREFIX)


def test_status_and_inventory(vm_lab):
    inv, state_dir = vm_lab
    st = vm.status(state_dir, PREFIX)
    assert st["healthy"] is True, st
    assert st["namespaces"] == [f"{PREFIX}-client", f"{PREFIX}-server"]
    assert inv["kind"] == "vm" and inv["hosts"]["aqm"]["namespace"] is None
    assert inv["hosts"]["aqm"]["agent"].startswith("tcp://127.0.0.1:")
    assert inv["hosts"]["aqm"]["interfaces"]["to-client"]["addr"] == "10.199.1.254"
    addrs = vm.guest_exec(["ip", "-j", "addr", "show"], state_dir)
    by_name = {i["ifname"]: [a["local"] for a in i["addr_info"]] for i in json.loads(addrs.stdout)}
    assert "10.199.1.254" in by_name["to-client"] and "10.199.2.254" in by_name["to-server"]


def test_hello_reports_the_guest_kernel_and_its_qdiscs(vm_lab):
    inv, _ = vm_lab

    async def hello():
        client = AgentClient("aqm", inv["hosts"]["aqm"]["agent"], Path(inv["token_file"]).read_bytes().strip())
        h = await client.connect("test")
        offset, rtt = await client.clock_offset_ns()
        await client.close()
        return h, offset, rtt

    h, offset, rtt = asyncio.run(hello())
    caps = h.capabilities
    assert caps.kernel_release == inv["vm"]["release"]
    assert AQM_QDISCS <= set(caps.qdiscs), sorted(AQM_QDISCS - set(caps.qdiscs))
    assert "dctcp" in caps.congestion_controls
    assert "tcp:tcp_probe" in caps.tracepoints
    assert set(caps.offload_features) == {"to-client", "to-server"}
    # `lab up` stepped the guest clock by the offset measured this very way (the RTC alone leaves it up
    # to a second off); the run engine flags a run (G-CLOCK) above 1 ms
    assert abs(inv["vm"]["clock_offset_ns"]) < 1e6
    assert abs(offset) < 1e6, f"guest clock offset {offset / 1e6:.2f} ms (rtt {rtt / 1e6:.2f} ms)"


def _tx_packets(state_dir: Path, dev: str) -> int:
    out = vm.guest_exec(["ip", "-s", "-j", "link", "show", "dev", dev], state_dir).stdout
    return json.loads(out)[0]["stats64"]["tx"]["packets"]


def test_tcp_crosses_the_vm(vm_lab):
    inv, state_dir = vm_lab
    client_ns, server_ns = inv["hosts"]["client"]["namespace"], inv["hosts"]["server"]["namespace"]
    dst = inv["hosts"]["server"]["interfaces"]["to-aqm"]["addr"]
    before = _tx_packets(state_dir, "to-server")
    server = subprocess.Popen(["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-p", "5398"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        run = subprocess.run(["ip", "netns", "exec", client_ns, "iperf3", "-c", dst, "-p", "5398", "-t", "4", "-J"],
                             capture_output=True, text=True, timeout=60)
    finally:
        server.wait(timeout=30)
    result = json.loads(run.stdout)
    assert "error" not in result, result.get("error")
    mbit = result["end"]["sum_received"]["bits_per_second"] / 1e6
    print(f"\niperf3 client ns -> server ns through the VM: {mbit:.0f} Mbit/s, "
          f"{result['end']['sum_sent']['retransmits']} retransmits")
    assert mbit > 50, f"only {mbit:.1f} Mbit/s through the VM"
    assert _tx_packets(state_dir, "to-server") - before > 1000  # it really went through the guest


def _shape(qdiscs: list[dict]) -> list[tuple]:
    return [(q["kind"], q["handle"], q.get("parent"), tuple(sorted(q.get("options", {})))) for q in qdiscs]


def test_tc_fixtures_match_the_guest_kernel(vm_lab, tmp_path):
    _, state_dir = vm_lab
    capture = _capture_module()
    summary = capture.capture(state_dir, tmp_path, seconds=1.5)
    for name in capture.CHAINS:
        fresh = json.loads((tmp_path / f"{name}.json").read_text())
        fixture = json.loads((FIXTURES / f"{name}.json").read_text())
        assert _shape(fresh) == _shape(fixture), name
        assert (FIXTURES / f"{name}.txt").exists() and (FIXTURES / f"{name}.cmd").exists()
        assert fresh[-1]["packets"] > 0, f"{name}: no traffic crossed the chain"
    assert summary["uname_r"] in (FIXTURES / "netem_htb_red_ecn.cmd").read_text()
    red = json.loads((tmp_path / "netem_htb_red_ecn.json").read_text())[-1]
    assert red["kind"] == "red" and red["options"]["ecn"] is True


RED_ECN_PLAN = Path(__file__).resolve().parents[2] / "experiments" / "vm" / "red-ecn.yaml"


def test_red_ecn_plan_applies_reads_back_marks_and_resets(vm_lab, tmp_path):
    """Issue 4's acceptance: netem 10ms + htb 20mbit + RED (ECN) applied through the guest's agent."""
    inv, state_dir = vm_lab
    before = vm.guest_exec(["tc", "-j", "qdisc", "show", "dev", "to-client"], state_dir).stdout
    url = f"sqlite:///{tmp_path / 'vm.db'}"
    out = io.StringIO()
    rc = asyncio.run(run_plan(RED_ECN_PLAN, db_url=url, inventory=netns.inventory_path(state_dir),
                              results=tmp_path / "results", force=False,
                              console=Console(file=out, width=300, color_system=None),
                              progress_factory=lambda: Progress(disable=True)))
    print(out.getvalue())
    assert rc == 0, out.getvalue()
    engine = open_db(url)
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT run_id, run_key, status, flags FROM run")).all()
        assert len(runs) == 2 and all(r.status == "complete" for r in runs), runs
        for run in runs:
            evidence = {(e.host, e.phase): json.loads(e.data) if isinstance(e.data, str) else e.data
                        for e in conn.execute(text("SELECT host, phase, data FROM host_evidence WHERE run_id = :r"),
                                              {"r": run.run_id})}
            rb = protocol.Readback.model_validate(evidence[("aqm", "apply")])
            kinds = [q["kind"] for q in rb.interfaces["to-client"].tc_qdisc]
            assert kinds == ["netem", "htb", "red"], kinds
            red = rb.interfaces["to-client"].tc_qdisc[-1]["options"]
            assert red["ecn"] is True and red["min"] == 5000 and red["max"] == 15000, red
            assert rb.uname["release"] == inv["vm"]["release"] and "dctcp" in rb.congestion_controls["available"]
            assert rb.interfaces["to-client"].driver == "virtio_net"
            assert rb.interfaces["to-client"].coalesce is not None        # evidence: ethtool -c read back
            assert rb.interfaces["to-client"].neighbours                   # evidence: ip neigh read back
            for role in ("client", "aqm", "server"):
                assert evidence[(role, "reset")]["restored"] is True, evidence[(role, "reset")]
            assert not [f for f in json.loads(run.flags) if "reset left" in f]
            marked = conn.execute(text(
                "SELECT count(*) FROM packet p JOIN conn c ON c.run_key = p.run_key AND c.conn_id = p.conn_id "
                "WHERE p.run_key = :k AND c.point = 'aqm:to-client' AND p.ecn = 3 AND p.payload_len > 0"),
                {"k": run.run_key}).scalar_one()
            ect = conn.execute(text(
                "SELECT count(*) FROM packet p JOIN conn c ON c.run_key = p.run_key AND c.conn_id = p.conn_id "
                "WHERE p.run_key = :k AND c.point = 'aqm:to-server' AND p.ecn = 2 AND p.payload_len > 0"),
                {"k": run.run_key}).scalar_one()
            ce_in_queue = conn.execute(text("SELECT sum(ce), count(*), avg(sojourn_ns) FROM qdelay WHERE run_key = :k"),
                                       {"k": run.run_key}).one()
            print(f"{run.run_id}: {marked} CE data packets downstream, {ect} ECT(0) upstream; qdelay: "
                  f"{ce_in_queue[0]} marked of {ce_in_queue[1]}, mean sojourn {ce_in_queue[2] / 1e6:.2f} ms")
            assert ect > 1000                # the senders negotiated ECN
            assert marked > 0 and ce_in_queue[0] > 0   # CE in the capture, and set by this queue
    after = vm.guest_exec(["tc", "-j", "qdisc", "show", "dev", "to-client"], state_dir).stdout
    assert [q["kind"] for q in json.loads(after)] == [q["kind"] for q in json.loads(before)]


def test_down_after_crash_stops_qemu_and_removes_everything(vm_lab):
    """Last in this module: it takes the lab down."""
    inv, state_dir = vm_lab
    children = json.loads((state_dir / "agents.json").read_text())
    qemu = children["qemu"]
    os.kill(inv["supervisor_pid"], signal.SIGKILL)  # QEMU and the agents outlive their parent
    time.sleep(0.3)
    assert netns.pid_alive(qemu)
    removed = vm.down(state_dir, PREFIX)
    assert any(r.startswith("vm process") for r in removed), removed
    assert not netns.pid_alive(qemu)
    assert netns.lab_namespaces(PREFIX) == []
    assert not (state_dir / "exec.sock").exists() and not (state_dir / "guest").exists()
    assert vm.down(state_dir, PREFIX) == []  # idempotent
    assert vm.status(state_dir, PREFIX)["healthy"] is False
