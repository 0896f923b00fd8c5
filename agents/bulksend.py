"""`python -m agents.bulksend ...`: the `bulk` flows of one sender host that start at one instant, as one
child process of the agent (agents/appflows.py starts it), standard library only. Their receivers are
app-limited sinks (agents/appwriter.py `sink`): each reads and logs every byte.

Why: an iperf3 flow starts when its client process has started, made its control connection, exchanged its
parameters and connected its data stream, milliseconds after the flow's start time (far more in an emulated
host). Here every connection is made before T0 (once the captures run, so they see the handshakes) and the
flows are released at the start instant: the process sleeps until SPIN_NS before it, spins the rest (at
SCHED_FIFO when allowed), then makes the first send() of every socket back to back (the first takes 0.1-0.15
ms, each next one 0.01-0.03 ms).

Why one thread polling non-blocking sockets and not a thread per socket: measured (2-core x86-64, Debian 12,
4 sockets on a loopback, 5 trials) the first sends of this loop came 118-232 us apart from first to last,
those of 4 threads each waking at the instant 209-785 us apart (the threads wake one by one and take the GIL
in turn). After the release a send() of SEND_BYTES to a full socket returns EAGAIN at once and poll() sleeps
until one has room, so one thread keeps every socket backlogged (two backlogged sockets on a loopback took
5.9 GB/s together from this loop, far above any emulated bottleneck). The process drops to SCHED_OTHER after
the release: a backlogged sender at real-time priority would starve the host's other work.

A flow ends at its end time or once its `bytes` are accepted (the log then says when the last byte was: its
sink's log says when that byte was read, the flow's completion); the socket is then shut down for writing
and the sender waits until the sink has read everything and closed, so the flow's packets are over when the
task is (as an iperf3 client's after its result exchange). Every loop is bounded by the flows' end times
and DRAIN_NS after the last.

Log (one JSON object, written at the end, LOG_FORMAT): per flow its local port, when it connected, when its
first send() began and returned and how much it took, the bytes accepted, when the last byte was accepted
(byte-limited flows), when it stopped sending, when its sink closed and any error.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from agents.appwriter import connect, realtime_priority, wait_until

LOG_FORMAT = "tcplab-bulk-log 1"
SEND_BYTES = 1 << 20          # one send() asks for this much; a non-blocking socket takes what fits
CONNECT_GRACE_NS = 2_000_000_000   # connecting may run this long past the start instant (then it is late)
DRAIN_NS = 1_500_000_000   # after the last end, wait this long at most for the sinks to read everything
                           # (the engine's bound on the passive tasks after the flows, bind.TAIL_NS)


@dataclass
class BulkFlow:
    """One flow of the sender: where it goes, how, and until when."""

    dst_addr: str
    port: int
    cc: str
    end_ns: int
    bytes: int = 0            # 0: no byte limit, send until end_ns
    nodelay: bool = False
    # filled in while it runs (the log)
    local_port: int = 0
    mss: int = 0              # TCP_MAXSEG once connected: the size of the first send()
    connected_ns: int = 0
    first_send_ns: int = 0    # CLOCK_REALTIME just before its first send()
    first_sent_ns: int = 0    # ... just after it returned
    first_accepted: int = 0
    sent: int = 0
    last_byte_ns: int | None = None   # a byte-limited flow: when send() took its last byte
    ended_ns: int = 0         # its last send() (then shutdown: FIN after what is queued)
    closed_ns: int = 0        # its sink closed (read everything), or the drain bound passed
    error: str = ""
    sock: socket.socket | None = field(default=None, repr=False)

    def wants(self) -> int:
        """How many bytes the next send() asks for."""
        return SEND_BYTES if not self.bytes else min(SEND_BYTES, self.bytes - self.sent)

    def log(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sock"}


def flow_arg(flow) -> str:
    """One flow (a BulkFlow here, schemas.tasks.BulkFlow on the agent) as one argv item (pure):
    dst_addr,port,cc,end_ns,bytes,nodelay; bytes 0 is no limit (an IPv6 address has no comma)."""
    return f"{flow.dst_addr},{flow.port},{flow.cc},{flow.end_ns},{flow.bytes or 0},{int(flow.nodelay)}"


def parse_flow(text: str) -> BulkFlow:
    """The inverse of flow_arg (pure); argparse's `type`."""
    try:
        dst, port, cc, end_ns, nbytes, nodelay = text.split(",")
        return BulkFlow(dst_addr=dst, port=int(port), cc=cc, end_ns=int(end_ns), bytes=int(nbytes),
                        nodelay=nodelay == "1")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"flow {text!r}: want dst,port,cc,end_ns,bytes,nodelay ({exc})") from exc


def send_some(flow: BulkFlow, payload: memoryview, at_most: int = SEND_BYTES) -> bool:
    """One non-blocking send() on the flow's socket; False once the flow is over (its bytes all accepted, or
    the connection failed). A byte-limited flow's last accepted byte is stamped here."""
    try:
        n = flow.sock.send(payload[:min(at_most, flow.wants())])
    except BlockingIOError:
        return True
    except OSError as exc:
        flow.error = f"send failed after {flow.sent} bytes: {exc}"
        return False
    flow.sent += n
    if flow.bytes and flow.sent >= flow.bytes:
        flow.last_byte_ns = time.time_ns()
        return False
    return True


