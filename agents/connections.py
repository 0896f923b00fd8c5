"""The admission decisions (agents/admission.py) applied to real connections: the imperative shell.

A connection is counted from the moment the kernel hands it over (asyncio `connection_made`), before the
WebSocket handshake, so idle sockets that never send a byte are held to the cap too. Room is made by
dropping the oldest unauthenticated connection (a close frame when it is open, else an abort): that frees
its descriptor at once, never after a closing handshake an attacker could stall.
"""
from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, cast

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

from agents.admission import Admission, LogBudget

POLICY_VIOLATION = 1008   # RFC 6455: hello timeout, wrong proof, frames before hello
TRY_AGAIN_LATER = 1013    # evicted to make room


def peer_of(transport: asyncio.BaseTransport) -> str:
    """The peer's address without its port (the unit of the per-peer limits); "unix" on a UNIX socket."""
    name = transport.get_extra_info("peername")
    if isinstance(name, tuple) and name:
        return str(name[0])
    return "unix"


def drop(conn: ServerConnection, code: int, reason: str) -> None:
    """Close now: a close frame if the WebSocket is open, then the socket, without waiting for the peer."""
    transport = getattr(conn, "transport", None)
    if transport is None or transport.is_closing():
        return
    if conn.protocol.state is State.OPEN:
        conn.protocol.send_close(code, reason)
        for data in conn.protocol.data_to_send():
            if data:
                transport.write(data)
        transport.close()      # flushes the close frame, then closes; no closing handshake to wait for
    else:
        transport.abort()


def raise_frame_limit(conn: ServerConnection, max_bytes: int) -> None:
    """Lift this connection's frame limit after hello. websockets reads it before every frame; it is called
    `max_message_size` since websockets 15 and `max_size` before."""
    for attribute in ("max_message_size", "max_size"):
        if hasattr(conn.protocol, attribute):
            setattr(conn.protocol, attribute, max_bytes)
            return
    raise RuntimeError("this websockets version has no per-connection frame limit the agent knows")


def gated_connection_factory(admission: Admission, audit: Callable[..., None], tls: ssl.SSLContext | None = None,
                             tls_handshake_timeout_s: float = 5.0) -> Callable[..., ServerConnection]:
    """`create_connection` for websockets.serve: every new connection passes `admission` first. With `tls`
    the TLS handshake is done here, after admission (not by the listening socket, which would hand the
    connection over only once its handshake was done: silent sockets would not count against the cap)."""
    live: dict[int, GatedConnection] = {}

    class GatedConnection(ServerConnection):
        admitted = False
        ready = False             # websockets has the (TLS) transport: connection_made done
        raw_transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            peer = peer_of(transport)
            decision = admission.admit(id(self), peer)
            if not decision.accepted:
                audit("connection refused peer=%s reason=%s", peer, decision.reason)
                transport.abort()
                return
            self.admitted, self.raw_transport = True, cast(asyncio.Transport, transport)
            live[id(self)] = self
            for key in decision.evict:
                victim = live.pop(key, None)    # type: ignore[arg-type]
                if victim is not None:
                    audit("connection evicted peer=%s reason=%s", peer_of(victim.raw_transport), decision.reason)
                    victim.drop(TRY_AGAIN_LATER, "connection cap: oldest unauthenticated connection dropped")
            if tls is None:
                self._ready(transport)
            else:
                transport.pause_reading()       # no TLS bytes into the WebSocket parser; start_tls resumes
                asyncio.get_running_loop().create_task(self._start_tls(peer))

        async def _start_tls(self, peer: str) -> None:
            assert self.raw_transport is not None and tls is not None
            try:
                tls_transport = await asyncio.get_running_loop().start_tls(
                    self.raw_transport, self, tls, server_side=True, ssl_handshake_timeout=tls_handshake_timeout_s)
            except (OSError, ssl.SSLError, TimeoutError, ConnectionError, RuntimeError) as exc:
                audit("TLS handshake failed peer=%s error=%s", peer, type(exc).__name__)
                self.raw_transport.abort()
                self._forget()
                return
            if tls_transport is None or self.raw_transport.is_closing():
                self._forget()
                return
            self._ready(tls_transport)

        def _ready(self, transport: asyncio.BaseTransport) -> None:
            self.ready = True
            super().connection_made(transport)

        def drop(self, code: int, reason: str) -> None:
            if self.ready:
                drop(self, code, reason)
            elif self.raw_transport is not None:
                self.raw_transport.abort()      # still in the TLS handshake

        def _forget(self) -> None:
            live.pop(id(self), None)
            admission.closed(id(self))

        def connection_lost(self, exc: Exception | None) -> None:
            if not self.admitted:
                return
            self._forget()
            if self.ready:
                super().connection_lost(exc)

    return GatedConnection


class BoundedLog:
    """Log lines caused by unauthenticated peers, within a LogBudget."""

    def __init__(self, logger: logging.Logger, budget: LogBudget | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.logger, self.budget, self.clock = logger, budget or LogBudget(), clock

    def __call__(self, fmt: str, *args: Any, level: int = logging.WARNING) -> None:
        allowed, suppressed = self.budget.allow(self.clock())
        if suppressed:
            self.logger.warning("%d log lines about unauthenticated peers suppressed in the last %.0f s",
                                suppressed, self.budget.window_s)
        if allowed:
            self.logger.log(level, fmt, *args)


class BoundedLogFilter(logging.Filter):
    """For the websockets library's own logger: no traceback for a peer's broken handshake (the library logs
    one error with a traceback per failed handshake), and at most the budget's lines per window. Other
    tracebacks -- a failure in the agent's own handler -- are kept: they are bugs to see."""

    PEER_CAUSED = ("opening handshake failed",)

    def __init__(self, budget: LogBudget | None = None, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.budget, self.clock = budget or LogBudget(), clock

    def filter(self, record: logging.LogRecord) -> bool:
        allowed, suppressed = self.budget.allow(self.clock())
        if suppressed and allowed:
            record.msg = f"{record.msg} ({suppressed} earlier lines suppressed)"
        if str(record.msg).startswith(self.PEER_CAUSED):
            record.exc_info, record.exc_text = None, None
        return allowed
