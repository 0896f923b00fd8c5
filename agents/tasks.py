"""Scheduled measurement and traffic tasks, each started at an absolute CLOCK_REALTIME time.

One class per task kind, one small interface: `argv()/prepare` (pure or cheap) -> `run()` (the effect,
awaited as an asyncio task) -> `artifacts()` (files it produced, with metadata). Every helper process is
the agent's own child, stopped by pid, and killed by the kernel if the agent dies (agents/children.py).
"""
from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from agents.children import spawn
from agents.host.argv import tc_handle
from agents.host.capabilities import tracefs_root
from schemas import procs, protocol
from schemas.qdiscs import decoded_xstats


async def sleep_until(t_ns: int) -> None:
    delay = (t_ns - time.time_ns()) / 1e9
    if delay > 0:
        await asyncio.sleep(delay)


def realtime_minus_mono_ns() -> int:
    """Offset to convert trace-clock `mono` stamps to CLOCK_REALTIME (sampled at start and end)."""
    a = time.clock_gettime_ns(time.CLOCK_REALTIME)
    m = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    b = time.clock_gettime_ns(time.CLOCK_REALTIME)
    return (a + b) // 2 - m


class TaskRunner:
    kind = ""

    def __init__(self, spec: Any, run_dir: Path):
        self.spec = spec
        self.run_dir = run_dir
        self.state = "scheduled"
        self.detail = ""
        self.guard: str | None = None   # the guard a remark on a finished task belongs to
        self.meta: dict[str, Any] = {}
        self.stop_event = asyncio.Event()

    @property
    def task_id(self) -> str:
        return self.spec.task_id

    async def run(self) -> None:
        await sleep_until(self.spec.start_ns)
        self.state = "running"
        try:
            await self.execute()
            self.state = "done"
        except OSError as exc:
            self.state, self.detail = "failed", (self._no_space() if exc.errno == errno.ENOSPC
                                                 else f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # the failure is reported to the manager through status/collect
            self.state, self.detail = "failed", f"{type(exc).__name__}: {exc}"
        # a tool writing its artifact may ignore a failed write (tcpdump does): a full artifacts filesystem
        # after the task means the artifact is truncated, whatever the tool said
        if self.state == "done" and self.out_name and artifacts_disk_full(self.run_dir):
            self.state, self.guard, self.detail = "failed", None, self._no_space()

    def _no_space(self) -> str:
        path = self.run_dir / self.out_name if self.out_name else self.run_dir
        size = path.stat().st_size if path.is_file() else 0
        return (f"no space left on device: the artifacts filesystem of {self.run_dir} is full; "
                f"{path.name} is truncated at {size} bytes")

    async def execute(self) -> None:
        raise NotImplementedError

    out_name = ""
    artifact_kind = ""

    def artifacts(self) -> list[tuple[Path, str]]:
        path = self.run_dir / self.out_name
        return [(path, self.artifact_kind or self.kind)] if self.out_name and path.exists() else []

    def status(self) -> protocol.TaskStatus:
        return protocol.TaskStatus(task_id=self.task_id, kind=self.kind, state=self.state, detail=self.detail,
                                   guard=self.guard)


DISK_FULL_BYTES = 64 * 1024


def artifacts_disk_full(path: Path) -> bool:
    """Whether the filesystem holding `path` has less than DISK_FULL_BYTES left for the agent."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < DISK_FULL_BYTES


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


class Iperf3Client(_ProcessTask):
    kind = "iperf3_client"

    @property
    def out_name(self) -> str:
        return f"iperf3-client-{self.spec.port}.json"

    def argv(self) -> list[str]:
        s = self.spec
        argv = ["iperf3", "-c", s.dst_addr, "-p", str(s.port), "-J", "-i", f"{s.interval_s:g}",
                "--connect-timeout", "3000"]
        argv += ["-n", str(s.bytes)] if s.bytes else ["-t", f"{s.duration_s:g}"]
        argv += ["-u", "-b", str(s.udp_rate_bit)] if s.udp_rate_bit else ["-C", s.cc]
        return argv + (["-N"] if s.nodelay else [])

    async def execute(self) -> None:
        await super().execute()
        # iperf3 3.12 -J exits 0 on errors: they are only in the JSON. A flow that never sent fails the
        # run; one that sent and then lost its server (e.g. stopped at the run's end after a late start)
        # is a flag on the run: its packets are real, its iperf3 summary is missing
        error, sent = iperf3_json_error((self.run_dir / self.out_name).read_bytes())
        where = f"iperf3 -c {self.spec.dst_addr} -p {self.spec.port}"
        if error and not sent and not self.stop_event.is_set():
            raise RuntimeError(f"{where}: {error}")
        if error:
            self.detail = f"{where} ended abnormally after sending: {error}"


def iperf3_json_error(data: bytes) -> tuple[str | None, bool]:
    """(`error`, whether any interval was reported) of an iperf3 -J document; (None, False) if not JSON
    (ingest names that)."""
    try:
        doc = json.loads(data)
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
        return ["tcpdump", "-i", s.interface, "-n", "-s", str(s.snaplen), "--time-stamp-precision", "nano",
                "-B", str(s.buffer_kib), "-w", str(self.run_dir / self.out_name)]

    async def execute(self) -> None:
        proc = await spawn(self.argv(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        first = await asyncio.wait_for(proc.stderr.readline(), 10)  # "listening on IF ..." = capturing
        self.meta["started_ns"] = time.time_ns()
        self.meta["banner"] = first.decode(errors="replace").strip()
        await sleep_until(self.spec.stop_ns)
        await procs.terminate(proc)
        rest = (await proc.stderr.read()).decode(errors="replace")
        self.meta.update({"interface": self.spec.interface, "snaplen": self.spec.snaplen,
                          **parse_capture_stats(rest)})
        lost = self.meta.get("received_by_filter", 0) - self.meta.get("captured", 0)
        if self.meta.get("dropped_by_kernel", 0) > 0 or lost > 0:
            self.guard = "G-CAPTURE"
            self.detail = (f"capture incomplete: {self.meta.get('dropped_by_kernel', 0)} dropped by "
                           f"kernel, {max(lost, 0)} received but not written")


class TcpProbe(TaskRunner):
    """A private tracefs instance with tcp:tcp_probe filtered on the run's ports (events are global)."""

    kind = "tcp_probe"
    out_name = "tcp_probe.trace"

    def filter_expr(self) -> str:
        return " || ".join(f"sport == {p} || dport == {p}" for p in self.spec.ports)

    async def execute(self) -> None:
        root = tracefs_root()
        if root is None:
            raise RuntimeError("tracefs is not mounted")
        inst = root / "instances" / f"tcplab-{os.getpid()}-{self.task_id}"
        inst.mkdir()
        try:
            (inst / "buffer_size_kb").write_text(str(self.spec.buffer_kib))
            (inst / "trace_clock").write_text("mono")
            ev = inst / "events/tcp/tcp_probe"
            (ev / "filter").write_text(self.filter_expr())
            self.meta["offset_start_ns"] = realtime_minus_mono_ns()
            (ev / "enable").write_text("1")
            await sleep_until(self.spec.stop_ns)
            (ev / "enable").write_text("0")
            self.meta["offset_end_ns"] = realtime_minus_mono_ns()
            self.meta["trace_clock"] = "mono"
            (self.run_dir / self.out_name).write_bytes((inst / "trace").read_bytes())
            overruns = re.search(r"overrun: (\d+)", (inst / "per_cpu/cpu0/stats").read_text())
            self.meta["overrun_cpu0"] = int(overruns.group(1)) if overruns else None
        finally:
            inst.rmdir()


QDISC_CSV_HEADER = "ts_ns,handle,parent,kind,bytes,packets,drops,overlimits,requeues,backlog_bytes,qlen\n"


class QdiscStats(TaskRunner):
    """Samples every qdisc on one interface over netlink at a fixed interval (a thread keeps the beat)."""

    kind = "qdisc_stats"

    @property
    def out_name(self) -> str:
        return f"qdisc-{self.spec.interface}.csv"

    def _poll(self) -> None:
        from pyroute2 import IPRoute

        interval = self.spec.interval_ms * 1_000_000
        lines = [QDISC_CSV_HEADER]
        xstats: dict[str, dict] = {}
        with IPRoute() as ipr:
            idx = ipr.link_lookup(ifname=self.spec.interface)[0]
            nxt = time.time_ns()
            while nxt < self.spec.stop_ns:
                ts = time.time_ns()
                for q in ipr.get_qdiscs(index=idx):
                    if (x := decoded_xstats(q.get_attr("TCA_KIND"), q.get_attr("TCA_XSTATS"))) is not None:
                        xstats[tc_handle(q["handle"])] = x
                    st = q.get_attr("TCA_STATS2")
                    basic, queue = st.get_attr("TCA_STATS_BASIC"), st.get_attr("TCA_STATS_QUEUE")
                    parent = "root" if q["parent"] == 0xFFFFFFFF else tc_handle(q["parent"])
                    lines.append(f"{ts},{tc_handle(q['handle'])},{parent},{q.get_attr('TCA_KIND')},"
                                 f"{basic['bytes']},{basic['packets']},{queue['drops']},"
                                 f"{queue['overlimits']},{queue['requeues']},{queue['backlog']},"
                                 f"{queue['qlen']}\n")
                nxt += interval
                time.sleep(max(0.0, (nxt - time.time_ns()) / 1e9))
        (self.run_dir / self.out_name).write_text("".join(lines))
        self.meta["samples"] = len(lines) - 1
        if xstats:   # tcplab's own kinds: their counters as of the last sample (aqm_mark: marked, not_ect, ...)
            self.meta["xstats"] = xstats

    async def execute(self) -> None:
        await asyncio.to_thread(self._poll)


def ss_argv(ports: list[int], dst_addrs: list[str]) -> list[str]:
    """`ss -tinH` with a filter on the peers, as separate argv words (ss joins them into its filter):
    ( dport = :P or ... ) [and ( dst A or dst [V6] ... )]. -n keeps rates as integer bit/s."""
    def any_of(terms: list[list[str]]) -> list[str]:
        words = [w for i, t in enumerate(terms) for w in (["or"] if i else []) + t]
        return ["(", *words, ")"]

    argv = ["ss", "-tinH", *any_of([["dport", "=", f":{int(p)}"] for p in ports])]
    addrs = [f"[{a}]" if ":" in a else a for a in dst_addrs]   # ss wants IPv6 in brackets
    return argv + (["and", *any_of([["dst", a] for a in addrs])] if dst_addrs else [])


def skipped_before(first_ns: int, skip: int, interval_ns: int, stop_ns: int) -> int:
    """How many of `skip` slots from first_ns on (every interval_ns) fall before stop_ns: a poll that overran
    the end of the sampling does not count slots that never were to be polled as missed."""
    if first_ns >= stop_ns:
        return 0
    return min(skip, (stop_ns - first_ns - 1) // interval_ns + 1)


class SsSample(TaskRunner):
    """Polls `ss -tinH` every interval_ms until stop_ns. The artifact is each poll's literal output
    after a line `@ <start_ns> <end_ns>` (CLOCK_REALTIME before the poll began and after ss exited),
    appended as it comes (memory stays one poll). Parsed by orchestrator/ingest/ss.py. A poll that
    overruns its slot skips the slots it overran (counted in meta `missed`), it never queues up."""

    kind = "ss_sample"
    artifact_kind = "ss"
    out_name = "ss.txt"
    poll_timeout_s = 5.0

    def argv(self) -> list[str]:
        return ss_argv(self.spec.ports, self.spec.dst_addrs)

    async def _poll(self, argv: list[str]) -> tuple[int, int, bytes]:
        a = time.time_ns()
        proc = await spawn(argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.poll_timeout_s)
        except TimeoutError:
            await procs.terminate(proc)
            raise RuntimeError(f"ss did not answer within {self.poll_timeout_s:g} s") from None
        b = time.time_ns()
        if proc.returncode != 0:
            raise RuntimeError(f"ss exited {proc.returncode}: {err.decode(errors='replace').strip()[-300:]}")
        return a, b, out

    async def execute(self) -> None:
        argv, interval = self.argv(), self.spec.interval_ms * 1_000_000
        polls = missed = max_span = 0
        self.meta["argv"] = argv
        with open(self.run_dir / self.out_name, "wb") as fh:
            fh.write(f"# {' '.join(argv)}\n".encode())
            nxt = time.time_ns()
            while nxt < self.spec.stop_ns and not self.stop_event.is_set():
                a, b, out = await self._poll(argv)
                fh.write(f"@ {a} {b}\n".encode() + out)
                polls, max_span = polls + 1, max(max_span, b - a)
                nxt += interval
                now = time.time_ns()
                if now >= nxt:
                    skip = (now - nxt) // interval + 1
                    missed += skipped_before(nxt, skip, interval, self.spec.stop_ns)
                    nxt += skip * interval
                try:
                    await asyncio.wait_for(self.stop_event.wait(), (min(nxt, self.spec.stop_ns) - now) / 1e9)
                except TimeoutError:
                    pass
        self.meta.update({"polls": polls, "missed": missed, "max_span_ns": max_span,
                          "interval_ms": self.spec.interval_ms})


class CpuLoad(TaskRunner):
    """Samples the per-CPU lines of /proc/stat every interval_ms until stop_ns (a thread keeps the beat; a
    read costs tens of µs, no process is spawned). The artifact is literal: a header with the clock tick
    (USER_HZ), then per sample `@ <CLOCK_REALTIME ns>` and the `cpuN` lines as the kernel printed them.
    Parsed by orchestrator/ingest/cpu.py for M-CPU and the G-CPULOAD guard."""

    kind = "cpu_load"
    artifact_kind = "cpu"
    out_name = "cpu.txt"

    def _poll(self) -> None:
        interval = self.spec.interval_ms * 1_000_000
        samples = 0
        with open(self.run_dir / self.out_name, "w") as out, open("/proc/stat") as stat:
            out.write(f"# /proc/stat per-CPU lines, USER_HZ={os.sysconf('SC_CLK_TCK')}\n")
            nxt = time.time_ns()
            while nxt <= self.spec.stop_ns + interval and not self.stop_event.is_set():
                ts = time.time_ns()
                stat.seek(0)
                lines = [ln for ln in stat.read().splitlines() if ln.startswith("cpu") and ln[3:4].isdigit()]
                out.write(f"@ {ts}\n" + "\n".join(lines) + "\n")
                samples += 1
                nxt += interval
                time.sleep(max(0.0, (nxt - time.time_ns()) / 1e9))
        self.meta.update({"samples": samples, "interval_ms": self.spec.interval_ms})

    async def execute(self) -> None:
        await asyncio.to_thread(self._poll)


RUNNERS: dict[str, type[TaskRunner]] = {
    "iperf3_server": Iperf3Server, "iperf3_client": Iperf3Client, "capture": Capture,
    "tcp_probe": TcpProbe, "qdisc_stats": QdiscStats, "ss_sample": SsSample, "cpu_load": CpuLoad,
}


def make_runner(spec: Any, run_dir: Path) -> TaskRunner:
    return RUNNERS[spec.kind](spec, run_dir)


