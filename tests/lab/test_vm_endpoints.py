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

from orchestrator.agent_client import AgentClient
from orchestrator.lab import netns, vm
from orchestrator.lab.vm_config import vm_dir
from schemas import protocol
from tests.lab.conftest import vm_lab_up

PREFIX = "tcplabvme"


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
