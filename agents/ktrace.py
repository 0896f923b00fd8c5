"""The kernel_trace task: kernel-side timing in a private tracefs instance (docs/plans.md#kernel_trace).

Events are global across network namespaces and every agent on a kernel shares tracefs, so the task works in
its own instance (`instances/<prefix>-kt-<pid>-<task>`, trace_clock mono) and creates kprobe/kretprobe events
under names no one else uses (schemas/ktrace.py event_base). It removes exactly what it created -- its events
and its instance -- when the run ends, when it is stopped (reset) and when it fails. Every string it writes
is built by schemas/ktrace.py from schema-valid fields; every read is bounded (MAX_ARTIFACT_BYTES a section).

The instance's buffer is read twice once tracing stopped (`trace` is not consumed by a read): as text
(tracepoints with their fields, trace_printk) and with options/raw (`pid cpu ts_ns type: ID`: the probe
events with nanosecond stamps; the text form stamps microseconds). trace_printk output goes to the top-level
buffer unless the kernel has the instance option trace_printk_dest (Linux 6.12+); without it the agent reads
the top-level buffer as is (its clock unchanged) and writes a `tcplab-sync <mono ns>` line to trace_marker at
the start and the end, from which the ingest maps that clock to the run's."""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from pathlib import Path
from typing import BinaryIO

from agents.host.capabilities import instance_name, tracefs_root
from agents.taskbase import TaskRunner, realtime_minus_mono_ns
from schemas import ktrace


def copy_bounded(src: Path, out: BinaryIO, limit: int = ktrace.MAX_ARTIFACT_BYTES) -> tuple[int, bool]:
    """Copy a tracefs file into the artifact, at most `limit` bytes; (bytes, truncated)."""
    n, last = 0, b"\n"
    with open(src, "rb") as f:
        while chunk := f.read(min(1 << 20, limit + 1 - n)):
            if n + len(chunk) > limit:
                out.write(chunk[:limit - n] + b"\n")
                return limit, True
            out.write(chunk)
            n, last = n + len(chunk), chunk[-1:]
    if last != b"\n":
        out.write(b"\n")   # a section always ends with a whole line
    return n, False


def append_line(path: Path, line: str) -> None:
    """One write with O_APPEND and without O_TRUNC: kprobe_events truncated would drop every other user's
    events. (Python's "a" mode also seeks to the end, which tracefs refuses with EINVAL.)"""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


OVERRUN = re.compile(r"^overrun: (\d+)$", re.MULTILINE)


def overruns(inst: Path, max_cpus: int = 4096) -> int:
    """Events the instance's ring buffer overwrote (lost), summed over its CPUs (per_cpu/cpuN/stats)."""
    total = 0
    for stats in sorted((inst / "per_cpu").glob("cpu*/stats"))[:max_cpus]:
        m = OVERRUN.search(stats.read_text())
        total += int(m.group(1)) if m else 0
    return total


def selected_clock(text: str) -> str:
    """`local [global] mono` -> `global` (the bracketed one of a trace_clock file)."""
    m = re.search(r"\[([a-z0-9_-]+)\]", text)
    return m.group(1) if m else "unknown"


PROFILE_LINE = re.compile(r"^\s*(\S+)\s+(\d+)\s+(\d+)\s*$")


def probe_counts(profile: str, names: set[str]) -> dict[str, dict[str, int]]:
    """kprobe_profile lines of our events: name -> hits, misses (a kretprobe out of instances misses calls)."""
    out = {}
    for line in profile.splitlines()[:100_000]:
        m = PROFILE_LINE.match(line)
        if m and m.group(1).split("/")[-1] in names:
            out[m.group(1).split("/")[-1]] = {"hits": int(m.group(2)), "misses": int(m.group(3))}
    return out


