"""`python -m agents.appwriter {writer|sink} ...`: the app-limited (thin-stream) flow's two ends, each a child
process of the agent (agents/appflows.py starts them), standard library only.

Why a child process and not a task on the agent's event loop: the writes must keep their schedule to within
a few ms even in a loaded TCG guest, and the agent's loop also runs samplers, the WebSocket and artifact
transfers. The child sleeps until shortly before each instant and spins the rest (SPIN_NS at most), and
never waits on anything but its own socket.

writer: connects to the sink (retrying while the sink is not listening yet), then at each instant of the
schedule (absolute CLOCK_REALTIME, start + k x interval, so errors never accumulate; or exponential gaps of
that mean drawn from the seed) makes one non-blocking send() of `size` bytes and logs it. A write the socket
does not take in full (send buffer full) is not retried: its `accepted` says how much went into the stream,
and the rest is dropped, as a game or telemetry sender drops a stale update.

sink: accepts one connection and reads until EOF (or the stop time), logging every read.

Log format (both): the line `tcplab-app-log 1\\n`, one JSON line of metadata, then fixed little-endian
records (WRITE_RECORD / READ_RECORD), so a long run at 1 ms costs 32 bytes a write and the manager reads the
whole log with one numpy.frombuffer (orchestrator/ingest/applog.py).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

MAGIC = b"tcplab-app-log 1\n"
# scheduled instant, CLOCK_REALTIME just before send(), stream offset of the write's first byte, size asked,
# bytes accepted (SEND_FAILED: send() failed with an error other than EAGAIN, the stream is then closed;
# SKIPPED: the writer reached the instant more than half an interval late and did not write, so a stall
# shows as missing writes rather than a burst of catch-up writes)
WRITE_RECORD = struct.Struct("<qqqii")
SEND_FAILED, SKIPPED = -1, -2
# CLOCK_REALTIME just after recv() returned, stream offset one past the last byte read so far
READ_RECORD = struct.Struct("<qq")
SPIN_NS = 300_000             # spin (not sleep) the last 0.3 ms before an instant: sleep wakes late
CONNECT_RETRY_S = 0.05
READ_BYTES = 65536
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13)
RT_PRIORITY = 10


def schedule(first_ns: int, interval_ns: int, end_ns: int, dist: str, seed: int, limit: int) -> Iterator[int]:
    """The write instants (absolute ns) in [first_ns, end_ns), at most `limit` of them (pure). `fixed`:
    first + k x interval; `exponential`: gaps drawn i.i.d. with mean `interval` from random.Random(seed),
    accumulated in exact integers so the k-th instant does not drift with k."""
    rng = random.Random(seed)
    t = first_ns
    for k in range(limit):
        if dist == "fixed":
            t = first_ns + k * interval_ns
        elif k:
            t += max(1, round(rng.expovariate(1.0) * interval_ns))
        if t >= end_ns:
            return
        yield t


def wait_until(t_ns: int, spin_ns: int = SPIN_NS) -> None:
    """Sleep until spin_ns before t_ns, then spin on the clock (bounded by spin_ns)."""
    rest = t_ns - time.time_ns() - spin_ns
    if rest > 0:
        time.sleep(rest / 1e9)
    while time.time_ns() < t_ns:
        pass


def _header(out, meta: dict) -> None:
    out.write(MAGIC + json.dumps(meta, sort_keys=True).encode() + b"\n")
    out.flush()


def connect(dst: str, port: int, cc: str, nodelay: bool, deadline_ns: int, who: str = "appwriter") -> socket.socket:
    """A TCP connection to a sink, with congestion control `cc` (TCP_CONGESTION) and TCP_NODELAY as asked,
    retried while the sink is not listening yet, until deadline_ns."""
    last: OSError | None = None
    while time.time_ns() < deadline_ns:
        s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, cc.encode())
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if nodelay else 0)
        try:
            s.connect((dst, port))
            return s
        except (ConnectionRefusedError, TimeoutError) as exc:   # the sink is not listening yet
            last = exc
            s.close()
            time.sleep(CONNECT_RETRY_S)
    raise SystemExit(f"{who}: cannot connect to {dst} port {port}: {last}")


def realtime_priority() -> str:
    """SCHED_FIFO, when allowed (the agent is root): a loaded host then wakes the child on time. The writer
    sleeps between writes and spins at most SPIN_NS, the sink blocks in recv(); the kernel's RT throttling
    bounds both anyway."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        return f"fifo:{RT_PRIORITY}"
    except (OSError, AttributeError) as exc:
        return f"other ({exc})"