def release(flows: list[BulkFlow], payload: memoryview) -> list[BulkFlow]:
    """The first send() of every flow, back to back, one segment each (the kernel transmits it inside the
    send(): a first send of a whole window would hold the next flow's first byte back for as long); returns
    the flows still sending."""
    active = []
    for f in flows:
        f.first_send_ns = time.time_ns()
        more = send_some(f, payload, f.mss)
        f.first_sent_ns = time.time_ns()
        f.first_accepted = f.sent
        if more:
            active.append(f)
    return active


def stop_sending(flow: BulkFlow, now_ns: int) -> None:
    """The flow's last send is made: FIN after what is queued (shutdown), the socket stays open to drain."""
    flow.ended_ns = now_ns
    try:
        flow.sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def close(flow: BulkFlow, now_ns: int) -> None:
    flow.closed_ns = now_ns
    flow.sock.close()


def keep_backlogged(flows: list[BulkFlow], payload: memoryview, drain_until_ns: int) -> None:
    """Send on whichever socket has room until each flow's end time or its byte count, then wait for its sink
    to close (it read everything: the packets of the flow are over, as after iperf3's result exchange, before
    the engine stops the captures). Flows already ended (ended_ns set) only drain. Bounded: poll never waits
    past the next end, and nothing waits past drain_until_ns."""
    poller = select.poll()
    sending = {f.sock.fileno(): f for f in flows if not f.ended_ns}
    draining = {f.sock.fileno(): f for f in flows if f.ended_ns}
    for fd in sending:
        poller.register(fd, select.POLLOUT)
    for fd in draining:
        poller.register(fd, select.POLLIN)

    def drain(fd: int, now: int) -> None:
        stop_sending(sending[fd], now)
        draining[fd] = sending.pop(fd)
        poller.modify(fd, select.POLLIN)

    while (sending or draining) and time.time_ns() < drain_until_ns:
        now = time.time_ns()
        for fd in [fd for fd, f in sending.items() if now >= f.end_ns]:
            drain(fd, now)
        wait_ns = min([f.end_ns for f in sending.values()] + [drain_until_ns]) - now
        for fd, events in poller.poll(max(0, -(-wait_ns // 1_000_000))):
            if fd in draining:            # readable: the sink closed (EOF), or the connection failed
                poller.unregister(fd)
                close(draining.pop(fd), time.time_ns())
                continue
            f = sending[fd]
            if events & (select.POLLERR | select.POLLHUP):
                f.error = f.error or f"connection closed after {f.sent} bytes"
            if f.error or not send_some(f, payload):
                drain(fd, time.time_ns())
    now = time.time_ns()
    for f in [*sending.values(), *draining.values()]:   # past the drain bound: give up waiting
        if not f.ended_ns:
            stop_sending(f, now)
        close(f, now)


def run(args: argparse.Namespace) -> int:
    sched = realtime_priority()
    wait_until(args.connect_ns, 0)
    flows: list[BulkFlow] = args.flow
    for f in flows:
        f.sock = connect(f.dst_addr, f.port, f.cc, f.nodelay, args.first_ns + CONNECT_GRACE_NS, "bulksend")
        f.connected_ns = time.time_ns()
        f.local_port = f.sock.getsockname()[1]
        f.mss = f.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        f.sock.setblocking(False)
    payload = memoryview(b"\0" * SEND_BYTES)
    wait_until(args.first_ns)
    woke_ns = time.time_ns()
    active = {id(f) for f in release(flows, payload)}
    for f in flows:
        if id(f) not in active:
            stop_sending(f, time.time_ns())
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))   # the release was the timed part
    except (OSError, AttributeError):
        pass
    keep_backlogged(flows, payload, max(f.end_ns for f in flows) + DRAIN_NS)
    log = {"format": LOG_FORMAT, "role": "bulk-sender", "sched": sched, "connect_ns": args.connect_ns,
           "first_ns": args.first_ns, "woke_ns": woke_ns, "flows": [f.log() for f in flows]}
    args.out.write_text(json.dumps(log, sort_keys=True) + "\n")
    errors = [f"port {f.port}: {f.error}" for f in flows if f.error]
    if errors:
        print("bulksend: " + "; ".join(errors), file=sys.stderr)
        return 3
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m agents.bulksend", description=__doc__.split("\n\n")[0])
    p.add_argument("--flow", type=parse_flow, action="append", required=True,
                   help="dst,port,cc,end_ns,bytes,nodelay (bytes 0: until end_ns)")
    p.add_argument("--connect-ns", type=int, required=True)
    p.add_argument("--first-ns", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if not all(args.connect_ns <= args.first_ns < f.end_ns for f in args.flow):
        p.error("needs connect_ns <= first_ns < every flow's end_ns")
    return args


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
