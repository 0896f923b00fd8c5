"""The VM lab with the endpoints as guests too (`tcplab lab up --kind vm --vm-roles all`): client, aqm and
server each boot the Debian kernel under QEMU, so the senders run a congestion control this machine's
kernel lacks (dctcp). Guests reach each other over UNIX datagram sockets: no namespace, tap or address
exists on this machine. Same agent, same plans, same protocol as the other labs.

Needs root, QEMU and busybox-static (`make vm-deps`); skips naming what is missing. Three TCG guests on
this machine's two cores: rates stay at 20 Mbit/s.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from analysis.load import iter_runs
from analysis.runstats import analyse
from orchestrator.agent_client import AgentClient
from orchestrator.lab import netns, vm
from orchestrator.lab.vm_config import vm_dir
from schemas import protocol
from tests.lab.conftest import run_lab_plan_unloaded, vm_lab_up

PREFIX = "tcplabvme"
DCTCP_PLAN = Path(__file__).resolve().parents[2] / "experiments" / "vm" / "dctcp.yaml"


@pytest.fixture(scope="module")
def sender_guest(tmp_path_factory):
    """aqm and server are guests, the client a namespace: two TCG guests for this machine's two cores."""
    yield from vm_lab_up(tmp_path_factory, PREFIX, ("aqm", "server"))


def hello(inv: dict, role: str) -> protocol.Capabilities:
    async def go() -> protocol.Capabilities:
        client = AgentClient(role, inv["hosts"][role]["agent"], Path(inv["token_file"]).read_bytes().strip())
        h = await client.connect("test")
        await client.close()
        return h.capabilities
    return asyncio.run(go())


def test_all_three_hosts_as_guests_and_nothing_on_this_machine(tmp_path_factory):
    """Up, check, down inline: three TCG guests must not outlive this test (the next fixture boots two)."""
    lab = vm_lab_up(tmp_path_factory, f"{PREFIX}a", ("client", "aqm", "server"), timeout_s=300)
    inv, state_dir = next(lab)
    try:
        st = vm.status(state_dir, f"{PREFIX}a")
        assert st["healthy"] is True, st
        assert st["namespaces"] == [] and netns.lab_namespaces(f"{PREFIX}a") == []
        assert inv["vm"]["roles"] == ["client", "aqm", "server"]
        assert all(h["namespace"] is None and h["agent"].startswith("tcp://127.0.0.1:")
                   for h in inv["hosts"].values())
        assert inv["hosts"]["server"]["interfaces"]["to-aqm"]["mac"] == "52:54:00:7c:02:01"
        ping = vm.guest_exec(["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.199.1.1"], state_dir, role="server")
        assert ping.returncode == 0, ping.stdout + ping.stderr      # server guest -> aqm guest -> client guest
        route = vm.guest_exec(["ip", "-j", "route", "get", "10.199.1.1"], state_dir, role="server").stdout
        assert json.loads(route)[0]["gateway"] == "10.199.2.254"
        for role in ("client", "aqm", "server"):
            assert abs(inv["vm"]["guests"][role]["clock_offset_ns"]) < 1e6, (role, inv["vm"]["guests"][role])
            caps = hello(inv, role)
            assert caps.kernel_release == inv["vm"]["release"] and "dctcp" in caps.congestion_controls
            assert caps.socket_diag is True                          # tcp_diag is loaded: ss shows TCP_INFO
        assert set(hello(inv, "client").drivers.items()) == {("to-aqm", "virtio_net")}
    finally:
        next(lab, None)                                              # takes the lab down
    assert not any(vm_dir(state_dir, r).joinpath("qemu.pid").exists() for r in ("client", "aqm", "server"))
    assert vm.status(state_dir, f"{PREFIX}a")["healthy"] is False


