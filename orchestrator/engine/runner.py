"""The run engine (effects): for every RunSpec, apply -> verify read-back -> clock exchange -> schedule at T0 ->
wait -> collect -> reset, then hand the run to finalise_run (parse, post-run guards, one write). Hosts are
driven concurrently; a failed run is recorded as failed with its evidence and keeps its artifacts on disk.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine

from orchestrator.agent_client import AgentClient, AgentError
from orchestrator.engine import bind, verify
from orchestrator.guards import pre_run
from orchestrator.guards.finalise import RunOutcome, finalise_run
from orchestrator.ingest.assemble import sender_ports
from orchestrator.ingest.record import RunRecord
from orchestrator.inventory import Inventory
from orchestrator.plan import RunSpec
from schemas import protocol
from schemas.flag import Flag

log = logging.getLogger("tcplab.manager")
START_MARGIN_NS = 2_000_000_000
Phase = Callable[[str, str], None]
R = TypeVar("R")

__all__ = ["PreflightRefused", "RunEngine", "RunFailed", "RunOutcome"]


class RunFailed(Exception):
    pass


class PreflightRefused(Exception):
    """The plan needs what a host lacks; raised before any host is touched."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def task_flags(role: str, tasks: Iterable[protocol.TaskStatus]) -> list[Flag]:
    """A task that finished but has a remark (a capture that lost packets: G-CAPTURE) flags the run."""
    return [Flag(guard=t.guard or "G-TASK", host=role, message=f"{t.task_id}: {t.detail}")
            for t in tasks if t.state == "done" and t.detail]


