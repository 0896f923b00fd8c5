"""The host's TCP sockets as /proc/net/tcp{,6} lists them (pure parsing + one cheap read): whether an iperf3
server listens yet, and whether a flow's connections are closed. The agent runs in its host's network
namespace, so these files list that host's sockets only."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

PROC_TCP = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN = 0x0A
# a connection is over for the capture once it is gone or in TIME_WAIT (both FINs sent and acknowledged)
CLOSED_STATES = frozenset({0x06, 0x07})   # TIME_WAIT, CLOSE
POLL_S = 0.005         # a server's listening socket: during the lead, before any flow
CLOSE_POLL_S = 0.01    # a flow's close: other flows may still run on this host (a slow guest feels every read)


def _rows(text: str) -> list[tuple[int, int, int]]:
    """(local port, remote port, state) of every socket line of a /proc/net/tcp{,6} text."""
    out = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 4:
            continue
        try:
            out.append((int(parts[1].rsplit(":", 1)[1], 16), int(parts[2].rsplit(":", 1)[1], 16),
                        int(parts[3], 16)))
        except (IndexError, ValueError):
            continue
    return out


def listening(text: str, port: int) -> bool:
    return any(lport == port and state == LISTEN for lport, _, state in _rows(text))


def open_connections(text: str, remote_port: int) -> int:
    """How many of the socket lines are connections to `remote_port` not yet closed (see CLOSED_STATES)."""
    return sum(1 for _, rport, state in _rows(text)
               if rport == remote_port and state != LISTEN and state not in CLOSED_STATES)


def read_proc_tcp() -> str:
    parts = []
    for path in PROC_TCP:
        try:
            parts.append(path.read_text())
        except OSError:
            continue
    # each file has its own header line: keep one, join the socket lines
    return "\n".join([parts[0]] + ["\n".join(p.splitlines()[1:]) for p in parts[1:]]) if parts else ""


async def wait_for(check, timeout_s: float, poll_s: float = POLL_S) -> int | None:
    """Poll `check(text of /proc/net/tcp{,6})` every `poll_s` until it holds: the CLOCK_REALTIME ns it first
    held, None when `timeout_s` passed first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check(read_proc_tcp()):   # a few KiB in a host's namespace: read on the loop
            return time.time_ns()
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(poll_s)