def run_writer(args: argparse.Namespace) -> int:
    sched = realtime_priority()
    wait_until(args.connect_ns, 0)
    sock = connect(args.dst, args.port, args.cc, args.nodelay, args.first_ns + 2_000_000_000)
    sock.setblocking(False)
    payload = b"x" * args.size
    meta = {"role": "writer", "local_port": sock.getsockname()[1], "dst": args.dst, "port": args.port,
            "cc": args.cc, "nodelay": args.nodelay, "size": args.size, "interval_ns": args.interval_ns,
            "dist": args.dist, "seed": args.seed, "first_ns": args.first_ns, "end_ns": args.end_ns,
            "connected_ns": time.time_ns(), "sched": sched}
    offset, error, late_ns = 0, "", args.interval_ns // 2
    with open(args.out, "wb", buffering=1 << 16) as out:
        _header(out, meta)
        for t in schedule(args.first_ns, args.interval_ns, args.end_ns, args.dist, args.seed, args.limit):
            wait_until(t)
            now = time.time_ns()
            if now - t > late_ns:
                out.write(WRITE_RECORD.pack(t, now, offset, args.size, SKIPPED))
                continue
            try:
                accepted = sock.send(payload)
            except BlockingIOError:
                accepted = 0
            except OSError as exc:   # the connection is gone: log it and stop writing
                out.write(WRITE_RECORD.pack(t, now, offset, args.size, SEND_FAILED))
                error = f"send failed at offset {offset}: {exc}"
                break
            out.write(WRITE_RECORD.pack(t, now, offset, args.size, accepted))
            offset += accepted
    sock.setblocking(True)
    sock.close()      # the kernel still delivers what is queued, then sends FIN
    if error:
        print(f"appwriter: {error}", file=sys.stderr)
        return 3
    return 0


def run_sink(args: argparse.Namespace) -> int:
    sched = realtime_priority()    # its read times are the application's view (M-APPREAD): wake it on time
    family = socket.AF_INET6 if ":" in args.bind else socket.AF_INET
    srv = socket.socket(family, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((args.bind, args.port))
    srv.listen(1)
    srv.settimeout(max(0.0, (args.end_ns - time.time_ns()) / 1e9))
    try:
        conn, peer = srv.accept()
    except TimeoutError:
        print(f"appsink: no connection on port {args.port} before the stop time", file=sys.stderr)
        return 4
    finally:
        srv.close()
    received = 0
    with conn, open(args.out, "wb", buffering=1 << 16) as out:
        _header(out, {"role": "sink", "port": args.port, "peer": peer[0], "peer_port": peer[1],
                      "accepted_ns": time.time_ns(), "sched": sched})
        while True:
            left = (args.end_ns - time.time_ns()) / 1e9
            if left <= 0:
                break
            conn.settimeout(left)
            try:
                data = conn.recv(READ_BYTES)
            except TimeoutError:
                break
            now = time.time_ns()
            if not data:
                break
            received += len(data)
            out.write(READ_RECORD.pack(now, received))
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m agents.appwriter", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("writer")
    w.add_argument("--dst", required=True)
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--cc", required=True)
    w.add_argument("--nodelay", action="store_true")
    w.add_argument("--size", type=int, required=True)
    w.add_argument("--interval-ns", type=int, required=True)
    w.add_argument("--dist", choices=("fixed", "exponential"), default="fixed")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--connect-ns", type=int, required=True)
    w.add_argument("--first-ns", type=int, required=True)
    w.add_argument("--end-ns", type=int, required=True)
    w.add_argument("--limit", type=int, required=True)
    w.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("sink")
    s.add_argument("--bind", default="0.0.0.0")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--end-ns", type=int, required=True)
    s.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def writes_planned(interval_ns: int, duration_ns: int) -> int:
    """How many writes a fixed schedule makes in `duration_ns` (pure; the plan check and the agent agree)."""
    return math.ceil(duration_ns / interval_ns)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return run_writer(args) if args.mode == "writer" else run_sink(args)


if __name__ == "__main__":
    raise SystemExit(main())
