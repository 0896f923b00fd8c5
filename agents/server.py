"""The agent daemon: a WebSocket server (websockets library) in front of the sans-I/O session and the
executors. Effects live here and in agents/host and agents/tasks; message rules live in session.py."""
from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from websockets.asyncio.server import ServerConnection

from agents.host.capabilities import probe
from agents.host.errors import NotAllowed, StateError
from agents.host.executor import HostStateExecutor
from agents.session import AgentSession, Dispatch, encode_error, encode_event, encode_result
from agents.tasks import TaskRunner, make_runner
from schemas import allowlist, protocol

log = logging.getLogger("tcplab.agent")
AGENT_VERSION = "0.1.0"
CHUNK = 256 * 1024
KEEP_RUNS = 3
# sysctls snapshotted at hello (evidence + reset baseline); others are snapshotted on first write
BASELINE_SYSCTLS = [
    "net.ipv4.tcp_ecn", "net.ipv4.tcp_ecn_fallback", "net.ipv4.tcp_sack", "net.ipv4.tcp_timestamps",
    "net.ipv4.tcp_no_metrics_save", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_mem",
    "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_pacing_ss_ratio", "net.ipv4.tcp_pacing_ca_ratio",
    "net.ipv4.tcp_limit_output_bytes", "net.ipv4.tcp_autocorking", "net.ipv4.tcp_fastopen",
    "net.ipv4.ip_forward", "net.core.rmem_max", "net.core.wmem_max",
]


