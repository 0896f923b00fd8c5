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
        json.dumps({"id": 3, "op": "hello", "args": {"client": "x", "hmac": "zz"}}),
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
            return await client.call("apply", protocol.ApplyArgs(run_id="x", state=state))
        finally:
            await client.call("reset", protocol.Empty())
            await client.close()

    with pytest.raises(AgentError) as err:
        run(go(HostState(interfaces={"lo": InterfaceState(offloads={"tso": False})})))
    assert err.value.field == "state.interfaces.lo"
    with pytest.raises(AgentError) as err:
        run(go(HostState(sysctls={"net.ipv4.tcp_tro": "1"})))
    assert err.value.field == "state.sysctls.net.ipv4.tcp_tro" and "does not exist" in str(err.value)
