"""Manager side of the agent protocol: connect, authenticate, call typed ops, receive artifacts.

Every reply is validated against schemas/protocol before it is trusted; artifact bytes are verified
against the sha256 the agent announced before the file is kept.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import socket
import ssl
import time
from pathlib import Path
from typing import cast

from pydantic import BaseModel, ValidationError
from websockets.asyncio.client import ClientConnection, connect, unix_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from orchestrator.netns_socket import connect_in_netns
from schemas import handshake, protocol
from schemas.validate import ProtocolError, check, check_result

log = logging.getLogger("tcplab.manager")
# Keepalive: a peer that stops answering (stopped process, cut link) is declared gone within
# PING_INTERVAL_S + PING_TIMEOUT_S + CLOSE_TIMEOUT_S (the closing handshake a silent peer never completes),
# whatever op is (or is not) in flight.
PING_INTERVAL_S = 5.0
PING_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
# The longest each op may take before the host is declared unreachable. collect adds its own wait for the
# tasks (CollectArgs.timeout_s) to COLLECT_TRANSFER_S for sending the artifacts.
OP_TIMEOUT_S = {"hello": 15.0, "clock": 5.0, "apply": 120.0, "schedule": 30.0, "status": 15.0, "stop": 30.0,
                "reset": 120.0, "bye": 5.0}
COLLECT_TRANSFER_S = 300.0
CONNECT_TIMEOUT_S = 15.0


class AgentError(Exception):
    """An agent refused or failed an op; carries the agent's coded error."""

    def __init__(self, host: str, op: str, code: str, message: str, field: str | None):
        self.host, self.op, self.code, self.field = host, op, code, field
        where = f" (field {field})" if field else ""
        super().__init__(f"agent {host}: {message}{where} [{code}]")


class AgentUnreachable(AgentError):
    """The control connection to a host is gone (closed, cut, or silent past its keepalive or op timeout)."""

    def __init__(self, host: str, op: str, message: str):
        super().__init__(host, op, "unreachable", message, None)


def artifact_name_problem(name: object) -> str | None:
    """Why an announced artifact name cannot be a file name in the run folder (None: it can). The agent is
    not trusted to choose a path: one plain component, no dot files (`.part` names are ours)."""
    if not isinstance(name, str) or not name:
        return "is empty"
    if name in (".", ".."):
        return "names the run folder or its parent"
    if "\x00" in name:
        return "contains NUL"
    if "/" in name or "\\" in name:
        return "contains a path separator"
    if name.startswith("."):
        return "starts with a dot"
    if len(name.encode()) > 200:
        return "is longer than 200 bytes"
    return None


