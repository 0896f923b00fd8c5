"""Manager side of the agent protocol: connect, authenticate, call typed ops, receive artifacts.

Every reply is validated against schemas/protocol before it is trusted; artifact bytes are verified
against the sha256 the agent announced before the file is kept.
"""
from __future__ import annotations

import hashlib
import json
import logging
import secrets
import ssl
import time
from pathlib import Path
from typing import cast

from pydantic import BaseModel
from websockets.asyncio.client import ClientConnection, connect, unix_connect

from schemas import handshake, protocol
from schemas.validate import check, check_result

log = logging.getLogger("tcplab.manager")


class AgentError(Exception):
    """An agent refused or failed an op; carries the agent's coded error."""

    def __init__(self, host: str, op: str, code: str, message: str, field: str | None):
        self.host, self.op, self.code, self.field = host, op, code, field
        where = f" (field {field})" if field else ""
        super().__init__(f"agent {host}: {message}{where} [{code}]")


class AgentClient:
    def __init__(self, host: str, url: str, token: bytes, tls: ssl.SSLContext | None = None):
        """`tls`: a client context that verifies the agent's certificate against the testbed CA (and may carry
        the manager's client certificate); used for tcp:// agents. None: plain WebSocket."""
        self.host, self.url, self.token, self.tls = host, url, token, tls
        self.ws: ClientConnection | None = None
        self._next_id = 0
        self.hello: protocol.HelloResult | None = None

    async def connect(self, client_name: str = "tcplab-manager") -> protocol.HelloResult:
        """Open the connection and authenticate both ways: prove the token to the agent, and refuse an agent
        that cannot prove it back over the same nonces and the same TLS channel."""
        limits = {"max_size": 8 * 1024 * 1024, "ping_interval": 20, "ping_timeout": 60}
        if self.url.startswith("unix:"):
            self.ws = await unix_connect(self.url.removeprefix("unix:"), uri="ws://localhost/", **limits)
        elif self.tls is not None:
            self.ws = await connect(self.url.replace("tcp://", "wss://"), ssl=self.tls, **limits)
        else:
            self.ws = await connect(self.url.replace("tcp://", "ws://"), **limits)
        try:
            return await self._hello(client_name)
        except BaseException:
            await self.ws.close()
            self.ws = None
            raise

    async def _hello(self, client_name: str) -> protocol.HelloResult:
        assert self.ws is not None
        greeting = json.loads(await self.ws.recv())
        check("event", greeting, code="protocol")
        if greeting["event"] != "challenge":
            raise AgentError(self.host, "hello", "protocol", "agent did not send a challenge", None)
        agent_nonce, nonce = greeting["data"]["nonce"], secrets.token_bytes(32).hex()
        binding = handshake.certificate_binding(self._agent_certificate())
        mac = handshake.manager_proof(self.token, agent_nonce, nonce, binding)
        hello = cast(protocol.HelloResult, await self.call(
            "hello", protocol.HelloArgs(client=client_name, nonce=nonce, hmac=mac)))
        if not handshake.proofs_match(hello.proof, handshake.agent_proof(self.token, agent_nonce, nonce, binding)):
            raise AgentError(self.host, "hello", "unauthenticated", "the agent could not prove the testbed token"
                             + (" over this TLS channel" if binding else "") + ": not our agent", "proof")
        self.hello = hello
        return hello

    def _agent_certificate(self) -> bytes | None:
        """The agent's certificate (DER) as this connection received it; None without TLS."""
        assert self.ws is not None
        ssl_object = self.ws.transport.get_extra_info("ssl_object")
        return ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None

    async def close(self) -> None:
        if self.ws is not None:
            try:
                await self.call("bye", protocol.Empty())
            except Exception:  # noqa: BLE001 - closing a broken connection must not mask the real error
                pass
            await self.ws.close()
            self.ws = None

    async def call(self, op: str, args: BaseModel, sink: Path | None = None) -> BaseModel:
        """Send one request and wait for its reply, returned as the op's result model (schemas/protocol.py
        RESULTS); artifact frames in between are written to `sink`. The typed ops below are what callers use."""
        assert self.ws is not None, "connect() first"
        self._next_id += 1
        req = {"id": self._next_id, "op": op, "args": args.model_dump(mode="json")}
        await self.ws.send(json.dumps(req))
        while True:
            msg = json.loads(await self.ws.recv())
            if "event" in msg:
                check("event", msg, code="protocol")
                if msg["event"] == "artifact":
                    await self._receive_artifact(msg["data"], sink)
                continue
            check("reply", msg, code="protocol")
            if msg.get("id") != self._next_id:
                raise AgentError(self.host, op, "protocol", f"reply id {msg.get('id')} != {self._next_id}",
                                 None)
            if msg.get("error"):
                err = msg["error"]
                raise AgentError(self.host, op, err["code"], err["message"], err.get("field"))
            check_result(op, msg["result"])
            return protocol.RESULTS[op].model_validate(msg["result"])

    async def apply(self, args: protocol.ApplyArgs) -> protocol.ApplyResult:
        return cast(protocol.ApplyResult, await self.call("apply", args))

    async def schedule(self, args: protocol.ScheduleArgs) -> protocol.ScheduleResult:
        return cast(protocol.ScheduleResult, await self.call("schedule", args))

    async def collect(self, args: protocol.CollectArgs, sink: Path) -> protocol.CollectResult:
        return cast(protocol.CollectResult, await self.call("collect", args, sink=sink))

    async def status(self) -> protocol.StatusResult:
        return cast(protocol.StatusResult, await self.call("status", protocol.Empty()))

    async def stop(self) -> protocol.StatusResult:
        return cast(protocol.StatusResult, await self.call("stop", protocol.Empty()))

    async def reset(self) -> protocol.ResetResult:
        return cast(protocol.ResetResult, await self.call("reset", protocol.Empty()))

    async def clock(self, t1_ns: int) -> protocol.ClockResult:
        return cast(protocol.ClockResult, await self.call("clock", protocol.ClockArgs(t1_ns=t1_ns)))

    async def _receive_artifact(self, info: dict, sink: Path | None) -> None:
        assert self.ws is not None
        if sink is None:
            raise AgentError(self.host, "collect", "protocol", "artifact frames outside collect", None)
        sink.mkdir(parents=True, exist_ok=True)
        name = Path(info["name"]).name  # never let an agent choose a path outside the run folder
        tmp = sink / f".{name}.part"
        digest, got = hashlib.sha256(), 0
        with open(tmp, "wb") as fh:
            while got < info["size"]:
                chunk = await self.ws.recv()
                if not isinstance(chunk, bytes):
                    raise AgentError(self.host, "collect", "protocol", f"{name}: text frame in data",
                                     None)
                fh.write(chunk)
                digest.update(chunk)
                got += len(chunk)
        if got != info["size"] or digest.hexdigest() != info["sha256"]:
            tmp.unlink()
            raise AgentError(self.host, "collect", "protocol", f"{name}: sha256/size mismatch", None)
        tmp.rename(sink / name)

    async def clock_offset_ns(self, samples: int = 5) -> tuple[int, int]:
        """NTP-style offset (agent - manager) and RTT of the best of `samples` exchanges."""
        best: tuple[int, int] | None = None
        for _ in range(samples):
            t1 = time.time_ns()
            r = await self.clock(t1)
            t4 = time.time_ns()
            rtt = (t4 - t1) - (r.t3_ns - r.t2_ns)
            offset = ((r.t2_ns - t1) + (r.t3_ns - t4)) // 2
            if best is None or rtt < best[1]:
                best = (offset, rtt)
        assert best is not None
        return best
