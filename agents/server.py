"""The agent daemon: a WebSocket server (websockets library) in front of the sans-I/O session and the
executors. Effects live here and in agents/host and agents/tasks; message rules live in session.py."""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
import socket
import time
from pathlib import Path

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from agents.admission import Admission, PreAuthLimits
from agents.connections import POLICY_VIOLATION, BoundedLog, drop, peer_of, raise_frame_limit
from agents.events import attach_peers
from agents.host import baseline
from agents.host.capabilities import probe
from agents.host.errors import NotAllowed, StateError
from agents.host.executor import HostStateExecutor
from agents.ownership import RUN_OPS, RunOwnership, SessionId
from agents.session import MAX_FRAME_CHARS, AgentSession, Dispatch, encode_error, encode_event, encode_result
from agents.tasks import TaskRunner, make_runner
from schemas import allowlist, protocol
from schemas.digest import sha256_file

log = logging.getLogger("tcplab.agent")
AGENT_VERSION = "0.4.0"
CHUNK = 256 * 1024
KEEP_RUNS = 3
OFF_LOOP_CHARS = 64 * 1024   # frames larger than this are decoded and validated in a thread, not on the loop
LOCK_WAIT_S = 1.0            # a run op that finds another one in progress is answered `busy`, not queued
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
                 allow_sysctl: list[str] | None = None, allow_module: list[str] | None = None,
                 channel_binding: str = "", limits: PreAuthLimits | None = None, new_host: bool = False,
                 module_dirs: list[Path] | None = None):
        """`allow_sysctl`, `allow_module`: the testbed's --allow-sysctl/--allow-module values (none: the
        defaults of schemas/allowlist.py); a plan cannot widen them. `channel_binding`: sha256 of the agent's
        TLS certificate ("" without TLS); `limits`: what a peer may hold before hello. `new_host`: the host was
        just created, so a reset baseline left by a crashed agent of an earlier host of this name is dropped.
        `module_dirs`: the testbed's --module-dir values (module files this agent may insmod)."""
        self.name, self.token = name, token
        self.interfaces = list(interfaces)
        self.artifacts_root = artifacts_root
        self.host = HostStateExecutor(
            self.interfaces,
            sysctl_prefixes=allowlist.expand_prefixes(allowlist.sysctl_prefixes(allow_sysctl or []), interfaces),
            modules=list(allowlist.modules(allow_module or [])),
            journal=artifacts_root / baseline.JOURNAL_NAME, module_dirs=module_dirs)
        self.capabilities = probe(self.interfaces, self.host.sysctl_prefixes, self.host.modules, module_dirs)
        self.host.snapshot_now(BASELINE_SYSCTLS)
        if new_host:
            baseline.clear(self.host.journal)
        self.applied = self._adopt_baseline()
        self.run_id: str | None = None
        self.runners: list[TaskRunner] = []
        self.jobs: list[asyncio.Task] = []
        self.lock = asyncio.Lock()
        self.channel_binding = channel_binding       # sha256 of our TLS certificate, "" without TLS
        self.admission = Admission(limits)
        self.audit = BoundedLog(log)                 # lines caused by unauthenticated peers, rate-limited
        self.ownership = RunOwnership()
        self.sessions: dict[ServerConnection, SessionId] = {}   # authenticated connections
        self._proofs: dict[ServerConnection, str] = {}          # the agent's hello proof, until hello answers
        self._numbers = itertools.count(1)

    # ------------------------------------------------------------ connection loop
    async def handle(self, ws: ServerConnection) -> None:
        peer = peer_of(ws.transport)
        session = AgentSession(self.token, channel_binding=self.channel_binding, limits=self.admission.limits,
                               hello_gate=lambda: self.admission.hello_refusal(peer, time.monotonic()))
        try:
            await ws.send(session.greeting())
            await self._serve(ws, session, peer)
        except TimeoutError:
            await self._hello_timed_out(ws, peer)
        except ConnectionClosed:
            pass
        finally:
            self._disconnected(ws)
        await ws.close()

    async def _serve(self, ws: ServerConnection, session: AgentSession, peer: str) -> None:
        """Frames until the session closes; TimeoutError when no hello came within the hello timeout."""
        async with asyncio.timeout(self.admission.limits.hello_timeout_s) as hello_deadline:
            async for frame in ws:
                was_authenticated = session.authenticated
                # only authenticated frames can be this large (64 KiB before hello), so the hello gate, which
                # reads the shared admission table, never runs in the worker thread
                out = (await asyncio.to_thread(session.receive, frame) if len(frame) > OFF_LOOP_CHARS
                       else session.receive(frame))
                if session.authenticated and not was_authenticated:
                    hello_deadline.reschedule(None)
                    self._authenticated(ws, session, peer)
                if session.hello_failed:
                    self.admission.hello_failed(peer, time.monotonic())
                    self.audit("hello refused peer=%s reason=wrong proof of the token", peer)
                if isinstance(out, str):
                    await ws.send(out)
                else:
                    await self._dispatch(ws, out)
                if session.closed:
                    if session.close_reason:
                        self.audit("connection closed peer=%s reason=%s", peer, session.close_reason)
                    drop(ws, POLICY_VIOLATION if session.close_reason else 1000, session.close_reason)
                    return

    async def _hello_timed_out(self, ws: ServerConnection, peer: str) -> None:
        message = f"no hello within {self.admission.limits.hello_timeout_s:g} s"
        self.audit("connection closed peer=%s reason=%s", peer, message)
        try:
            await ws.send(encode_error(None, "unauthenticated", message, field="hmac", op="hello"))
        except ConnectionClosed:
            pass
        drop(ws, POLICY_VIOLATION, message)

    def _authenticated(self, ws: ServerConnection, session: AgentSession, peer: str) -> None:
        """Lift the pre-authentication limits for this connection and give it a session identity."""
        raise_frame_limit(ws, MAX_FRAME_CHARS)
        self.admission.authenticated(id(ws))
        self.sessions[ws] = SessionId(next(self._numbers), session.peer or "", peer)
        self._proofs[ws] = session.proof or ""

    def _disconnected(self, ws: ServerConnection) -> None:
        sid = self.sessions.pop(ws, None)
        self._proofs.pop(ws, None)
        if self.ownership.disconnected(sid):
            assert sid is not None
            log.info("owner gone host=%s run=%s %s: the run can be taken over", self.name, self.run_id,
                     sid.describe())

    async def _dispatch(self, ws: ServerConnection, d: Dispatch) -> None:
        try:
            if d.op in RUN_OPS:
                result = await self._run_op(ws, d)
            else:                                      # hello, clock, bye: never wait behind a run op
                result = await getattr(self, f"op_{d.op}")(d.args, ws)
            await ws.send(encode_result(d.id, d.op, result))
        except StateError as exc:
            log.warning("op failed host=%s run=%s op=%s error=%s", self.name, self.run_id, d.op, exc)
            await ws.send(encode_error(d.id, "failed", str(exc), field=exc.field, op=d.op))
        except _Refused as exc:
            await ws.send(encode_error(d.id, exc.code, str(exc), field=exc.field, op=d.op))
        except ConnectionClosed:
            raise
        except Exception as exc:  # reported to the manager, never swallowed
            log.exception("op crashed host=%s run=%s op=%s", self.name, self.run_id, d.op)
            await ws.send(encode_error(d.id, "failed", f"{type(exc).__name__}: {exc}", op=d.op))

    async def _run_op(self, ws: ServerConnection, d: Dispatch):
        """An op on the host's run: only by the owning session (or any, once the owner is gone), and never
        queued behind another op for longer than LOCK_WAIT_S."""
        sid = self.sessions[ws]
        if refusal := self.ownership.refusal(d.op, sid, self.run_id):
            raise _Refused(refusal.code, refusal.message, field=refusal.field)
        try:
            await asyncio.wait_for(self.lock.acquire(), LOCK_WAIT_S)
        except TimeoutError:
            raise _Refused("busy", f"another operation on this host is in progress (run {self.run_id})",
                           field="run_id") from None
        try:
            if took_over := self.ownership.after(d.op, sid):
                log.warning("run taken over host=%s run=%s: %s", self.name, self.run_id, took_over)
            return await getattr(self, f"op_{d.op}")(d.args, ws)
        finally:
            self.lock.release()

    # ------------------------------------------------------------ ops
    async def op_hello(self, args: protocol.HelloArgs, ws) -> protocol.HelloResult:
        sid = self.sessions[ws]
        log.info("hello host=%s %s", self.name, sid.describe())
        if not self.applied and not self.lock.locked():   # a fresh baseline, unless a run op is changing it
            await asyncio.to_thread(self.host.snapshot_now, BASELINE_SYSCTLS)
        proof = self._proofs.pop(ws)
        return protocol.HelloResult(proof=proof, agent_version=AGENT_VERSION, protocol=protocol.PROTOCOL_VERSION,
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
        attach_peers(self.runners)
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
            # wait for the tasks, but not for a manager that went away: its successor must get the host
            finished = asyncio.ensure_future(asyncio.wait(self.jobs, timeout=args.timeout_s))
            gone = asyncio.ensure_future(ws.wait_closed())
            await asyncio.wait({finished, gone}, return_when=asyncio.FIRST_COMPLETED)
            gone.cancel()
            if not finished.done():
                finished.cancel()
                raise ConnectionClosed(None, None)
            _, pending = finished.result()
            if pending:
                await self._stop_tasks()
        infos = []
        for runner in self.runners:
            for path, kind in runner.artifacts():
                info = protocol.ArtifactInfo(name=path.name, task_id=runner.task_id, kind=kind,
                                             size=path.stat().st_size, sha256=sha256_file(path),
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
    def _adopt_baseline(self) -> bool:
        """A previous agent on this boot died between apply and reset: its baseline is the one to restore."""
        try:
            adopted = self.host.adopt_journal()
        except baseline.BadJournal as exc:
            log.error("baseline journal dropped host=%s error=%s", self.name, exc)
            return False
        if adopted:
            log.warning("baseline recovered host=%s: a previous agent left run settings applied; the next reset "
                        "restores the host to the baseline it recorded", self.name)
        return adopted

    def _active(self) -> bool:
        return any(not j.done() for j in self.jobs)

    async def _stop_tasks(self) -> None:
        for r in self.runners:
            r.request_stop()
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


def ensure_tracefs() -> None:
    """`ip netns exec` remounts /sys without tracefs: mount it in the agent's own mount namespace."""
    from agents.host.capabilities import tracefs_root
    from schemas import procs

    if tracefs_root() is None and os.path.isdir("/sys/kernel/tracing"):
        procs.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=False)