def test_a_sender_guest_beside_a_namespace_receiver(sender_guest):
    inv, state_dir = sender_guest
    st = vm.status(state_dir, PREFIX)
    assert st["healthy"] is True, st
    assert st["namespaces"] == [f"{PREFIX}-client"] and inv["hosts"]["client"]["namespace"] == f"{PREFIX}-client"
    assert hello(inv, "server").kernel_release == inv["vm"]["release"]
    assert hello(inv, "client").kernel_release == os.uname().release   # the receiver stays on this kernel
    # the receiver namespace reaches the sender guest through the aqm guest (tap, then a socket pair)
    ping = subprocess.run(["ip", "netns", "exec", f"{PREFIX}-client", "ping", "-c", "3", "-i", "0.2", "-W", "2",
                           "10.199.2.1"], capture_output=True, text=True, timeout=30)
    assert ping.returncode == 0, ping.stdout + ping.stderr


def test_dctcp_gets_more_of_a_shallow_marked_link_than_reno(sender_guest, tmp_path):
    """DCTCP against Reno, one flow each, through step marking at K = 4 ms (5000 B) with a 25 kB BDP
    (10 Mbit/s, 20 ms). DCTCP reduces by alpha/2 per marked window: alpha settles strictly between 0 and 1
    and the link stays busier than under Reno, which halves at every marked window and drops below the BDP.
    The marker holds DCTCP's queue near K (without marking it would grow to the 200 ms limit). TCG guests
    forward in bursts that cross K at a lower mean queue, so neither reaches the textbook utilisation
    (measured: DCTCP 0.65-0.82, Reno 0.29-0.60 of the payload rate; DCTCP queue 2.7-3.3 ms, alpha 0.32)."""
    inv, state_dir = sender_guest
    # utilisation is a claim about the network: a run whose guests (the sender, the aqm) G-CPULOAD found saturated
    # is run again (a CI run beside other jobs: DCTCP 0.42, Reno 0.31). The receiver namespace shares this
    # machine's cores with the guests' emulation, so its own flag is the lab's normal state, not a reason
    engine = run_lab_plan_unloaded(DCTCP_PLAN, state_dir, tmp_path, hosts=("aqm", "server"))
    by_cc = {}
    for data in iter_runs(engine, detail=True):
        a = analyse(data)
        (flow,) = a.flows
        by_cc[flow.cc] = a
        print(f"{flow.cc}: payload utilisation {a.utilisation.payload.mean:.3f}, queue delay mean "
              f"{a.qdelay.mean / 1e3:.2f} ms (median {a.qdelay.median / 1e3:.2f}, p95 {a.qdelay.p95 / 1e3:.2f}), "
              f"CE {flow.signals.ce} of {flow.signals.ecn_capable}, cwnd mean {flow.cwnd.mean:.1f}, alpha "
              f"{flow.alpha.time_weighted_mean if flow.alpha else None}")
    assert set(by_cc) == {"dctcp", "reno"}
    dctcp, reno = by_cc["dctcp"], by_cc["reno"]
    assert dctcp.flows[0].alpha is not None            # ss read DCTCP's alpha from the sender's socket
    assert reno.flows[0].alpha is None
    assert dctcp.flows[0].signals.ce > 0 and reno.flows[0].signals.ce > 0
    k_ms = 4.0
    assert 0.25 * k_ms < dctcp.qdelay.mean / 1e3 < 1.5 * k_ms
    assert 0.05 < dctcp.flows[0].alpha.time_weighted_mean < 0.9
    assert dctcp.utilisation.payload.mean > 0.55
    assert dctcp.utilisation.payload.mean > reno.utilisation.payload.mean + 0.1
    with engine.connect() as conn:
        for run_id, in conn.execute(text("SELECT run_id FROM run")):
            ev = {(e.host, e.phase): json.loads(e.data) if isinstance(e.data, str) else e.data
                  for e in conn.execute(text("SELECT host, phase, data FROM host_evidence WHERE run_id = :r"),
                                        {"r": run_id})}
            sender = protocol.Readback.model_validate(ev[("server", "apply")])
            assert sender.uname["release"] == inv["vm"]["release"]   # the sender ran the guest kernel
            assert all(ev[(role, "reset")]["restored"] is True for role in ("client", "aqm", "server"))
