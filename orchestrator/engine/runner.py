"""The run engine (effects): for every RunSpec, apply -> verify read-back -> clock exchange -> schedule at T0 ->
wait -> collect -> reset, then hand the run to finalise_run (parse, post-run guards, one write). Hosts are
driven concurrently; a failed run is recorded as failed with its evidence and keeps its artifacts on disk.

Failures (docs/architecture.md, "Failures and recovery"): every op is bounded in time and a lost control
connection is noticed while the flows run, so a dead or silent host fails the run with its name; reset is
tried on every host independently; a RUNNING marker (engine/marker.py) is on disk while hosts are touched and
until the run is in the database, so a manager stopped mid-run, or a database down at ingest, loses nothing
(engine/recovery.py).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.agent_client import AgentClient, AgentError, AgentUnreachable
from orchestrator.engine import bind, capcache, hostchecks, marker, preflight, timing, verify
from orchestrator.engine.agent_ops import apply_when_free
from orchestrator.engine.appbind import app_start_lead_ns
from orchestrator.engine.provenance import Provenance
from orchestrator.engine.stopping import Hooks, finish_hosts, timed, wait_flows_over
from orchestrator.guards.finalise import RunOutcome, finalise_run
from orchestrator.ingest.assemble import sender_ports
from orchestrator.ingest.record import RunRecord
from orchestrator.inventory import Inventory
from orchestrator.plan import RunSpec
from orchestrator.storage.run_ingest import IngestError, RunIngest
from orchestrator.storage.timing import store_timing
from orchestrator.storage.writer import write_run
from schemas import protocol
from schemas.flag import Flag

log = logging.getLogger("tcplab.manager")
RECONNECT_WAIT_S = 20.0   # an agent restarted by its supervisor answers within a few seconds
Phase = Callable[[str, str], None]
DB_ERRORS = (SQLAlchemyError, psycopg.Error, IngestError)
R = TypeVar("R")

__all__ = ["Hooks", "RunEngine", "RunFailed", "RunOutcome"]
# the run's outcome when the database refused the write: the run is on disk, `tcplab ingest --pending` retries
PENDING = "pending"


class RunFailed(Exception):
    pass


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)



def clock_evidence(offset_ns: int, rtt_ns: int, shared_clock: bool) -> dict:
    """The clock phase's evidence: the offset the run's times are corrected by. On a testbed whose hosts read
    the manager's own clock (a UML lab) that is 0 -- what was measured is the exchange's scheduling noise,
    kept as measured_offset_ns."""
    if shared_clock:
        return {"offset_ns": 0, "rtt_ns": rtt_ns, "measured_offset_ns": offset_ns, "shared_clock": True}
    return {"offset_ns": offset_ns, "rtt_ns": rtt_ns}

class RunEngine:
    """One testbed session: an authenticated connection per inventory host, and the runs driven over them."""

    def __init__(self, inv: Inventory, db: Engine, results_dir: Path, on_phase: Phase | None = None,
                 provenance: Provenance | None = None):
        self.inv, self.db, self.results_dir = inv, db, results_dir
        self.provenance = provenance or Provenance()   # collected once per `tcplab run` / campaign night
        self.on_phase = on_phase or (lambda run_id, phase: None)
        self.clients: dict[str, AgentClient] = {}
        self.hellos: dict[str, protocol.HelloResult] = {}
        self.history = timing.History()   # schedule op and readiness latencies of the recent runs
        self.ingest_worker = None          # engine/ingest_worker.py, once run_many (or start_ingest_worker) needs it

    @property
    def caps(self) -> dict[str, protocol.Capabilities]:
        return {role: hello.capabilities for role, hello in self.hellos.items()}

    async def connect_all(self) -> None:
        """Connect every inventory host not connected yet; AgentError names the first one unreachable."""
        tls = self.inv.tls_context()
        for role, host in self.inv.hosts.items():
            if role in self.clients:
                continue
            client = AgentClient(role, host.agent, self.inv.token, tls=tls, netns=host.agent_netns)
            self.hellos[role] = await client.connect()
            self.clients[role] = client
            self.remember_hello(role)
            log.info("connected host=%s kernel=%s", role, self.hellos[role].capabilities.kernel_release)

    async def disconnect(self, roles: list[str]) -> None:
        """Close these hosts' connections and forget their hellos (a host about to restart on another kernel;
        connect_all brings them back)."""
        for role in roles:
            client = self.clients.pop(role, None)
            self.hellos.pop(role, None)
            if client is not None:
                await client.close()

    async def close(self) -> None:
        if self.ingest_worker is not None:
            await self.ingest_worker.close()
            self.ingest_worker = None
        await asyncio.gather(*(c.close() for c in self.clients.values()), return_exceptions=True)

    async def start_ingest_worker(self) -> None:
        """Start the ingest worker run_many overlaps the runs' ingests with (its imports take about a second of
        CPU: started early, e.g. before recovery and preflight, they are done by the first ingest)."""
        from orchestrator.engine.ingest_worker import IngestWorker

        if self.ingest_worker is None:
            self.ingest_worker = IngestWorker(self.db.url.render_as_string(hide_password=False))
            await self.ingest_worker.start()

    async def __aenter__(self) -> RunEngine:
        await self.connect_all()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def remember_hello(self, role: str) -> None:
        """Every hello refreshes the capability cache (engine/capcache.py) `tcplab run --dry-run` reads; a
        cache that cannot be written costs only a later dry run its shortcut."""
        try:
            capcache.record(self.results_dir, role, self.inv.hosts[role].agent, self.hellos[role], _now())
        except OSError as exc:
            log.warning("capability cache not written host=%s error=%s", role, exc)

    def preflight(self, specs: list[RunSpec]) -> list[preflight.Verdict]:
        """Each run judged on its own against the hosts' hellos: Runnable or Refused with its reasons."""
        return preflight.check_runs(specs, self.caps, self.inv)

    async def record_refused(self, refused: preflight.Refused, plan_row: dict | None) -> RunOutcome:
        """A refused run goes into the database (status `refused`, reasons in `error`) without touching any
        host or writing a run folder; `tcplab run` tries it again once the testbed can run it."""
        row = preflight.refused_row(refused, plan_row, list(self.inv.tags), _now(), self.provenance)
        try:
            await asyncio.to_thread(write_run, self.db, RunIngest(run=row, plan=plan_row))
        except DB_ERRORS as exc:
            return RunOutcome(refused.spec.run_id, PENDING, f"refused, and the database did not take the record: "
                              f"{_first_line(exc)}")
        return RunOutcome(refused.spec.run_id, preflight.REFUSED, refused.error)

    async def settle(self, roles: Iterable[str], op: Callable[[str, AgentClient], Awaitable[R]]
                     ) -> tuple[dict[str, R], dict[str, AgentError]]:
        """`op` on every role concurrently; each host's result or error, so one failing host never stops
        (or hides) what the others did."""
        roles = list(roles)
        got = await asyncio.gather(*(op(r, self.clients[r]) for r in roles), return_exceptions=True)
        done: dict[str, R] = {}
        failed: dict[str, AgentError] = {}
        for role, res in zip(roles, got, strict=True):
            if isinstance(res, AgentError):
                failed[role] = res
            elif isinstance(res, BaseException):
                raise res
            else:
                done[role] = res
        return done, failed

    async def _each(self, roles: Iterable[str], op: Callable[[str, AgentClient], Awaitable[R]]) -> dict[str, R]:
        """`op` on every role; RunFailed naming every host that failed it, once all have answered."""
        done, failed = await self.settle(roles, op)
        if failed:
            raise RunFailed("; ".join(str(e) for e in failed.values()))
        return done

    async def reconnect_lost(self, wait_s: float = RECONNECT_WAIT_S) -> None:
        """A host whose control connection was lost in an earlier run (agent restarting, link back) is connected
        again before the next run touches it, retried for up to `wait_s`; one still unreachable fails that
        run, naming it."""
        for role, client in self.clients.items():
            deadline = time.monotonic() + wait_s
            while not client.connected:
                try:
                    self.hellos[role] = await client.connect()
                    self.remember_hello(role)
                    log.info("reconnected host=%s", role)
                except AgentError as exc:
                    if time.monotonic() > deadline:
                        raise RunFailed(f"{exc} (lost in an earlier run)") from None
                    await asyncio.sleep(0.5)

    async def reset_all(self, roles: Iterable[str]) -> list[dict]:
        """Reset every role, each on its own: reset evidence for those that answered (restored or the
        differences left), the error for those that did not."""
        return list(await asyncio.gather(*(self.reset_one(r, self.clients[r]) for r in roles)))

    async def reset_one(self, role: str, client: AgentClient) -> dict:
        """One host's reset evidence; an unreachable host's error in it (never raises AgentError)."""
        try:
            res = await client.reset()
        except AgentError as exc:
            log.error("reset failed host=%s error=%s", role, exc)
            return {"host": role, "phase": "reset", "data": {"restored": False, "error": str(exc)}}
        return {"host": role, "phase": "reset", "data": res.model_dump(mode="json")}

    async def run_watching(self, roles: Iterable[str], seconds: float) -> None:
        """Sleep while the flows run, but fail the run as soon as a host's control connection is lost (agent
        killed, stopped answering pings) rather than at collect time."""
        clients = {r: self.clients[r] for r in roles}
        watchers = {asyncio.ensure_future(c.wait_lost()): r for r, c in clients.items()}
        timer = asyncio.ensure_future(asyncio.sleep(seconds))
        began = time.monotonic()
        try:
            done, _ = await asyncio.wait({timer, *watchers}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (timer, *watchers):
                fut.cancel()
        lost = sorted(watchers[f] for f in done if f in watchers)
        if lost:
            raise AgentUnreachable(lost[0], "running", f"control connection lost while the flows ran "
                                   f"({time.monotonic() - began:.1f} s after they were scheduled)"
                                   + (f"; also {', '.join(lost[1:])}" if lost[1:] else ""))

    async def run_one(self, spec: RunSpec, plan_row: dict | None) -> RunOutcome:
        """One run from apply to stored, in series; the outcome carries its phase timings."""
        run_timing = timing.RunTiming(flows_s=bind.flows_s(spec))
        clock = timing.PhaseClock(run_timing)
        run_dir, record = await self.execute(spec, plan_row, clock)
        clock.enter("ingest")
        outcome = await self.ingest(run_dir, record)
        clock.close()
        return self.stored_timing(outcome, run_timing)

    async def execute(self, spec: RunSpec, plan_row: dict | None, clock: timing.PhaseClock,
                      hooks: Hooks | None = None) -> tuple[Path, RunRecord]:
        """Everything of a run but its ingest: apply ... reset, then its RunRecord saved with the INGEST marker
        (from there on the run is safe on disk: engine/recovery.py). `hooks.before_flows(t0)` runs once the
        tasks are scheduled, `hooks.after_flows` at the flows' scheduled end (run_many keeps
        the previous run's ingest off the CPUs in between: engine/pipeline.py)."""
        hooks = hooks or Hooks()
        run_dir = self.results_dir / spec.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "runspec.json").write_text(spec.model_dump_json(indent=2))
        states = bind.host_states(spec, self.inv)
        flags: list[Flag] = []
        started, t0 = _now(), None
        marker.write(run_dir, marker.RUNNING, started, list(self.inv.hosts), plan_row)
        artifacts: dict[str, list[dict]] = {}
        error = None
        evidence: list[dict] = []
        reset_done: set[str] = set()
        try:
            clock.enter("apply")
            await self.reconnect_lost()
            evidence = [{"host": r, "phase": "hello", "data": self.hellos[r].model_dump(mode="json")}
                        for r in states]
            self.on_phase(spec.run_id, "apply")
            applied = await self._each(states, lambda r, c: apply_when_free(
                c, protocol.ApplyArgs(run_id=spec.run_id, state=states[r])))
            diffs = []
            for role, res in applied.items():
                evidence.append({"host": role, "phase": "apply", "data": res.readback.model_dump(mode="json")})
                diffs += [f"{role}: {d}" for d in verify.readback_differences(states[role], res.readback)]
                flags += verify.nic_flags(role, states[role], res.readback)
            flags += hostchecks.line_rate_flags(spec, self.caps, self.inv)
            if diffs:
                raise RunFailed("read-back differs from the plan:\n  " + "\n  ".join(diffs))
            clock.enter("clock")
            offsets = await self._each(self.clients, lambda r, c: c.clock_offset_ns())   # hosts concurrently
            for role in self.clients:
                evidence.append({"host": role, "phase": "clock", "data": clock_evidence(*offsets[role],
                                                                                        self.inv.shared_clock)})
            clock.enter("schedule")
            margins = self.margins(spec, [rtt for _, rtt in offsets.values()])
            clock.timing.margins = {"schedule_s": margins.schedule_ns / 1e9, "lead_s": margins.lead_ns / 1e9,
                                    "grace_s": margins.grace_ns / 1e9, "tail_max_s": margins.tail_max_ns / 1e9}
            t0 = time.time_ns() + margins.start_margin_ns + app_start_lead_ns(spec)
            tl = bind.timeline(spec, t0, margins.lead_ns, margins.tail_max_ns)
            boot_ids = {r: self.caps[r].boot_id for r in self.inv.hosts}
            tasks = bind.schedule_tasks(spec, self.inv, tl, boot_ids)
            self.on_phase(spec.run_id, "schedule")
            took = await self._each(tasks, lambda r, c: timed(c.schedule(
                protocol.ScheduleArgs(run_id=spec.run_id, tasks=tasks[r]))))
            self.history.schedule_ns.append(max(took.values()))
            self.on_phase(spec.run_id, "running")
            clock.enter("wait_t0")
            await hooks.before_flows(t0)
            await self.run_watching(tasks, max(0.0, (t0 - time.time_ns()) / 1e9))
            clock.enter("flows")
            await self.run_watching(tasks, max(0.0, (t0 + int(clock.timing.flows_s * 1e9) - time.time_ns()) / 1e9))
            await hooks.after_flows()   # the analysis window is over: the tail's packets are not measured
            clock.enter("tail")
            await wait_flows_over(self, tasks, tl, margins)
            self.on_phase(spec.run_id, "collect")
            clock.enter("stop")
            artifacts, end_flags, failed = await finish_hosts(self, spec.run_id, tasks, run_dir, margins, clock,
                                                              evidence, reset_done)
            flags += end_flags
            self.history.ready_ns.extend(timing.ready_latencies(artifacts, tl.start_ns))
            flags += [Flag(guard="G-CAPTURE" if a["kind"] == "pcap" else "G-TASK", host=role,
                           message=f"{a['task_id']}: ready {ms:.0f} ms after T0 (lead {margins.lead_ns / 1e6:.0f} ms)")
                      for role, a, ms in timing.late_ready(artifacts, t0)]
            if failed:
                raise RunFailed("tasks failed:\n  " + "\n  ".join(failed))
        except (RunFailed, AgentError) as exc:
            error = str(exc)
            log.error("run failed run=%s error=%s", spec.run_id, error)
        finally:
            await hooks.after_flows()
            if set(states) - reset_done:   # failed before its end, or a host without tasks
                clock.enter("reset")
                self.on_phase(spec.run_id, "reset")
                evidence += await self.reset_all([r for r in states if r not in reset_done])
        clock.enter("save")
        record = RunRecord(run=self.run_row(spec, plan_row, t0, started, error, flags, clock.timing), plan=plan_row,
                           flows=self.flow_rows(spec, run_dir if error is None else None), evidence=evidence,
                           artifacts=artifacts, points=bind.capture_point_names(spec, self.inv))
        record.save(run_dir)   # before parsing: a run the parsers refuse can be re-ingested as it came
        marker.write(run_dir, marker.INGEST, started, list(self.inv.hosts), plan_row)
        self.on_phase(spec.run_id, "ingest")
        return run_dir, record

    async def run_many(self, jobs: Sequence[tuple[RunSpec, dict | None]],
                       on_outcome: Callable[[RunOutcome], None] | None = None) -> list[RunOutcome]:
        """The same results as run_one for each job in order, overlapping what may be overlapped (each run's
        ingest with the next run: engine/pipeline.py); outcomes in job order, `on_outcome` called as each
        run is stored."""
        from orchestrator.engine.pipeline import run_many

        return await run_many(self, jobs, on_outcome)

    def margins(self, spec: RunSpec, rtts_ns: list[int]) -> timing.Margins:
        """This run's start margin, lead, grace and tail bound (engine/timing.py) from the control RTTs just
        measured and this session's history; TCPLAB_FIXED_MARGINS=1: the old constants (a reference)."""
        if os.environ.get("TCPLAB_FIXED_MARGINS") == "1":
            return timing.fixed_margins()
        floors = timing.floors_for(self.inv.kind)
        m = timing.size_margins(floors, rtts_ns, self.history.schedule_ns,
                                self.history.ready_ns, base_rtt_ns=int((spec.derived.base_rtt_us or 0) * 1000))
        m = timing.lead_for_processes(m, floors, bind.passive_processes(spec))
        m = timing.tail_for_processes(m, floors, bind.flow_processes(spec), bind.connect_allowance_ns(spec))
        if app_start_lead_ns(spec):   # an app-limited writer connects 0.8 s after the captures start, before T0
            m = replace(m, lead_ns=max(m.lead_ns, bind.LEAD_NS))
        return m

    def stored_timing(self, outcome: RunOutcome, run_timing: timing.RunTiming) -> RunOutcome:
        """The outcome with its timings, also written to the run row (the row was written during the ingest
        these timings include: completed by one update; a refused update costs only the ingest figure)."""
        outcome.timing = run_timing
        if outcome.status in ("complete", "failed"):
            try:
                store_timing(self.db, outcome.run_id, run_timing.as_json())
            except DB_ERRORS as exc:
                log.warning("run timing not stored run=%s error=%s", outcome.run_id, _first_line(exc))
        log.info("run timing run=%s %s", outcome.run_id, run_timing.line())
        return outcome

    async def ingest(self, run_dir: Path, record: RunRecord) -> RunOutcome:
        """finalise_run off the event loop (keepalive pings of the other connections go on meanwhile); a
        database that refuses or cannot be reached leaves the run pending on disk, marker and all."""
        try:
            outcome = await asyncio.to_thread(finalise_run, self.db, run_dir, record)
        except DB_ERRORS as exc:
            reason = f"database unreachable or refused the write: {_first_line(exc)}"
            log.error("run not stored run=%s error=%s", record.run_id, reason)
            return RunOutcome(record.run_id, PENDING, f"{reason} (run kept in {run_dir}; `tcplab ingest --pending`"
                              " stores it)")
        marker.clear(run_dir)
        return outcome

    def run_row(self, spec: RunSpec, plan_row, t0, started, error, flags: list[Flag],
                run_timing: timing.RunTiming | None = None) -> dict:
        return {**preflight.spec_columns(spec, plan_row, list(self.inv.tags), self.provenance),
                "status": "failed" if error else "complete", "t0_ns": t0, "started_at": started,
                "finished_at": _now(), "error": error, "flags": [f.stored() for f in flags],
                "timing": run_timing.as_json() if run_timing is not None else None}

    def flow_rows(self, spec: RunSpec, run_dir: Path | None) -> list[dict]:
        ports = sender_ports(run_dir, spec) if run_dir else {}
        return [{"flow_id": f.flow_id, "src_host": f.src, "dst_host": f.dst,
                 "src_addr": self.inv.hosts[f.src].data_addr, "dst_addr": self.inv.hosts[f.dst].data_addr,
                 "src_port": ports.get(f.flow_id), "dst_port": f.port, "cc": f.cc, "start_s": f.start_s,
                 "duration_s": f.duration_s, "tool": f.tool} for f in spec.flows]
