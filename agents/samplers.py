"""Periodic samplers scheduled by the manager (agents/tasks.py registers them): the tcp:tcp_probe tracepoint
and an interface's queue tracepoints in private tracefs instances, qdisc counters over netlink, `ss -tin` polls
and the CPU load. Each writes one artifact whose rows carry CLOCK_REALTIME (or the offsets to it)."""
from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

from agents.children import spawn
from agents.host.argv import tc_handle
from agents.host.capabilities import instance_name, tracefs_root
from agents.taskbase import TaskRunner, missed_remark, next_beat, realtime_minus_mono_ns
from schemas import procs
from schemas.qdiscs import decoded_xstats


class _TraceInstance(TaskRunner):
    """Tracepoints recorded in a private tracefs instance (events are global: every agent on a kernel shares
    them) with trace_clock mono, from start to stop; the instance's `trace` text is the artifact, with the
    realtime - mono offsets at both ends in its meta."""

    instance_kind = ""

    def events(self) -> list[tuple[str, str]]:
        """(events/<system>/<event> path, filter) of every tracepoint the task enables."""
        raise NotImplementedError

    async def execute(self) -> None:
        root = tracefs_root()
        if root is None:
            raise RuntimeError("tracefs is not mounted")
        inst = root / "instances" / instance_name(self.instance_kind, self.task_id)
        inst.mkdir()
        saving = None
        try:
            (inst / "buffer_size_kb").write_text(str(self.spec.buffer_kib))
            (inst / "trace_clock").write_text("mono")
            events = [(inst / "events" / path, expr) for path, expr in self.events()]
            for ev, expr in events:
                (ev / "filter").write_text(expr)
            self.meta["offset_start_ns"] = realtime_minus_mono_ns()
            for ev, _ in events:
                (ev / "enable").write_text("1")
            self.meta["ready_ns"] = time.time_ns()
            await self.until_stop(self.spec.stop_ns)
            for ev, _ in events:
                (ev / "enable").write_text("0")
            self.meta["offset_end_ns"] = realtime_minus_mono_ns()
            self.meta["trace_clock"] = "mono"
            # the kernel formats every event as it is read (a 5 s run: ~35k events, 10 MB, 0.1-0.2 s): off the
            # agent's event loop, so its other tasks and the manager's status polls are answered meanwhile; the
            # thread also removes the instance, so a cancel cannot remove it while `trace` is still open
            saving = asyncio.ensure_future(asyncio.to_thread(self._save_and_remove, inst))
            await asyncio.shield(saving)
        finally:
            if saving is None:
                inst.rmdir()

    def _save_and_remove(self, inst) -> None:
        try:
            (self.run_dir / self.out_name).write_bytes((inst / "trace").read_bytes())
            overruns = re.search(r"overrun: (\d+)", (inst / "per_cpu/cpu0/stats").read_text())
            self.meta["overrun_cpu0"] = int(overruns.group(1)) if overruns else None
        finally:
            inst.rmdir()


class TcpProbe(_TraceInstance):
    """tcp:tcp_probe filtered on the run's ports."""

    kind = "tcp_probe"
    instance_kind = "tp"
    out_name = "tcp_probe.trace"

    def filter_expr(self) -> str:
        """The sender's sockets only: `ports` are the flows' receiver ports, so dport == port. On one kernel
        (the netns lab, a hybrid VM lab) the receiver's own socket (sport == port) fires too, on every data
        segment -- 64 % of a 2-flow quickstart run's events, which the analysis never reads (docs/metrics.md)."""
        return " || ".join(f"dport == {p}" for p in self.spec.ports)

    def events(self) -> list[tuple[str, str]]:
        return [("tcp/tcp_probe", self.filter_expr())]


class QueueTrace(_TraceInstance):
    """net:net_dev_queue (an skb enters the interface's qdisc chain), qdisc:qdisc_dequeue (the chain's root
    hands it on) and net:net_dev_xmit (the driver took a packet) on one interface: M-QDELAY where the bottleneck
    is the sender's own egress, ahead of any capture (orchestrator/ingest/egress_qdelay.py)."""

    kind = "queue_trace"
    instance_kind = "qt"

    @property
    def out_name(self) -> str:
        return f"queue-trace-{self.spec.interface}.trace"

    def events(self) -> list[tuple[str, str]]:
        # the interface name is schema-checked (no quotes or spaces): it cannot break out of the filter
        match = f'name == "{self.spec.interface}"'
        ifindex = int((Path("/sys/class/net") / self.spec.interface / "ifindex").read_text(encoding="ascii")[:16])
        return [("net/net_dev_queue", match), ("qdisc/qdisc_dequeue", f"ifindex == {ifindex} && packets > 0"),
                ("net/net_dev_xmit", match)]


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
        last_xstats: dict[str, tuple[str, object]] = {}    # handle -> (kind, raw TCA_XSTATS) of the last sample
        polls = missed = 0
        with IPRoute() as ipr:
            idx = ipr.link_lookup(ifname=self.spec.interface)[0]
            nxt = time.time_ns()
            while nxt < self.spec.stop_ns and not self.stop_event.is_set():
                ts = time.time_ns()
                polls += 1
                for q in ipr.get_qdiscs(index=idx):
                    handle, kind = tc_handle(q["handle"]), q.get_attr("TCA_KIND")
                    last_xstats[handle] = (kind, q.get_attr("TCA_XSTATS"))
                    st = q.get_attr("TCA_STATS2")
                    basic, queue = st.get_attr("TCA_STATS_BASIC"), st.get_attr("TCA_STATS_QUEUE")
                    parent = "root" if q["parent"] == 0xFFFFFFFF else tc_handle(q["parent"])
                    lines.append(f"{ts},{handle},{parent},{kind},"
                                 f"{basic['bytes']},{basic['packets']},{queue['drops']},"
                                 f"{queue['overlimits']},{queue['requeues']},{queue['backlog']},"
                                 f"{queue['qlen']}\n")
                nxt, overran = next_beat(nxt, time.time_ns(), interval, self.spec.stop_ns)
                missed += overran
                self.stop_flag.wait(max(0.0, (min(nxt, self.spec.stop_ns) - time.time_ns()) / 1e9))
        (self.run_dir / self.out_name).write_text("".join(lines))
        self.meta.update({"samples": len(lines) - 1, "polls": polls, "missed": missed})
        self.detail = missed_remark(polls, missed, self.spec.interval_ms)
        # decoded once, from the last sample (not at every poll)
        xstats = {h: x for h, (kind, raw) in last_xstats.items() if (x := decoded_xstats(kind, raw)) is not None}
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
                now = time.time_ns()
                nxt, overran = next_beat(nxt, now, interval, self.spec.stop_ns)
                missed += overran
                try:
                    await asyncio.wait_for(self.stop_event.wait(), (min(nxt, self.spec.stop_ns) - now) / 1e9)
                except TimeoutError:
                    pass
        self.meta.update({"polls": polls, "missed": missed, "max_span_ns": max_span,
                          "interval_ms": self.spec.interval_ms})
        self.detail = missed_remark(polls, missed, self.spec.interval_ms)


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
                self.stop_flag.wait(max(0.0, (nxt - time.time_ns()) / 1e9))
        self.meta.update({"samples": samples, "interval_ms": self.spec.interval_ms})

    async def execute(self) -> None:
        await asyncio.to_thread(self._poll)