class Agent:
    def __init__(self, name: str, token: bytes, interfaces: list[str], artifacts_root: Path,
                 allow_sysctl: list[str] | None = None, allow_module: list[str] | None = None):
        """`allow_sysctl`, `allow_module`: the testbed's --allow-sysctl/--allow-module values (none: the
        defaults of schemas/allowlist.py); a plan cannot widen them."""
        self.name, self.token = name, token
        self.interfaces = list(interfaces)
        self.artifacts_root = artifacts_root
        self.host = HostStateExecutor(
            self.interfaces,
            sysctl_prefixes=allowlist.expand_prefixes(allowlist.sysctl_prefixes(allow_sysctl or []), interfaces),
            modules=list(allowlist.modules(allow_module or [])))
        self.capabilities = probe(self.interfaces, self.host.sysctl_prefixes, self.host.modules)
        self.host.snapshot_now(BASELINE_SYSCTLS)
        self.applied = False
        self.run_id: str | None = None
        self.runners: list[TaskRunner] = []
        self.jobs: list[asyncio.Task] = []
        self.lock = asyncio.Lock()

    # ------------------------------------------------------------ connection loop
    async def handle(self, ws: ServerConnection) -> None:
        session = AgentSession(self.token)
        await ws.send(session.greeting())
        async for frame in ws:
            out = session.receive(frame)
            if isinstance(out, str):
                await ws.send(out)
            else:
                await self._dispatch(ws, out)
            if session.closed:
                break
        await ws.close()

    async def _dispatch(self, ws: ServerConnection, d: Dispatch) -> None:
        try:
            async with self.lock:
                result = await getattr(self, f"op_{d.op}")(d.args, ws)
            await ws.send(encode_result(d.id, d.op, result))
        except StateError as exc:
            log.warning("op failed host=%s run=%s op=%s error=%s", self.name, self.run_id, d.op, exc)
            await ws.send(encode_error(d.id, "failed", str(exc), field=exc.field, op=d.op))
        except _Refused as exc:
            await ws.send(encode_error(d.id, exc.code, str(exc), field=exc.field, op=d.op))
        except Exception as exc:  # reported to the manager, never swallowed
            log.exception("op crashed host=%s run=%s op=%s", self.name, self.run_id, d.op)
            await ws.send(encode_error(d.id, "failed", f"{type(exc).__name__}: {exc}", op=d.op))

    # ------------------------------------------------------------ ops
    async def op_hello(self, args: protocol.HelloArgs, ws) -> protocol.HelloResult:
        log.info("hello host=%s client=%s", self.name, args.client)
        if not self.applied:
            await asyncio.to_thread(self.host.snapshot_now, BASELINE_SYSCTLS)
        return protocol.HelloResult(agent_version=AGENT_VERSION, protocol=protocol.PROTOCOL_VERSION,
                                    hostname=socket.gethostname(), interfaces=self.interfaces,
                                    capabilities=self.capabilities)

    async def op_clock(self, args: protocol.ClockArgs, ws) -> protocol.ClockResult:
        t2 = time.time_ns()
        return protocol.ClockResult(t2_ns=t2, t3_ns=time.time_ns())

    async def op_apply(self, args: protocol.ApplyArgs, ws) -> protocol.ApplyResult:
        if self._active():
            raise _Refused("busy", f"run {self.run_id} still has tasks running")
        try:
            # refused whole before anything is written: off the allow-lists, or naming a sysctl this kernel lacks
            await asyncio.to_thread(self.host.check_allowed, args.state)
        except NotAllowed as exc:
            raise _Refused("refused", str(exc), field=exc.field) from exc
        self.applied = True
        log.info("apply host=%s run=%s", self.name, args.run_id)
        readback = await asyncio.to_thread(self.host.apply, args.state)
        return protocol.ApplyResult(readback=readback)

    async def op_schedule(self, args: protocol.ScheduleArgs, ws) -> protocol.ScheduleResult:
        if self._active():
            raise _Refused("busy", f"run {self.run_id} still has tasks running")
        for i, task in enumerate(args.tasks):
            dev = getattr(task, "interface", None)
            if dev is not None and dev not in self.interfaces:
                raise _Refused("refused", f"interface {dev!r} is not on the allow-list",
                               field=f"tasks.{i}.interface")
        run_dir = self.artifacts_root / args.run_id
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        self._prune_old_runs(keep=args.run_id)
        self.run_id = args.run_id
        self.runners = [make_runner(t, run_dir) for t in args.tasks]
        self.jobs = [asyncio.create_task(r.run()) for r in self.runners]
        log.info("schedule host=%s run=%s tasks=%d", self.name, args.run_id, len(self.runners))
        return protocol.ScheduleResult(accepted=[r.task_id for r in self.runners])

    async def op_status(self, args, ws) -> protocol.StatusResult:
        return protocol.StatusResult(run_id=self.run_id, tasks=[r.status() for r in self.runners])

    async def op_stop(self, args, ws) -> protocol.StatusResult:
        await self._stop_tasks()
        return await self.op_status(args, ws)

    async def op_collect(self, args: protocol.CollectArgs, ws) -> protocol.CollectResult:
        if args.run_id != self.run_id:
            raise _Refused("refused", f"no tasks for run {args.run_id}", field="run_id")
        if self.jobs:
            _, pending = await asyncio.wait(self.jobs, timeout=args.timeout_s)
            if pending:
                await self._stop_tasks()
        infos = []
        for runner in self.runners:
            for path, kind in runner.artifacts():
                info = protocol.ArtifactInfo(name=path.name, task_id=runner.task_id, kind=kind,
                                             size=path.stat().st_size, sha256=_sha256(path),
                                             meta=runner.meta)
                await ws.send(encode_event("artifact", info.model_dump(mode="json")))
                with open(path, "rb") as fh:
                    while chunk := fh.read(CHUNK):
                        await ws.send(chunk)
                infos.append(info)
        return protocol.CollectResult(run_id=args.run_id, artifacts=infos,
                                      tasks=[r.status() for r in self.runners])

    async def op_reset(self, args, ws) -> protocol.ResetResult:
        await self._stop_tasks()
        diffs = await asyncio.to_thread(self.host.reset)
        self.applied = False
        log.info("reset host=%s run=%s differences=%d", self.name, self.run_id, len(diffs))
        return protocol.ResetResult(restored=not diffs, differences=diffs)

    async def op_bye(self, args, ws) -> protocol.Empty:
        return protocol.Empty()

    # ------------------------------------------------------------ helpers
    def _active(self) -> bool:
        return any(not j.done() for j in self.jobs)

    async def _stop_tasks(self) -> None:
        for r in self.runners:
            r.stop_event.set()
        if self.jobs:
            await asyncio.wait(self.jobs, timeout=15)
        for j in self.jobs:
            if not j.done():
                j.cancel()

    def _prune_old_runs(self, keep: str) -> None:
        runs = sorted((p for p in self.artifacts_root.iterdir() if p.is_dir() and p.name != keep),
                      key=lambda p: p.stat().st_mtime)
        for old in runs[:-KEEP_RUNS] if len(runs) > KEEP_RUNS else []:
            shutil.rmtree(old, ignore_errors=True)

    async def shutdown(self) -> None:
        await self._stop_tasks()
        if self.applied:
            await asyncio.to_thread(self.host.reset)


class _Refused(Exception):
    def __init__(self, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.code, self.field = code, field


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def ensure_tracefs() -> None:
    """`ip netns exec` remounts /sys without tracefs: mount it in the agent's own mount namespace."""
    from agents.host.capabilities import tracefs_root
    from schemas import procs

    if tracefs_root() is None and os.path.isdir("/sys/kernel/tracing"):
        procs.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=False)
