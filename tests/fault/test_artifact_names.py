"""Hostile artifact announcements on the manager's collect: a peer speaking the real protocol (a WebSocket
server on a unix socket, challenge, framed replies, artifact events followed by binary frames) announces names
that are not one plain file name. The manager's AgentClient must refuse each with a coded protocol error naming
the artifact, write nothing outside (or inside) the run folder, leave no `.part` file, and never crash."""
from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

from websockets.asyncio.client import unix_connect
from websockets.asyncio.server import unix_serve

from orchestrator.agent_client import AgentClient, AgentError
from schemas import protocol

BODY = b"hello"
HOSTILE: list[object] = ["..", "", ".", "a\x00b", "a/../../x", "../x", "/etc/passwd", "sub/file", ".hidden",
                         ".x.part", "x" * 300, "a\\..\\b", 5, None]


def announcement(name: object, body: bytes = BODY, sha: str | None = None) -> dict:
    return {"name": name, "task_id": "capture-0", "kind": "pcap", "size": len(body),
            "sha256": sha or hashlib.sha256(body).hexdigest(), "meta": {}}


async def fake_agent(path: Path, info: dict, body: bytes) -> object:
    """Challenge, then answer one collect with `info` + `body` as an artifact and a valid result."""
    async def handle(ws) -> None:
        await ws.send(json.dumps({"event": "challenge", "data": {"nonce": "00" * 32, "protocol":
                                                                  protocol.PROTOCOL_VERSION}}))
        async for frame in ws:
            req = json.loads(frame)
            if req["op"] == "collect":
                await ws.send(json.dumps({"event": "artifact", "data": info}))
                await ws.send(body)
                await ws.send(json.dumps({"id": req["id"], "result": {"run_id": req["args"]["run_id"],
                                                                      "artifacts": [], "tasks": []}}))
            else:
                await ws.send(json.dumps({"id": req["id"], "result": {}}))
    return await unix_serve(handle, str(path))


async def collect_once(tmp: Path, info: dict, body: bytes = BODY) -> tuple[Exception | None, list[Path]]:
    sock, sink = tmp / "agent.sock", tmp / "run" / "aqm"
    server = await fake_agent(sock, info, body)
    try:
        client = AgentClient("aqm", f"unix:{sock}", b"token")
        client.ws = await unix_connect(str(sock), uri="ws://localhost/")   # hello is not what is under test
        await client.ws.recv()                                               # the challenge
        try:
            async with asyncio.timeout(10):
                await client.collect(protocol.CollectArgs(run_id="r1", timeout_s=1), sink=sink)
            error = None
        except AgentError as exc:
            error = exc
        await client.close()
    finally:
        server.close()
        await server.wait_closed()
        sock.unlink(missing_ok=True)
    return error, sorted(p for p in tmp.rglob("*") if p.is_file() and p != sock)


def test_hostile_artifact_names_are_refused_with_a_coded_error(tmp_path, ledger):
    began = time.monotonic()
    refused, crashed = [], []
    for i, name in enumerate(HOSTILE):
        case = tmp_path / f"case{i}"
        case.mkdir()
        try:
            error, files = asyncio.run(collect_once(case, announcement(name)))
        except Exception as exc:  # noqa: BLE001 - anything but AgentError is a crash of the manager's collect
            crashed.append(f"{name!r}: {type(exc).__name__}: {exc}")
            continue
        assert isinstance(error, AgentError) and error.code == "protocol", (name, error)
        assert error.field == "name" and error.host == "aqm", (name, error)
        if isinstance(name, str) and name:
            assert repr(name[:80]) in str(error) or repr(name)[:40] in str(error), (name, str(error))
        assert files == [], (name, files)   # nothing written: no artifact, no .part, nothing outside the sink
        assert not (tmp_path.parent / "x").exists() and not (case / "x").exists()
        refused.append(str(error))
    # the same peer with a plain name delivers; with a wrong digest it leaves nothing
    (tmp_path / "good").mkdir()
    error, files = asyncio.run(collect_once(tmp_path / "good", announcement("capture-to-client.pcap")))
    assert error is None and [f.name for f in files] == ["capture-to-client.pcap"], (error, files)
    (tmp_path / "bad-sha").mkdir()
    error, files = asyncio.run(collect_once(tmp_path / "bad-sha", announcement("x.pcap", sha="0" * 64)))
    assert isinstance(error, AgentError) and "sha256/size mismatch" in str(error) and files == [], (error, files)
    print("\n".join(refused))
    took = time.monotonic() - began
    ledger.fault("hostile artifact names on collect", survived=not crashed, runs_lost=0,
                 detail=f"{len(refused)} names refused, {len(crashed)} crashes; test {took:.1f} s")
    assert not crashed, crashed
