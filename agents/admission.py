"""Limits before authentication, as pure decisions (no sockets, no clock of its own: callers pass `now`).

Anyone on the control network can open connections and send frames before `hello`. What they may hold is
bounded here: connections in total and per peer address, frames and bytes before hello, time to hello, failed
hellos per peer and in total, and log lines. The imperative shell (agents/connections.py, agents/server.py)
applies the decisions to real connections.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PreAuthLimits:
    max_connections: int = 64               # every open connection, authenticated or not (file descriptors)
    max_unauthenticated_per_peer: int = 8   # one address cannot fill the table and push out everyone else
    hello_timeout_s: float = 10.0
    max_frame_before_hello: int = 64 * 1024  # a hello is < 1 KiB; 8 MiB frames only after it
    max_frames_before_hello: int = 16
    failed_hello_burst_per_peer: float = 5
    failed_hello_rate_per_peer: float = 0.5  # per second, after the burst
    failed_hello_burst_total: float = 50
    failed_hello_rate_total: float = 10
    max_tracked_peers: int = 4096           # per-peer buckets kept; full (idle) ones are dropped first


@dataclass
class TokenBucket:
    """`burst` tokens, refilled at `rate` per second; one token per failed attempt."""
    burst: float
    rate: float
    tokens: float = -1.0
    at: float = 0.0

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now

    def available(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= 1

    def take(self, now: float) -> None:
        self._refill(now)
        self.tokens = max(0.0, self.tokens - 1)

    def wait_s(self, now: float) -> float:
        self._refill(now)
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def full(self, now: float) -> bool:
        self._refill(now)
        return self.tokens >= self.burst


@dataclass(frozen=True)
class Admit:
    accepted: bool
    evict: list[Hashable] = field(default_factory=list)   # connections to close to make room
    reason: str = ""


@dataclass
class _Entry:
    peer: str
    order: int
    authenticated: bool = False


class Admission:
    """The connection table and the failed-hello budgets of one agent."""

    def __init__(self, limits: PreAuthLimits | None = None):
        self.limits = limits or PreAuthLimits()
        self._conns: dict[Hashable, _Entry] = {}
        self._order = itertools.count()
        self._peer_buckets: dict[str, TokenBucket] = {}
        self._total_bucket = TokenBucket(self.limits.failed_hello_burst_total, self.limits.failed_hello_rate_total)

    # ------------------------------------------------------------ connections
    def admit(self, key: Hashable, peer: str) -> Admit:
        """A new connection from `peer`. Room is made by evicting the oldest unauthenticated connection -- of
        the same peer first, then of anyone -- never an authenticated one: a manager that proved the token
        keeps its connection, and a new one can always get in while any slot is held by a stranger."""
        lim = self.limits
        evict: list[Hashable] = []
        same_peer = self._unauthenticated(peer)
        if len(same_peer) >= lim.max_unauthenticated_per_peer:
            evict.append(same_peer[0])
        elif len(self._conns) >= lim.max_connections:
            anyone = self._unauthenticated(None)
            if not anyone:
                return Admit(False, reason=f"{len(self._conns)} authenticated connections: the cap is "
                                           f"{lim.max_connections}")
            evict.append(anyone[0])
        for key_ in evict:
            self._conns.pop(key_, None)
        self._conns[key] = _Entry(peer, next(self._order))
        reason = f"connection cap: evicted the oldest unauthenticated connection of {len(evict)}" if evict else ""
        return Admit(True, evict, reason)

    def authenticated(self, key: Hashable) -> None:
        if key in self._conns:
            self._conns[key].authenticated = True

    def closed(self, key: Hashable) -> None:
        self._conns.pop(key, None)

    def open_connections(self) -> int:
        return len(self._conns)

    def _unauthenticated(self, peer: str | None) -> list[Hashable]:
        """Unauthenticated connections (of `peer`, or of anyone), oldest first."""
        found = [(e.order, k) for k, e in self._conns.items()
                 if not e.authenticated and (peer is None or e.peer == peer)]
        return [k for _, k in sorted(found, key=lambda pair: pair[0])]

    # ------------------------------------------------------------ failed hellos
    def hello_refusal(self, peer: str, now: float) -> str | None:
        """Why a hello from `peer` is not even checked now (its budget of failures is spent), or None."""
        bucket = self._peer_buckets.get(peer)
        if bucket is not None and not bucket.available(now):
            return f"too many failed hellos from {peer}: retry in {math.ceil(bucket.wait_s(now))} s"
        if not self._total_bucket.available(now):
            return f"too many failed hellos on this agent: retry in {math.ceil(self._total_bucket.wait_s(now))} s"
        return None

    def hello_failed(self, peer: str, now: float) -> None:
        lim = self.limits
        bucket = self._peer_buckets.get(peer)
        if bucket is None:
            if len(self._peer_buckets) >= lim.max_tracked_peers:
                self._forget_idle_peers(now)
            bucket = self._peer_buckets[peer] = TokenBucket(lim.failed_hello_burst_per_peer,
                                                            lim.failed_hello_rate_per_peer, at=now)
        bucket.take(now)
        self._total_bucket.take(now)

    def _forget_idle_peers(self, now: float) -> None:
        for peer in [p for p, b in self._peer_buckets.items() if b.full(now)]:
            del self._peer_buckets[peer]
        while len(self._peer_buckets) >= self.limits.max_tracked_peers:   # all still throttled: oldest first
            del self._peer_buckets[next(iter(self._peer_buckets))]


class LogBudget:
    """At most `lines` log lines per `window_s` from unauthenticated peers; what is held back is counted and
    reported in one line when the next window opens, so an attacker cannot fill the disk through the log."""

    def __init__(self, lines: int = 20, window_s: float = 10.0):
        self.lines, self.window_s = lines, window_s
        self._window_start = float("-inf")
        self._used = 0
        self.suppressed = 0

    def allow(self, now: float) -> tuple[bool, int]:
        """(may this line be logged, lines suppressed in the window that just closed: report them first)."""
        reported = 0
        if now - self._window_start >= self.window_s:
            self._window_start, self._used = now, 0
            reported, self.suppressed = self.suppressed, 0
        if self._used < self.lines:
            self._used += 1
            return True, reported
        self.suppressed += 1
        return False, reported
