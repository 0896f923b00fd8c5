"""The run engine (effects): for every RunSpec, apply -> verify read-back -> schedule at T0 -> wait ->
collect -> reset -> ingest. Hosts are driven concurrently; a failed run is recorded as failed with its
evidence and keeps its artifacts on disk. Runs already complete in the DB are skipped.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine

from orchestrator.agent_client import AgentClient, AgentError
from orchestrator.engine import guards, resolve, verify
from orchestrator.engine.written import flag_written_run
from orchestrator.ingest.assemble import assemble, save_ingest_inputs, sender_ports
from orchestrator.ingest.cpu import parse_cpu
from orchestrator.inventory import Inventory
from orchestrator.plan import RunSpec
from orchestrator.storage.ingest import RunIngest, write_run
from schemas import protocol

log = logging.getLogger("tcplab.manager")
START_MARGIN_NS = 2_000_000_000
Phase = Callable[[str, str], None]


class RunFailed(Exception):
    pass


class PreflightRefused(Exception):
    """The plan needs what a host lacks; raised before any host is touched."""


@dataclass
class RunOutcome:
    run_id: str
    status: str
    error: str | None = None
    flags: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Manager:
    def __init__(self, inv: Inventory, db: Engine, results_dir: Path, on_phase: Phase | None = None):
        self.inv, self.db, self.results_dir = inv, db, results_dir
        self.on_phase = on_phase or (lambda run_id, phase: None)
        self.clients: dict[str, AgentClient] = {}
        self.caps: dict[str, protocol.Capabilities] = {}
        self.hellos: dict[str, dict] = {}

    async def __aenter__(self) -> Manager:
        token = self.inv.token
        for role, host in self.inv.hosts.items():
            client = AgentClient(role, host.agent, token)
            hello = await client.connect()
            self.clients[role], self.caps[role] = client, hello.capabilities
            self.hellos[role] = hello.model_dump(mode="json")
            log.info("connected host=%s kernel=%s", role, hello.capabilities.kernel_release)
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.gather(*(c.close() for c in self.clients.values()), return_exceptions=True)

    def preflight(self, specs: list[RunSpec]) -> None:
        problems = sorted({p for s in specs for p in verify.capability_problems(s, self.caps)}
                          | {f"{s.experiment}: {f}" for s in specs for f in guards.refusing(s)})
        if problems:
            raise PreflightRefused("plan refused before touching any host:\n  " + "\n  ".join(problems))

    async def _each(self, roles, op: str, make_args, sink_for=None) -> dict[str, dict]:
        async def one(role):
            sink = sink_for(role) if sink_for else None
            return role, await self.clients[role].call(op, make_args(role), sink=sink)
        return dict(await asyncio.gather(*(one(r) for r in roles)))

    async def run_one(self, spec: RunSpec, plan_row: dict | None) -> RunOutcome:
        run_dir = self.results_dir / spec.run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "runspec.json").write_text(spec.model_dump_json(indent=2))
        states = resolve.host_states(spec, self.inv)
        evidence = [{"host": r, "phase": "hello", "data": self.hellos[r]} for r in states]
        flags: list[str] = [f"accepted {f}" for f in guards.pre_run_findings(spec) if f.guard in spec.accept_guards]
        started, t0 = _now(), None
        artifacts: dict[str, list[dict]] = {}
        error = None
        try:
            self.on_phase(spec.run_id, "apply")
            applied = await self._each(states, "apply",
                                       lambda r: protocol.ApplyArgs(run_id=spec.run_id, state=states[r]))
            diffs = []
            for role, res in applied.items():
                evidence.append({"host": role, "phase": "apply", "data": res["readback"]})
                rb = protocol.Readback.model_validate(res["readback"])
                diffs += [f"{role}: {d}" for d in verify.readback_differences(states[role], rb)]
                flags += [f"{role}: {n}" for n in verify.nic_notes(states[role], rb)]
            if diffs:
                raise RunFailed("read-back differs from the plan:\n  " + "\n  ".join(diffs))
            offsets = {}
            for role, client in self.clients.items():
                offset, rtt = await client.clock_offset_ns()
                offsets[role] = offset
                evidence.append({"host": role, "phase": "clock",
                                 "data": {"offset_ns": offset, "rtt_ns": rtt}})
            flags += [str(f) for f in guards.clock_findings(offsets)]
            t0 = time.time_ns() + START_MARGIN_NS
            tl = resolve.timeline(spec, t0)
            boot_ids = {r: self.caps[r].boot_id for r in self.inv.hosts}
            tasks = resolve.schedule_tasks(spec, self.inv, tl, boot_ids)
            self.on_phase(spec.run_id, "schedule")
            await self._each(tasks, "schedule", lambda r: protocol.ScheduleArgs(run_id=spec.run_id,
                                                                                tasks=tasks[r]))
            self.on_phase(spec.run_id, "running")
            await asyncio.sleep(max(0.0, (tl.stop_ns - time.time_ns()) / 1e9))
            self.on_phase(spec.run_id, "collect")
            collected = await self._each(tasks, "collect",
                                         lambda r: protocol.CollectArgs(run_id=spec.run_id, timeout_s=60),
                                         sink_for=lambda r: run_dir / r)
            failed = []
            for role, res in collected.items():
                artifacts[role] = res["artifacts"]
                failed += [f"{role}/{t['task_id']}: {t['detail']}" for t in res["tasks"]
                           if t["state"] != "done"]
                flags += [f"{role}/{t['task_id']}: {t['detail']}" for t in res["tasks"]
                          if t["state"] == "done" and t["detail"]]
            cpu_evidence, cpu_flags = cpu_load(run_dir, artifacts, resolve.kernel_groups(boot_ids),
                                               resolve.measurement_window(spec, tl))
            evidence += cpu_evidence
            flags += cpu_flags
            if failed:
                raise RunFailed("tasks failed:\n  " + "\n  ".join(failed))
        except (RunFailed, AgentError) as exc:
            error = str(exc)
            log.error("run failed run=%s error=%s", spec.run_id, error)
        finally:
            self.on_phase(spec.run_id, "reset")
            reset = await self._each(states, "reset", lambda r: protocol.Empty())
            for role, res in reset.items():
                evidence.append({"host": role, "phase": "reset", "data": res})
                flags += [f"{role}: reset left {d}" for d in res["differences"]]
        run_row = self._run_row(spec, plan_row, t0, started, error, flags)
        flow_rows = self._flow_rows(spec, run_dir if error is None else None)
        points = resolve.capture_point_names(spec, self.inv)
        # saved before parsing: a run the parsers refuse can be re-ingested as it came from the hosts
        save_ingest_inputs(run_dir, run_row, plan_row, flow_rows, evidence, artifacts, points)
        ingest = None
        if error is None:
            self.on_phase(spec.run_id, "ingest")
            try:
                ingest = assemble(spec, run_row, plan_row, run_dir, artifacts, evidence, flow_rows, points)
            except ValueError as exc:  # ArtifactError, or a capture the pcap reader refuses
                error = f"ingest: {exc} (artifacts kept: `tcplab ingest {run_dir}` once fixed)"
                log.error("run not ingested run=%s error=%s", spec.run_id, error)
                run_row = {**run_row, "status": "failed", "error": error}
        if ingest is None:
            ingest = RunIngest(run=run_row, plan=plan_row, flows=flow_rows, evidence=evidence)
        counts = write_run(self.db, ingest)
        flags = [*ingest.run["flags"], *flag_written_run(self.db, ingest)]
        return RunOutcome(spec.run_id, run_row["status"], error, flags, dict(vars(counts)))

    def _run_row(self, spec: RunSpec, plan_row, t0, started, error, flags) -> dict:
        return {
            "run_id": spec.run_id, "plan_sha256": plan_row["plan_sha256"] if plan_row else None,
            "plan_name": spec.plan_name, "experiment": spec.experiment, "repetition": spec.repetition,
            "seed": spec.seed, "status": "failed" if error else "complete", "params": spec.params,
            "derived": spec.derived.model_dump(mode="json"), "spec": spec.model_dump(mode="json"),
            "tags": sorted(set(spec.tags) | set(self.inv.tags)),
            "t0_ns": t0, "duration_s": spec.duration_s, "started_at": started, "finished_at": _now(),
            "error": error, "flags": flags,
        }

    def _flow_rows(self, spec: RunSpec, run_dir: Path | None) -> list[dict]:
        ports = sender_ports(run_dir, spec) if run_dir else {}
        return [{"flow_id": f.flow_id, "src_host": f.src, "dst_host": f.dst,
                 "src_addr": self.inv.hosts[f.src].data_addr, "dst_addr": self.inv.hosts[f.dst].data_addr,
                 "src_port": ports.get(f.flow_id), "dst_port": f.port, "cc": f.cc, "start_s": f.start_s,
                 "duration_s": f.duration_s, "tool": f.tool} for f in spec.flows]


def cpu_load(run_dir: Path, artifacts: dict[str, list[dict]], groups: dict[str, list[str]],
             window: tuple[int, int]) -> tuple[list[dict], list[str]]:
    """M-CPU evidence and G-CPULOAD flags from the hosts' cpu_load artifacts. A host whose samples cannot be
    read is flagged (its load is unknown), never the reason to lose the run."""
    evidence, flags = [], []
    for role, infos in artifacts.items():
        for info in (i for i in infos if i["kind"] == "cpu"):
            host = "+".join(groups.get(role, [role]))
            try:
                summary = guards.cpu_summary(parse_cpu((run_dir / role / info["name"]).read_text()).intervals(),
                                             window)
            except (OSError, ValueError) as exc:
                flags.append(f"G-CPULOAD host {host}: {role}/{info['name']} unreadable: {exc}")
                continue
            evidence.append({"host": role, "phase": "cpu", "data": {"shared_by": groups.get(role, [role]),
                                                                   "window_ns": list(window), "cpus": summary}})
            flags += [str(f) for f in guards.cpuload_findings(summary, host)]
    return evidence, flags