class KernelTrace(TaskRunner):
    kind = "kernel_trace"
    out_name = ktrace.ARTIFACT_NAME

    def _write(self, path: Path, text: str) -> None:
        with open(path, "w") as f:   # one write: tracefs parses each write as a whole
            f.write(text)

    def _create_probes(self, root: Path) -> list[tuple[int, str, str]]:
        """Create the kprobe/kretprobe pairs; (type id, kind, symbol) of each. Created names go to self.created
        as they are made, so a failure half-way still removes the ones that exist."""
        if not (root / "kprobe_events").exists():
            raise RuntimeError(f"kernel {os.uname().release} has no kprobe_events (CONFIG_KPROBE_EVENTS)")
        base = ktrace.event_base(os.getpid(), self.task_id)
        probes = []
        for (name, line, kind), sym in zip(ktrace.kprobe_definitions(base, list(self.spec.kprobes)),
                                           [s for s in self.spec.kprobes for _ in (0, 1)], strict=True):
            append_line(root / "kprobe_events", line)
            self.created.append(name)
            tid = int((root / "events" / ktrace.EVENT_GROUP / name / "id").read_text())
            probes.append((tid, kind, sym))
        return probes

    def _remove_probes(self, root: Path) -> None:
        for name in reversed(self.created):
            try:
                append_line(root / "kprobe_events", ktrace.kprobe_removal(name))
                self.created.remove(name)
            except OSError as exc:
                self.meta.setdefault("remove_errors", []).append(f"{name}: {exc}")

    def _marker(self, root: Path, which: str) -> tuple[str, int]:
        mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self._write(root / "trace_marker", f"{ktrace.SYNC_MARKER} {mono}\n")
        return which, mono

    def _setup(self, root: Path, inst: Path) -> tuple[list[tuple[int, str, str]], bool]:
        s = self.spec
        self._write(inst / "buffer_size_kb", str(s.buffer_kib))
        self._write(inst / "trace_clock", "mono")
        probes = self._create_probes(root) if s.kprobes else []
        own_printk = s.trace_printk and (inst / "options/trace_printk_dest").exists()
        if own_printk:
            self._write(inst / "options/trace_printk_dest", "1")
        for tp in s.tracepoints:
            d = inst / ktrace.tracepoint_dir(tp)
            if not d.is_dir():
                raise RuntimeError(f"kernel {os.uname().release} has no tracepoint {tp}")
            if tp in s.filters:
                self._write(d / "filter", ktrace.filter_text(s.filters[tp]))
        return probes, own_printk

    def _enable(self, inst: Path, on: bool) -> None:
        dirs = [inst / ktrace.tracepoint_dir(tp) for tp in self.spec.tracepoints]
        dirs += [inst / "events" / ktrace.EVENT_GROUP / name for name in self.created]
        for d in dirs:
            self._write(d / "enable", "1" if on else "0")

    def _read_out(self, root: Path, inst: Path, probes, offsets, syncs) -> None:
        sizes, truncated = {}, []
        with open(self.run_dir / self.out_name, "wb") as out:
            out.write("".join(ktrace.header_lines(probes, offsets)).encode())
            out.write("".join(f"#@ sync {w} {v}\n" for w, v in syncs).encode())
            sections = [("text mono", inst / "trace", None)]
            if probes:
                sections.append(("raw mono", inst / "trace", inst / "options/raw"))
            if syncs:
                sections.append((f"printk {selected_clock((root / 'trace_clock').read_text())}", root / "trace", None))
            for title, path, raw_option in sections:
                if raw_option is not None:
                    self._write(raw_option, "1")
                out.write(f"#@ section {title}\n".encode())
                sizes[title], cut = copy_bounded(path, out)
                if cut:
                    truncated.append(title)
        self.meta.update({"section_bytes": sizes, "truncated": truncated})

    def _cleanup(self, root: Path, inst: Path) -> None:
        if inst.is_dir():
            with contextlib.suppress(OSError):
                self._enable(inst, False)
            try:
                inst.rmdir()
            except OSError as exc:
                self.meta.setdefault("remove_errors", []).append(f"instance {inst.name}: {exc}")
        self._remove_probes(root)

    async def execute(self) -> None:
        root = tracefs_root()
        if root is None:
            raise RuntimeError("tracefs is not mounted")
        inst = root / "instances" / instance_name("kt", self.task_id)
        self.created: list[str] = []
        inst.mkdir()
        try:
            probes, own_printk = self._setup(root, inst)
            top_printk = self.spec.trace_printk and not own_printk
            syncs = [self._marker(root, "start")] if top_printk else []
            offsets = [("start", realtime_minus_mono_ns())]
            self._enable(inst, True)
            waiter = asyncio.ensure_future(self.stop_event.wait())
            await asyncio.wait({waiter}, timeout=max(0.0, (self.spec.stop_ns - time.time_ns()) / 1e9))
            waiter.cancel()
            self._write(inst / "tracing_on", "0")
            offsets.append(("end", realtime_minus_mono_ns()))
            if top_printk:
                syncs.append(self._marker(root, "end"))
            self._enable(inst, False)
            self.meta["overrun"] = overruns(inst)
            if self.created:
                self.meta["probe_counts"] = probe_counts((root / "kprobe_profile").read_text(), set(self.created))
            self.meta.update({"trace_clock": "mono", "trace_printk": "instance" if own_printk else
                              ("top-level" if top_printk else "off"), "events": len(probes)})
            await asyncio.to_thread(self._read_out, root, inst, probes, offsets, syncs)
        finally:
            self._cleanup(root, inst)
