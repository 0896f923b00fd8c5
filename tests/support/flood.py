"""Load generators against an agent, bounded in count and time, for the pre-authentication tests. Senders of
large frames run in a process of their own (`python -m tests.support.flood big-frames ...`), so the test's
own event loop, which measures the manager's clock round trip, is not the one busy building 8 MiB frames."""
from __future__ import annotations

import argparse
import asyncio
import json
import time

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake


async def idle_tcp(host: str, port: int, source: str, count: int) -> list[asyncio.StreamWriter]:
    """Open `count` TCP connections from `source` that never send a byte; the caller closes them."""
    writers = []
    for _ in range(count):
        try:
            _, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
            writers.append(writer)
        except OSError:
            pass
    return writers


async def idle_websockets(url: str, source: str, count: int, budget_s: float) -> list:
    """Open up to `count` WebSocket connections from `source` that read the challenge and stay silent."""
    conns, deadline = [], time.monotonic() + budget_s
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        try:
            ws = await connect(url.replace("tcp://", "ws://"), local_addr=(source, 0), open_timeout=2)
            conns.append(ws)
        except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError):
            pass
    return conns


async def big_frames(url: str, senders: int, seconds: float, size: int, first_source: int) -> dict:
    """`senders` loops, each from its own 127.0.0.N: connect, send one `size`-character text frame before
    hello, read what comes back (an error or a close), again -- for `seconds`."""
    frame = json.dumps({"id": 1, "op": "hello", "args": {"client": "x" * size}})
    counts = {"frames": 0, "closed": 0, "replies": 0, "connect_failed": 0}

    async def one(source: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                ws = await connect(url.replace("tcp://", "ws://"), local_addr=(source, 0), open_timeout=2,
                                   max_size=None, close_timeout=1, compression=None)   # the frame's real 8 MiB
            except (OSError, InvalidHandshake, TimeoutError):
                counts["connect_failed"] += 1
                await asyncio.sleep(0.01)
                continue
            try:
                await ws.recv()                                     # the challenge
                await ws.send(frame)
                counts["frames"] += 1
                await asyncio.wait_for(ws.recv(), 2)
                counts["replies"] += 1
            except (ConnectionClosed, TimeoutError):
                counts["closed"] += 1
            finally:
                # no closing handshake: the agent closed at the frame's header while the frame was still being
                # written, and websockets' close() on that half-written connection hit an asyncio 3.11 bug
                # (transport.abort() after connection_lost: AttributeError)
                if not ws.transport.is_closing():
                    ws.transport.abort()

    await asyncio.gather(*(one(f"127.0.0.{first_source + i}") for i in range(senders)))
    return counts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["big-frames"])
    p.add_argument("--url", required=True)
    p.add_argument("--senders", type=int, default=4)
    p.add_argument("--seconds", type=float, default=3)
    p.add_argument("--size", type=int, default=8 * 1024 * 1024 - 100)
    p.add_argument("--first-source", type=int, default=10)
    a = p.parse_args()
    print(json.dumps(asyncio.run(big_frames(a.url, a.senders, a.seconds, a.size, a.first_source))))


if __name__ == "__main__":
    main()