class RunEngine:
    """One testbed session: an authenticated connection per inventory host, and the runs driven over them."""

    def __init__(self, inv: Inventory, db: Engine, results_dir: Path, on_phase: Phase | None = None):
        self.inv, self.db, self.results_dir = inv, db, results_dir
        self.on_phase = on_phase or (lambda run_id, phase: None)
        self.clients: dict[str, AgentClient] = {}
        self.hellos: dict[str, protocol.HelloResult] = {}

    @property
    def caps(self) -> dict[str, protocol.Capabilities]:
        return {role: hello.capabilities for role, hello in self.hellos.items()}

    async def __aenter__(self) -> RunEngine:
        tls = self.inv.tls_context()
        for role, host in self.inv.hosts.items():
            client = AgentClient(role, host.agent, self.inv.token, tls=tls)
            self.hellos[role] = await client.connect()
            self.clients[role] = client
            log.info("connected host=%s kernel=%s", role, self.hellos[role].capabilities.kernel_release)
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.gather(*(c.close() for c in self.clients.values()), return_exceptions=True)

    def preflight(self, specs: list[RunSpec]) -> None:
        problems = sorted({p for s in specs for p in verify.capability_problems(s, self.caps)}
                          | {f"{s.experiment}: {f}" for s in specs for f in pre_run.refusing(s)})
        if problems:
            raise PreflightRefused("plan refused before touching any host:\n  " + "\n  ".join(problems))

    async def _each(self, roles: Iterable[str], op: Callable[[str, AgentClient], Awaitable[R]]) -> dict[str, R]:
        async def one(role: str) -> tuple[str, R]:
            return role, await op(role, self.clients[role])
        return dict(await asyncio.gather(*(one(r) for r in roles)))

    async def run_one(self, spec: RunSpec, plan_row: dict | None) -> RunOutcome:
        run_dir = self.results_dir / spec.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "runspec.json").write_text(spec.model_dump_json(indent=2))
        states = bind.host_states(spec, self.inv)
        evidence = [{"host": r, "phase": "hello", "data": self.hellos[r].model_dump(mode="json")} for r in states]
        flags: list[Flag] = []
        started, t0 = _now(), None
        artifacts: dict[str, list[dict]] = {}
        error = None
        try:
            self.on_phase(spec.run_id, "apply")
            applied = await self._each(states, lambda r, c: c.apply(protocol.ApplyArgs(run_id=spec.run_id,
                                                                                       state=states[r])))
            diffs = []
            for role, res in applied.items():
                evidence.append({"host": role, "phase": "apply", "data": res.readback.model_dump(mode="json")})
                diffs += [f"{role}: {d}" for d in verify.readback_differences(states[role], res.readback)]
                flags += verify.nic_flags(role, states[role], res.readback)
            if diffs:
                raise RunFailed("read-back differs from the plan:\n  " + "\n  ".join(diffs))
            for role, client in self.clients.items():
                offset, rtt = await client.clock_offset_ns()
                evidence.append({"host": role, "phase": "clock", "data": {"offset_ns": offset, "rtt_ns": rtt}})
            t0 = time.time_ns() + START_MARGIN_NS
            tl = bind.timeline(spec, t0)
            boot_ids = {r: self.caps[r].boot_id for r in self.inv.hosts}
            tasks = bind.schedule_tasks(spec, self.inv, tl, boot_ids)
            self.on_phase(spec.run_id, "schedule")
            await self._each(tasks, lambda r, c: c.schedule(protocol.ScheduleArgs(run_id=spec.run_id,
                                                                                   tasks=tasks[r])))
            self.on_phase(spec.run_id, "running")
            await asyncio.sleep(max(0.0, (tl.stop_ns - time.time_ns()) / 1e9))
            self.on_phase(spec.run_id, "collect")
            collected = await self._each(tasks, lambda r, c: c.collect(
                protocol.CollectArgs(run_id=spec.run_id, timeout_s=60), sink=run_dir / r))
            failed = []
            for role, res in collected.items():
                artifacts[role] = [a.model_dump(mode="json") for a in res.artifacts]
                failed += [f"{role}/{t.task_id}: {t.detail}" for t in res.tasks if t.state != "done"]
                flags += task_flags(role, res.tasks)
            if failed:
                raise RunFailed("tasks failed:\n  " + "\n  ".join(failed))
        except (RunFailed, AgentError) as exc:
            error = str(exc)
            log.error("run failed run=%s error=%s", spec.run_id, error)
        finally:
            self.on_phase(spec.run_id, "reset")
            reset = await self._each(states, lambda r, c: c.reset())
            evidence += [{"host": role, "phase": "reset", "data": res.model_dump(mode="json")}
                         for role, res in reset.items()]
        record = RunRecord(run=self._run_row(spec, plan_row, t0, started, error, flags), plan=plan_row,
                           flows=self._flow_rows(spec, run_dir if error is None else None), evidence=evidence,
                           artifacts=artifacts, points=bind.capture_point_names(spec, self.inv))
        record.save(run_dir)   # before parsing: a run the parsers refuse can be re-ingested as it came
        self.on_phase(spec.run_id, "ingest")
        return finalise_run(self.db, run_dir, record)

    def _run_row(self, spec: RunSpec, plan_row, t0, started, error, flags: list[Flag]) -> dict:
        return {
            "run_id": spec.run_id, "plan_sha256": plan_row["plan_sha256"] if plan_row else None,
            "plan_name": spec.plan_name, "experiment": spec.experiment, "repetition": spec.repetition,
            "seed": spec.seed, "status": "failed" if error else "complete", "params": spec.params,
            "derived": spec.derived.model_dump(mode="json"), "spec": spec.model_dump(mode="json"),
            "tags": sorted(set(spec.tags) | set(self.inv.tags)),
            "t0_ns": t0, "duration_s": spec.duration_s, "started_at": started, "finished_at": _now(),
            "error": error, "flags": [f.stored() for f in flags],
        }

    def _flow_rows(self, spec: RunSpec, run_dir: Path | None) -> list[dict]:
        ports = sender_ports(run_dir, spec) if run_dir else {}
        return [{"flow_id": f.flow_id, "src_host": f.src, "dst_host": f.dst,
                 "src_addr": self.inv.hosts[f.src].data_addr, "dst_addr": self.inv.hosts[f.dst].data_addr,
                 "src_port": ports.get(f.flow_id), "dst_port": f.port, "cc": f.cc, "start_s": f.start_s,
                 "duration_s": f.duration_s, "tool": f.tool} for f in spec.flows]
