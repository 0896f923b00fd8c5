"""Issue 13, item 6 against a real agent process: TLS when certificates are configured, and a hello whose
proofs are bound to the TLS channel, so a relay on the path -- even one holding a certificate from the same
CA -- fails. Without TLS such a relay passes: that limit is stated here as a test, not hidden."""
from __future__ import annotations

import asyncio
import json
import ssl

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from orchestrator.agent_client import AgentClient, AgentError, AgentUnreachable
from orchestrator.inventory import Inventory
from tests.support import agent_process, testca
from tests.support.agent_process import free_port
from tests.support.flood import idle_tcp


@pytest.fixture
def certs(tmp_path) -> testca.CertSet:
    if reason := testca.unavailable():
        pytest.skip(reason)
    return testca.make_test_ca(tmp_path / "ca")


@pytest.fixture
def tls_agent(tmp_path, certs):
    tls_args = ["--tls-cert", str(certs.agent_cert), "--tls-key", str(certs.agent_key), "--tls-client-ca",
                str(certs.ca)]
    with agent_process.running_agent(tmp_path, tls_args=tls_args) as proc:
        yield proc


@pytest.fixture
def plain_agent(tmp_path):
    with agent_process.running_agent(tmp_path) as proc:
        yield proc


def manager_tls(certs: testca.CertSet, agent: agent_process.AgentProcess, client_cert: bool = True) -> ssl.SSLContext:
    """The manager's context as the inventory builds it."""
    inv = Inventory(kind="physical", token_file=str(agent.tmp / "token"), hosts={}, tls_ca=str(certs.ca),
                    tls_client_cert=str(certs.client_cert) if client_cert else None,
                    tls_client_key=str(certs.client_key) if client_cert else None)
    ctx = inv.tls_context()
    assert ctx is not None
    return ctx


async def relay(agent_url: str, server_ssl: ssl.SSLContext | None, client_ssl: ssl.SSLContext | None, go):
    """A man in the middle: accepts the manager, opens its own connection to the agent, forwards every
    frame both ways unchanged. Runs `go(relay_url)` while it listens."""
    upstream = agent_url.replace("tcp://", "wss://" if client_ssl else "ws://")

    async def forward(downstream):
        async with connect(upstream, ssl=client_ssl) if client_ssl else connect(upstream) as up:
            async def pump(src, dst):
                async for frame in src:
                    await dst.send(frame)
            tasks = [asyncio.create_task(pump(downstream, up)), asyncio.create_task(pump(up, downstream))]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in tasks:
                t.cancel()

    port = free_port()
    async with serve(forward, "127.0.0.1", port, ssl=server_ssl):
        return await go(f"tcp://127.0.0.1:{port}")


def test_manager_and_agent_prove_the_token_to_each_other_over_tls(tls_agent, certs):
    async def go():
        client = AgentClient("sv", tls_agent.url, tls_agent.token, tls=manager_tls(certs, tls_agent))
        hello = await client.connect()
        cert = client.ws.transport.get_extra_info("ssl_object").getpeercert()
        offset, rtt = await client.clock_offset_ns()
        await client.close()
        return hello, cert, rtt

    hello, cert, rtt = asyncio.run(go())
    assert len(hello.proof) == 64 and dict(x[0] for x in cert["subject"])["commonName"] == "tcplab-test-agent"
    print(f"\nTLS hello verified both ways; clock RTT over TLS {rtt / 1e6:.2f} ms")


def test_tls_refuses_a_manager_without_a_client_certificate_and_a_plain_connection(tls_agent, certs):
    async def go(tls):
        client = AgentClient("sv", tls_agent.url, tls_agent.token, tls=tls)
        await client.connect()

    # TLS 1.3 reports a missing client certificate after the handshake: the agent closes before any HTTP, and
    # the manager reports the host unreachable with the handshake's own words
    with pytest.raises(AgentUnreachable, match="did not receive a valid HTTP response"):
        asyncio.run(go(manager_tls(certs, tls_agent, client_cert=False)))
    with pytest.raises(AgentUnreachable, match="did not receive a valid HTTP response"):
        asyncio.run(go(None))                                # plain WebSocket to a TLS port


