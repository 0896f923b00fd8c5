"""The agent over a real WebSocket: authentication, typed ops, coded errors, allow-listed interfaces."""
from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import unix_connect

from orchestrator.agent_client import AgentClient, AgentError
from schemas import protocol
from schemas.hoststate import HostState, InterfaceState


def run(coro):
    return asyncio.run(coro)


async def raw_exchange(url: str, frames: list[str]) -> list[dict]:
    async with unix_connect(url.removeprefix("unix:"), uri="ws://localhost/") as ws:
        replies = [json.loads(await ws.recv())]  # the challenge
        for frame in frames:
            await ws.send(frame)
            replies.append(json.loads(await ws.recv()))
        return replies


def test_wrong_token_is_refused_and_connection_closed(lab):
    inv, _ = lab
    client = AgentClient("aqm", inv.hosts["aqm"].agent, b"not-the-token")
    with pytest.raises(AgentError) as err:
        run(client.connect())
    assert err.value.code == "unauthenticated" and err.value.field == "hmac"


def test_ops_before_hello_unknown_ops_and_bad_fields_get_coded_errors(lab):
    inv, _ = lab
    frames = [
        json.dumps({"id": 1, "op": "reset", "args": {}}),
        json.dumps({"id": 2, "op": "format_disk", "args": {}}),
        "not json",
        json.dumps({"id": 3, "op": "hello", "args": {"client": "x", "nonce": "ab" * 32, "hmac": "zz"}}),
    ]
    challenge, before_hello, unknown, garbage, bad_hmac = run(raw_exchange(inv.hosts["aqm"].agent, frames))
    assert challenge["event"] == "challenge"
    assert before_hello["error"]["code"] == "unauthenticated" and before_hello["id"] == 1
    assert unknown["error"] == {"code": "unknown_op", "message": "unknown op 'format_disk'", "field": "op"}
    assert garbage["error"]["code"] == "bad_request"
    assert bad_hmac["error"]["code"] == "invalid_args" and bad_hmac["error"]["field"] == "hmac"


def test_hello_reports_real_capabilities(lab):
    inv, _ = lab

    async def go():
        client = AgentClient("aqm", inv.hosts["aqm"].agent, inv.token)
        hello = await client.connect()
        await client.close()
        return hello

    caps = run(go()).capabilities
    assert "htb" in caps.qdiscs and "pfifo" in caps.qdiscs
    assert {"reno", "cubic"} <= set(caps.congestion_controls)
    assert caps.offload_features["to-client"]["tso"] is True       # settable on veth
    assert caps.offload_features["to-client"]["lro"] is False      # fixed off on veth
    assert caps.tools["iperf3"].startswith("iperf 3")


def test_apply_refuses_interfaces_off_the_allow_list_and_unknown_sysctls(lab):
    inv, _ = lab

    async def go(state):
        client = AgentClient("client", inv.hosts["client"].agent, inv.token)
        await client.connect()
        try:
            return await client.apply(protocol.ApplyArgs(run_id="x", state=state))
        finally:
            await client.reset()
            await client.close()

    with pytest.raises(AgentError) as err:
        run(go(HostState(interfaces={"lo": InterfaceState(offloads={"tso": False})})))
    assert err.value.field == "state.interfaces.lo"
    with pytest.raises(AgentError) as err:
        run(go(HostState(sysctls={"net.ipv4.tcp_tro": "1"})))
    assert err.value.field == "state.sysctls.net.ipv4.tcp_tro" and "does not exist" in str(err.value)


def test_apply_reads_back_nic_evidence_module_params_and_neighbours_then_resets_exactly(lab):
    """Real ethtool/ip/sysfs on the netns lab: coalescing and pause are absent on veth ("off" holds, recorded),
    a stale neighbour entry is replaced by a permanent one, a built-in module parameter is set, and reset
    puts all of it back (module parameters are global to the kernel: the three lab hosts share them)."""
    inv, _ = lab
    client_if = inv.hosts["client"].iface_toward("aqm")
    peer = inv.hosts["client"].interfaces[client_if].peer_addr
    beta_path = "/sys/module/tcp_cubic/parameters/beta"
    try:
        beta_before = open(beta_path).read().strip()
    except OSError:
        pytest.skip("kernel has no tcp_cubic parameters in /sys/module: no module parameter to set")
    new_beta = "700" if beta_before != "700" else "650"
    state = HostState(module_params={"tcp_cubic": {"beta": new_beta}}, interfaces={client_if: InterfaceState(
        coalesce={"rx-usecs": 0}, pause={"rx": False, "tx": False},
        neighbours={peer: "02:00:00:00:00:99"})})

    async def go():
        client = AgentClient("client", inv.hosts["client"].agent, inv.token)
        hello = await client.connect()
        try:
            applied = await client.apply(protocol.ApplyArgs(run_id="x", state=state))
            beta_applied = open(beta_path).read().strip()
        finally:
            reset = await client.reset()
            await client.close()
        return hello, applied.readback, beta_applied, reset

    hello, rb, beta_applied, reset = run(go())
    assert hello.capabilities.coalesce_params[client_if] == [] and hello.capabilities.pause_frames[client_if] is False
    assert hello.capabilities.drivers[client_if] == "veth"
    assert beta_applied == new_beta and rb.module_params == {"tcp_cubic": {"beta": new_beta}}
    irb = rb.interfaces[client_if]
    assert irb.driver == "veth" and irb.coalesce is None and irb.pause is None
    assert "Operation not supported" in irb.unsupported["coalesce"]
    assert {"dst": peer, "lladdr": "02:00:00:00:00:99", "state": ["PERMANENT"]} in irb.neighbours
    assert rb.uname["release"] and "reno" in rb.congestion_controls["available"]
    assert reset == protocol.ResetResult(restored=True, differences=[]), reset
    assert open(beta_path).read().strip() == beta_before
