"""Scheduled measurement and traffic tasks, each started at an absolute CLOCK_REALTIME time.

One class per task kind (the periodic samplers are agents/samplers.py, the common base
agents/taskbase.py), one small interface: `argv()/prepare` (pure or cheap) -> `run()` (the effect,
awaited as an asyncio task) -> `artifacts()` (files it produced, with metadata). Every helper process is
the agent's own child, stopped by pid, and killed by the kernel if the agent dies (agents/children.py).
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from agents.appflows import AppSink, AppWriter, BulkSender
from agents.children import spawn
from agents.events import EventRunner
from agents.ktrace import KernelTrace
from agents.samplers import CpuLoad, QdiscStats, QueueTrace, SsSample, TcpProbe
from agents.sockets import CLOSE_POLL_S, listening, open_connections, wait_for
from agents.taskbase import TaskRunner
from schemas import procs
from schemas.iperf3_output import split_leading_warnings
from schemas.tasks import iperf3_connect_timeout_ms


class _ProcessTask(TaskRunner):
    """A task that is one external process whose stdout goes to an artifact file."""

    timeout_s = 3600.0

    def argv(self) -> list[str]:
        raise NotImplementedError

    async def execute(self) -> None:
        out = self.run_dir / self.out_name
        with open(out, "wb") as fh:
            proc = await spawn(self.argv(), stdout=fh, stderr=asyncio.subprocess.PIPE)
            stopper = asyncio.ensure_future(self.stop_event.wait())
            waiter = asyncio.ensure_future(proc.wait())
            await asyncio.wait({stopper, waiter}, timeout=self.timeout_s,
                               return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            await procs.terminate(proc)
            stderr = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
        self.meta.update({"returncode": proc.returncode, "stderr": stderr[-2000:]})
        if proc.returncode not in (0, -15) and not self.stop_event.is_set():
            raise RuntimeError(f"{self.argv()[0]} exited {proc.returncode}: {stderr.strip()[-300:]}")


class Iperf3Server(_ProcessTask):
    kind = "iperf3_server"

    @property
    def out_name(self) -> str:
        return f"iperf3-server-{self.spec.port}.json"

    def argv(self) -> list[str]:
        return ["iperf3", "-s", "-1", "-J", "-p", str(self.spec.port)]

    async def execute(self) -> None:
        # when the port listens (ready_ns) tells the manager how long this host takes to get ready: the next
        # run's lead is sized from it (orchestrator/engine/timing.py)
        watch = asyncio.ensure_future(wait_for(lambda text: listening(text, self.spec.port), READY_WAIT_S))
        try:
            await super().execute()
        finally:
            ready = await watch if watch.done() else None
            watch.cancel()
        if ready is not None:
            self.meta["ready_ns"] = ready


class Iperf3Client(_ProcessTask):
    kind = "iperf3_client"

    @property
    def out_name(self) -> str:
        return f"iperf3-client-{self.spec.port}.json"

    def argv(self) -> list[str]:
        s = self.spec
        argv = ["iperf3", "-c", s.dst_addr, "-p", str(s.port), "-J", "-i", f"{s.interval_s:g}",
                "--connect-timeout", str(iperf3_connect_timeout_ms(s.duration_s))]
        argv += ["-n", str(s.bytes)] if s.bytes else ["-t", f"{s.duration_s:g}"]
        argv += ["-u", "-b", str(s.udp_rate_bit)] if s.udp_rate_bit else ["-C", s.cc]
        return argv + (["-N"] if s.nodelay else [])

    async def execute(self) -> None:
        # a server a loaded guest has not started listening yet refuses the connection: iperf3 gives up at
        # once, so the client tries again until CONNECT_GRACE_NS after its start and says how late it began
        retries = 0
        while True:
            began_ns = time.time_ns()
            await super().execute()
            error, sent = iperf3_json_error((self.run_dir / self.out_name).read_bytes())
            if not (retry_connect(error, sent, time.time_ns() - self.spec.start_ns) and not self.stop_event.is_set()):
                break
            retries += 1
            await asyncio.sleep(CONNECT_RETRY_S)
        # iperf3 3.12 -J exits 0 on errors: they are only in the JSON. A flow that never sent fails the
        # run; one that sent and then lost its server (e.g. stopped at the run's end after a late start)
        # is a flag on the run: its packets are real, its iperf3 summary is missing
        where = f"iperf3 -c {self.spec.dst_addr} -p {self.spec.port}"
        if retries:
            late_ms = (began_ns - self.spec.start_ns) / 1e6
            self.meta.update({"connect_retries": retries, "late_start_ms": round(late_ms, 1)})
            self.detail = (f"{where}: the server was not listening at the flow's start; connected after {retries} "
                           f"retries, {late_ms:.0f} ms late")
        if error and not sent and not self.stop_event.is_set():
            raise RuntimeError(f"{where}: {error}")
        if error:
            self.detail = f"{where} ended abnormally after sending: {error}"
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """The task ends when the flow's connections are closed on this host (gone or TIME_WAIT: the FINs of
        both sides sent and acknowledged), not when iperf3 exits: a socket closed with unsent data still
        drains through the bottleneck. The manager stops the captures after this (plus the path's delay),
        so the capture holds every flow's final FIN and ACK."""
        self.meta["exited_ns"] = time.time_ns()
        closed = await wait_for(lambda text: open_connections(text, self.spec.port) == 0, CLOSE_WAIT_S, CLOSE_POLL_S)
        if closed is None:
            self.meta["closed_ns"] = None
            self.meta["close_note"] = f"connections to port {self.spec.port} still open {CLOSE_WAIT_S:g} s after exit"
        else:
            self.meta["closed_ns"] = closed


READY_WAIT_S = 5.0      # how long a server's listening socket is looked for (its absence is only not reported)
CLOSE_WAIT_S = 3.0      # how long a client task waits for its flow's connections to close after iperf3 exits
CONNECT_GRACE_NS = 1_000_000_000
CONNECT_RETRY_S = 0.05


def retry_connect(error: str | None, sent: bool, since_start_ns: int) -> bool:
    """Whether an iperf3 client that ended with `error` should connect again: refused before it sent
    anything, within the grace after its start."""
    return bool(error) and not sent and "Connection refused" in error and since_start_ns < CONNECT_GRACE_NS


def iperf3_json_error(data: bytes) -> tuple[str | None, bool]:
    """(`error`, whether any interval was reported) of an iperf3 -J document; (None, False) if not JSON
    (ingest names that)."""
    try:
        doc = json.loads(split_leading_warnings(data.decode(errors="replace"))[1])
    except ValueError:
        return None, False
    if not isinstance(doc, dict):
        return None, False
    return doc.get("error"), bool(doc.get("intervals"))


CAPTURE_STATS = re.compile(r"^(\d+) packets? (captured|received by filter|dropped by kernel)", re.MULTILINE)


def parse_capture_stats(stderr: str) -> dict[str, int]:
    return {m.group(2).replace(" ", "_"): int(m.group(1)) for m in CAPTURE_STATS.finditer(stderr)}


class Capture(TaskRunner):
    kind = "capture"
    artifact_kind = "pcap"

    @property
    def out_name(self) -> str:
        return f"capture-{self.spec.interface}.pcap"

    def argv(self) -> list[str]:
        s = self.spec
        # --immediate-mode: libpcap then uses TPACKET_V2 (no TPACKET_V3 block held back until its 1 s timeout
        # retires it, and lost at SIGTERM), so a packet is written as it arrives and the run's tail needs no
        # second to flush the final ACKs and FINs
        return ["tcpdump", "-i", s.interface, "-n", "-s", str(s.snaplen), "--time-stamp-precision", "nano",
                "--immediate-mode", "-B", str(s.buffer_kib), "-w", str(self.run_dir / self.out_name)]

    async def execute(self) -> None:
        proc = await spawn(self.argv(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        first = await asyncio.wait_for(proc.stderr.readline(), 10)  # "listening on IF ..." = capturing
        self.meta["started_ns"] = self.meta["ready_ns"] = time.time_ns()
        self.meta["banner"] = first.decode(errors="replace").strip()
        await self.until_stop(self.spec.stop_ns)
        await procs.terminate(proc)
        rest = (await proc.stderr.read()).decode(errors="replace")
        self.meta.update({"interface": self.spec.interface, "snaplen": self.spec.snaplen,
                          **parse_capture_stats(rest)})
        lost = self.meta.get("received_by_filter", 0) - self.meta.get("captured", 0)
        if self.meta.get("dropped_by_kernel", 0) > 0 or lost > 0:
            self.guard = "G-CAPTURE"
            self.detail = (f"capture incomplete: {self.meta.get('dropped_by_kernel', 0)} dropped by "
                           f"kernel, {max(lost, 0)} received but not written")

RUNNERS: dict[str, type[TaskRunner]] = {
    "iperf3_server": Iperf3Server, "iperf3_client": Iperf3Client, "capture": Capture,
    "tcp_probe": TcpProbe, "queue_trace": QueueTrace, "qdisc_stats": QdiscStats, "ss_sample": SsSample,
    "cpu_load": CpuLoad,
    "kernel_trace": KernelTrace,
    "event": EventRunner,
    "app_writer": AppWriter, "app_sink": AppSink, "bulk_sender": BulkSender,
}


def make_runner(spec: Any, run_dir: Path) -> TaskRunner:
    return RUNNERS[spec.kind](spec, run_dir)