def test_a_relay_with_another_certificate_of_the_same_ca_fails_mutual_authentication(tls_agent, certs, ledger):
    """The reported impostor: it passed the real agent's nonce to the manager and the manager's answer back.
    With TLS the manager binds its proof to the certificate it saw (the relay's); the agent checks against its
    own, and refuses. The relay holds a CA-signed server certificate and a stolen manager client certificate:
    the strongest relay short of the agent's own key."""
    relay_server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    relay_server.load_cert_chain(certs.relay_cert, certs.relay_key)
    relay_client = manager_tls(certs, tls_agent)

    async def manager_through(relay_url: str):
        client = AgentClient("sv", relay_url, tls_agent.token, tls=manager_tls(certs, tls_agent))
        await client.connect()

    with pytest.raises(AgentError) as err:
        asyncio.run(relay(tls_agent.url, relay_server, relay_client, manager_through))
    print(f"\nrelay over TLS: {err.value}")
    assert err.value.code == "unauthenticated" and err.value.field == "hmac"
    assert "TLS channel" in str(err.value)
    assert "hello refused" in tls_agent.log_text()
    ledger.fault("relaying impostor with a CA-signed certificate (TLS)", survived=True)


def test_without_tls_a_relay_that_forwards_every_frame_is_not_detected(plain_agent):
    """The documented limit (docs/security.md): with no TLS there is no channel to bind the proofs to, so a
    relay that forwards frames unchanged authenticates as both ends. Mutual HMACs stop an impostor that does
    not relay (next test), not this one; only TLS does."""
    async def manager_through(relay_url: str):
        client = AgentClient("sv", relay_url, plain_agent.token)
        hello = await client.connect()
        await client.close()
        return hello

    assert asyncio.run(relay(plain_agent.url, None, None, manager_through)).proof


@pytest.mark.parametrize("forged", ["reflect the manager's proof", "random"])
def test_an_impostor_agent_that_does_not_know_the_token_is_refused(forged):
    async def impostor(ws):
        await ws.send(json.dumps({"event": "challenge", "data": {"nonce": "ab" * 32, "protocol": 2}}))
        req = json.loads(await ws.recv())
        proof = req["args"]["hmac"] if forged.startswith("reflect") else "0" * 64
        result = {"proof": proof, "agent_version": "0.1.0", "protocol": 2, "hostname": "impostor",
                  "interfaces": [], "capabilities": {
                      "kernel_release": "6", "qdiscs": [], "congestion_controls": [],
                      "allowed_congestion_controls": [], "offload_features": {}, "tools": {}, "tracepoints": []}}
        await ws.send(json.dumps({"id": req["id"], "result": result}))
        await asyncio.sleep(1)

    async def go():
        port = free_port()
        async with serve(impostor, "127.0.0.1", port):
            client = AgentClient("sv", f"tcp://127.0.0.1:{port}", b"the real token")
            await client.connect()

    with pytest.raises(AgentError) as err:
        asyncio.run(go())
    assert err.value.code == "unauthenticated" and err.value.field == "proof" and "could not prove" in str(err.value)


def test_silent_sockets_count_against_the_cap_during_the_tls_handshake(tls_agent, certs, ledger):
    """TLS is negotiated after admission: a socket that never sends its ClientHello holds a slot of the 64, not
    a descriptor outside the count."""
    port = int(tls_agent.url.rsplit(":", 1)[1])
    fds_before = tls_agent.fd_count()

    async def go():
        raw = await idle_tcp("127.0.0.1", port, "127.0.0.2", 300)
        for i in range(1, 101):
            raw += await idle_tcp("127.0.0.1", port, f"127.0.1.{i}", 4)
        await asyncio.sleep(0.5)
        fds_flooded = tls_agent.fd_count()
        client = AgentClient("sv", tls_agent.url, tls_agent.token, tls=manager_tls(certs, tls_agent))
        await client.connect()
        _, rtt = await client.clock_offset_ns()
        await client.close()
        for w in raw:
            w.close()
        return len(raw), fds_flooded, rtt

    n, fds_flooded, rtt = asyncio.run(go())
    print(f"\nTLS agent under {n} silent TCP connections: fds {fds_before} -> {fds_flooded}; the manager "
          f"connected, clock RTT {rtt / 1e6:.2f} ms")
    assert n == 700 and fds_flooded <= fds_before + 64 + 2
    ledger.fault("silent-socket flood against a TLS agent", survived=True, detail=f"fds {fds_flooded}")
