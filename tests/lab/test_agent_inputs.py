"""Issue 13, items 2 and 7, against real agents in the netns lab: a request naming a sysctl or module off the
agent's allow-lists is refused with a coded error naming the field, and nothing of it is applied (the kernel's
core_pattern, the namespace's sysctls, module parameters and loaded modules are what they were). Bad addresses,
MACs and lone surrogates in real frames get `invalid_args`, and the connection stays usable."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import unix_connect

from orchestrator.agent_client import AgentClient, AgentError
from schemas import handshake, protocol
from schemas.allowlist import DEFAULT_MODULES
from schemas.hoststate import HostState
from tests.lab.conftest import one_flow_plan, run_plan_quietly

CORE_PATTERN = Path("/proc/sys/kernel/core_pattern")
BETA = Path("/sys/module/tcp_cubic/parameters/beta")


def ns_sysctl(ns: str, name: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", name], capture_output=True, text=True,
                          check=True).stdout.strip()


async def apply_then_reset(inv, role: str, state: HostState) -> tuple[protocol.HelloResult, object]:
    """(hello, the apply result or the AgentError it raised); always resets and closes."""
    client = AgentClient(role, inv.hosts[role].agent, inv.token)
    hello = await client.connect()
    try:
        return hello, await client.apply(protocol.ApplyArgs(run_id="inputs", state=state))
    except AgentError as exc:
        return hello, exc
    finally:
        await client.reset()
        await client.close()


@pytest.mark.parametrize("evil, field", [
    ({"sysctls": {"kernel.core_pattern": "|/tmp/tcplab-x %p"}}, "state.sysctls.kernel.core_pattern"),
    ({"sysctls": {"kernel.modprobe": "/tmp/tcplab-x"}}, "state.sysctls.kernel.modprobe"),
    ({"sysctls": {"vm.swappiness": "1"}}, "state.sysctls.vm.swappiness"),
    ({"sysctls": {"net.ipv6.conf.lo.forwarding": "1"}}, "state.sysctls.net.ipv6.conf.lo.forwarding"),
    ({"module_params": {"evil": {"x": "1"}}}, "state.module_params.evil"),
])
def test_off_the_allow_list_is_refused_and_nothing_is_applied(lab, evil, field):
    inv, _ = lab
    ns = inv.hosts["client"].namespace
    ecn_before, core_before = ns_sysctl(ns, "net.ipv4.tcp_ecn"), CORE_PATTERN.read_text()
    beta_before = BETA.read_text() if BETA.exists() else None
    swappiness_before = Path("/proc/sys/vm/swappiness").read_text()
    # a valid change in the same request: a refusal must leave it unapplied too (no partial state)
    state = HostState.model_validate({**evil, "sysctls": {"net.ipv4.tcp_ecn": "2" if ecn_before != "2" else "1",
                                                          **evil.get("sysctls", {})},
                                      "module_params": {**evil.get("module_params", {}),
                                                        **({"tcp_cubic": {"beta": "650"}} if beta_before else {})}})
    hello, out = asyncio.run(apply_then_reset(inv, "client", state))
    assert isinstance(out, AgentError), out
    assert (out.code, out.field) == ("refused", field), out
    print(out)
    assert "allow-list" in str(out)
    assert CORE_PATTERN.read_text() == core_before
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness_before
    assert ns_sysctl(ns, "net.ipv4.tcp_ecn") == ecn_before
    assert ns_sysctl(ns, "net.ipv6.conf.lo.forwarding") == "0"
    assert (BETA.read_text() if BETA.exists() else None) == beta_before
    assert not Path("/sys/module/evil").exists()
    caps = hello.capabilities
    assert set(caps.allowed_modules) == set(DEFAULT_MODULES)
    assert "net.ipv4.conf.to-aqm." in caps.allowed_sysctl_prefixes and "kernel." not in caps.allowed_sysctl_prefixes


def test_a_sysctl_of_an_allow_listed_interface_is_applied_read_back_and_reset(lab):
    inv, _ = lab
    ns = inv.hosts["client"].namespace
    name = "net.ipv4.conf.to-aqm.accept_local"
    before = ns_sysctl(ns, name)
    want = "0" if before == "1" else "1"
    _, out = asyncio.run(apply_then_reset(inv, "client", HostState(sysctls={name: want})))
    assert isinstance(out, protocol.ApplyResult), out
    assert out.readback.sysctls[name] == want
    assert ns_sysctl(ns, name) == before


def test_bad_addresses_macs_and_surrogates_in_real_frames_are_invalid_args(lab):
    inv, _ = lab
    url = inv.hosts["client"].agent
    dev = inv.hosts["client"].iface_toward("aqm")

    async def go() -> list[dict]:
        client = AgentClient("client", url, inv.token)
        await client.connect()
        await client.close()
        async with unix_connect(url.removeprefix("unix:"), uri="ws://localhost/") as ws:
            challenge = json.loads(await ws.recv())
            await ws.send(json.dumps({"id": 1, "op": "hello", "args": {
                "client": "t", "nonce": "ab" * 32,
                "hmac": handshake.manager_proof(inv.token, challenge["data"]["nonce"], "ab" * 32)}}))
            replies = [json.loads(await ws.recv())]
            frames = [json.dumps({"id": 2 + i, "op": "apply", "args": {"run_id": "x", "state": s}}) for i, s in
                      enumerate([{"interfaces": {dev: {"neighbours": {w: "02:00:00:00:00:01"}}}}
                                 for w in ("help", "dev", "proxy", "to")]
                                + [{"interfaces": {dev: {"neighbours": {"10.0.0.1": "02:00:00:00:00:0\x00"}}}}])]
            frames.append('{"id": 9, "op": "apply", "args": {"run_id": "x", "state": '
                          '{"sysctls": {"net.ipv4.tcp_ecn": "\\ud800"}}}}')
            frames.append(json.dumps({"id": 10, "op": "status", "args": {}}))
            for frame in frames:
                await ws.send(frame)
                replies.append(json.loads(await ws.recv()))
            return replies

    hello, *bad, status = asyncio.run(go())
    assert "result" in hello, hello
    for reply in bad:
        assert reply["error"]["code"] == "invalid_args", reply
        assert reply["error"]["field"].startswith(("state.interfaces.", "state.sysctls.")), reply
    assert status["id"] == 10 and "result" in status     # still usable after every refusal


def test_the_manager_refuses_a_plan_off_the_allow_list_before_touching_any_host(lab, tmp_path):
    """The sysctl passes the plan validator (it is under `net.`) but not the agents' lists: refused in
    preflight from the lists the agents reported in hello."""
    inv, state_dir = lab
    aqm_ns, aqm_dev = inv.hosts["aqm"].namespace, inv.hosts["aqm"].iface_toward("client")
    qdiscs_before = subprocess.run(["ip", "netns", "exec", aqm_ns, "tc", "-j", "qdisc", "show", "dev", aqm_dev],
                                   capture_output=True, text=True, check=True).stdout
    plan = tmp_path / "off-list.yaml"
    plan.write_text(one_flow_plan("off-list", "a sysctl outside the agents' allow-list",
                                  hosts="    client:\n      sysctls: {net.ipv6.conf.lo.forwarding: 1}\n"))
    rc, message = run_plan_quietly(plan, f"sqlite:///{tmp_path / 'refused.db'}", state_dir, tmp_path / "results")
    print(message)
    assert rc == 3, message
    assert "refused before touching any host" in message
    assert "host client: sysctl net.ipv6.conf.lo.forwarding is outside this agent's allow-list" in message
    assert ns_sysctl(inv.hosts["client"].namespace, "net.ipv6.conf.lo.forwarding") == "0"
    assert subprocess.run(["ip", "netns", "exec", aqm_ns, "tc", "-j", "qdisc", "show", "dev", aqm_dev],
                          capture_output=True, text=True, check=True).stdout == qdiscs_before
    assert not any((tmp_path / "results").glob("*/runspec.json"))


def test_a_testbed_narrows_or_widens_the_lists_with_the_agent_flags(lab, tmp_path):
    """A second agent in the client namespace, started with the flags a testbed passes: hello reports exactly
    those lists and apply enforces them."""
    inv, _ = lab
    ns, dev = inv.hosts["client"].namespace, inv.hosts["client"].iface_toward("aqm")
    sock = tmp_path / "narrow.sock"
    argv = ["ip", "netns", "exec", ns, sys.executable, "-m", "agents", "--name", "narrow", "--listen", f"unix:{sock}",
            "--token-file", inv.token_file, "--interface", dev, "--artifacts", str(tmp_path / "artifacts"),
            "--allow-sysctl", "net.ipv4.tcp_ecn", "--allow-sysctl", "net.ipv4.conf.{interface}.",
            "--allow-module", "tcp_cubic"]
    agent = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and agent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sock.exists(), f"agent exited {agent.poll()}"

        async def go():
            client = AgentClient("narrow", f"unix:{sock}", inv.token)
            hello = await client.connect()
            try:
                with pytest.raises(AgentError) as err:
                    await client.apply(protocol.ApplyArgs(run_id="x", state=HostState(
                        sysctls={"net.ipv4.tcp_ecn": "1", "net.ipv4.tcp_sack": "1"})))
                return hello, err.value
            finally:
                await client.close()

        hello, err = asyncio.run(go())
        assert hello.capabilities.allowed_sysctl_prefixes == ["net.ipv4.tcp_ecn", f"net.ipv4.conf.{dev}."]
        assert hello.capabilities.allowed_modules == ["tcp_cubic"]
        assert (err.code, err.field) == ("refused", "state.sysctls.net.ipv4.tcp_sack")
    finally:
        agent.terminate()
        agent.wait(timeout=20)