class AgentClient:
    def __init__(self, host: str, url: str, token: bytes, tls: ssl.SSLContext | None = None,
                 netns: str | None = None):
        """`tls`: a client context that verifies the agent's certificate against the testbed CA (and may carry
        the manager's client certificate); used for tcp:// agents. None: plain WebSocket.
        `netns`: the network namespace a tcp:// agent is reached from (a UML lab's control network)."""
        self.host, self.url, self.token, self.tls, self.netns = host, url, token, tls, netns
        self.ws: ClientConnection | None = None
        self._next_id = 0
        self.hello: protocol.HelloResult | None = None

    @property
    def connected(self) -> bool:
        return self.ws is not None and self.ws.close_code is None

    async def wait_lost(self) -> None:
        """Returns when the control connection closes (the peer went away or stopped answering pings)."""
        if self.ws is not None:
            await self.ws.wait_closed()

    async def connect(self, client_name: str = "tcplab-manager") -> protocol.HelloResult:
        """Open the connection and authenticate both ways: prove the token to the agent, and refuse an agent
        that cannot prove it back over the same nonces and the same TLS channel. AgentUnreachable when the agent
        cannot be reached, or does not complete the hello, within CONNECT_TIMEOUT_S (no socket, refused, no
        handshake, a certificate that does not verify)."""
        # no permessage-deflate: artifacts are captures (deflate ran at ~36 MB/s here, slower than any testbed
        # link, and made collect the longest step of a run's end); the agent does not offer it either
        limits = {"max_size": 8 * 1024 * 1024, "ping_interval": PING_INTERVAL_S, "ping_timeout": PING_TIMEOUT_S,
                  "close_timeout": CLOSE_TIMEOUT_S, "open_timeout": CONNECT_TIMEOUT_S, "compression": None}
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                if self.url.startswith("unix:"):
                    self.ws = await unix_connect(self.url.removeprefix("unix:"), uri="ws://localhost/", **limits)
                elif self.tls is not None:
                    self.ws = await connect(self.url.replace("tcp://", "wss://"), ssl=self.tls,
                                            sock=await self._netns_socket(), **limits)
                else:
                    self.ws = await connect(self.url.replace("tcp://", "ws://"), sock=await self._netns_socket(),
                                            **limits)
        except (OSError, TimeoutError, InvalidHandshake, ConnectionClosed, ValueError) as exc:
            await self._abandon()
            raise AgentUnreachable(self.host, "hello", f"cannot connect to {self.url}: "
                                   f"{str(exc) or type(exc).__name__}") from None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await self._hello(client_name)
        except (TimeoutError, ConnectionClosed, OSError) as exc:
            await self._abandon()
            raise AgentUnreachable(self.host, "hello", f"no hello from {self.url}: "
                                   f"{str(exc) or type(exc).__name__}") from None
        except BaseException:
            await self._abandon()
            raise

    async def _netns_socket(self) -> socket.socket | None:
        """A connected socket from inside self.netns, or None (websockets connects by itself)."""
        if self.netns is None:
            return None
        addr, _, port = self.url.removeprefix("tcp://").rpartition(":")
        sock = await asyncio.to_thread(connect_in_netns, self.netns, addr, int(port), CONNECT_TIMEOUT_S)
        sock.setblocking(False)
        return sock

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
            if self.ws is not None:
                await self.ws.close()
            self.ws = None

    async def call(self, op: str, args: BaseModel, sink: Path | None = None) -> BaseModel:
        """Send one request and wait for its reply, returned as the op's result model (schemas/protocol.py
        RESULTS); artifact frames in between are written to `sink`. The typed ops below are what callers use.

        Every failure is an AgentError: a coded refusal of the agent as it came, a lost or silent connection
        as AgentUnreachable (op timeout: OP_TIMEOUT_S), a reply that breaks the protocol as code `protocol`.
        After the latter two the connection is closed: what follows on it can no longer be trusted."""
        if not self.connected:
            await self._abandon()
            raise AgentUnreachable(self.host, op, "control connection already lost")
        timeout_s = OP_TIMEOUT_S.get(op, 60.0)
        if isinstance(args, protocol.CollectArgs):
            timeout_s = args.timeout_s + COLLECT_TRANSFER_S
        try:
            async with asyncio.timeout(timeout_s):
                return await self._call(op, args, sink)
        except AgentError as exc:
            if exc.code in ("protocol", "local_io"):   # mid-stream: the frames that follow cannot be placed
                await self._abandon()
            raise
        except TimeoutError:
            await self._abandon()
            raise AgentUnreachable(self.host, op, f"no reply to {op} within {timeout_s:.0f} s") from None
        except (ConnectionClosed, OSError) as exc:
            await self._abandon()
            raise AgentUnreachable(self.host, op, f"control connection lost during {op}: {exc}") from None
        except (ProtocolError, ValidationError, ValueError, KeyError, TypeError) as exc:
            await self._abandon()
            raise AgentError(self.host, op, "protocol", f"reply broke the protocol: {exc}", None) from None

    async def _abandon(self) -> None:
        if self.ws is not None:
            ws, self.ws = self.ws, None
            ws.transport.abort()   # no closing handshake: the peer may be the thing that stopped answering

    async def _call(self, op: str, args: BaseModel, sink: Path | None) -> BaseModel:
        assert self.ws is not None
        self._next_id += 1
        req = {"id": self._next_id, "op": op, "args": args.model_dump(mode="json")}
        await self.ws.send(json.dumps(req))
        while True:
            msg = json.loads(await self.ws.recv())
            if "event" in msg:
                check("event", msg, code="protocol")
                if msg["event"] == "artifact":
                    await self._receive_artifact(msg.get("data"), sink)
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

    async def _receive_artifact(self, data: object, sink: Path | None) -> None:
        """Write one announced artifact to `sink` as a `.part` file, kept under its name only when size and
        sha256 match. A name that is not one plain file name is refused before anything is written, and no
        `.part` file outlives a failure."""
        assert self.ws is not None
        if sink is None:
            raise AgentError(self.host, "collect", "protocol", "artifact frames outside collect", None)
        try:
            info = protocol.ArtifactInfo.model_validate(data)
        except ValidationError as exc:
            shown = repr(data.get("name"))[:80] if isinstance(data, dict) else type(data).__name__
            raise AgentError(self.host, "collect", "protocol",
                             f"artifact {shown}: announcement refused: {exc.errors()[0]['msg']}", "name") from None
        problem = artifact_name_problem(info.name)
        if problem or info.size < 0:
            why = problem or f"has a negative size {info.size}"
            raise AgentError(self.host, "collect", "protocol", f"artifact name {info.name[:80]!r} {why}", "name")
        tmp = sink / f".{info.name}.part"
        digest, got = hashlib.sha256(), 0
        try:
            sink.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                while got < info.size:
                    chunk = await self.ws.recv()
                    if not isinstance(chunk, bytes):
                        raise AgentError(self.host, "collect", "protocol", f"artifact {info.name!r}: text frame "
                                         "in its data", "name")
                    fh.write(chunk)
                    digest.update(chunk)
                    got += len(chunk)
            if got != info.size or digest.hexdigest() != info.sha256:
                raise AgentError(self.host, "collect", "protocol", f"artifact {info.name!r}: sha256/size mismatch",
                                 "name")
            tmp.rename(sink / info.name)
        except OSError as exc:   # the manager's own disk (full, read-only): not the agent's fault, not the link's
            raise AgentError(self.host, "collect", "local_io", f"artifact {info.name!r}: cannot write it to {sink}: "
                             f"{exc.strerror or exc}", "name") from None
        finally:
            tmp.unlink(missing_ok=True)

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
