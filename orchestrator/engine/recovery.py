"""Recovery at startup (effects): what a previous manager left unfinished, found by its RUNNING markers
(engine/marker.py), is finished before any new run touches a host.

- A run stopped mid-flight (phase `running`): whatever its agents still hold of it is collected into its run
  folder (best effort), every host is reset, and the run is recorded as failed "manager stopped during the run"
  with that reset evidence. `tcplab run` then runs it again like any run not complete in the database.
- A run whose database write did not happen (phase `ingest`): ingested again from its ingest.json.

Completed runs are never touched: their markers were removed when their write committed.
"""
from __future__ import annotations

import logging
from pathlib import Path

from orchestrator.engine import marker
from orchestrator.engine.runner import PENDING, RunEngine, RunOutcome
from orchestrator.guards.finalise import finalise_run
from orchestrator.ingest.record import INGEST_FILE, RunRecord
from orchestrator.plan import RunSpec
from schemas import protocol

log = logging.getLogger("tcplab.manager")
STALE_REASON = "manager stopped during the run"


class AnotherManager(Exception):
    """A marker's manager is still running: its hosts are not ours to reset."""


def stale_reason(m: marker.RunMarker) -> str:
    return (f"{STALE_REASON} (manager pid {m.pid}, run started {m.started_at:%Y-%m-%d %H:%M:%S} UTC); "
            "hosts reset by the next manager, artifacts kept in the run folder")


async def _salvage(engine: RunEngine, m: marker.RunMarker) -> dict[str, list[dict]]:
    """Artifacts the agents still hold for the stale run (an agent that restarted holds none): collected with
    a short wait, since its tasks may still be running; every failure is only logged."""
    async def one(role: str, client) -> list[dict]:
        status = await client.status()
        if status.run_id != m.run_id:
            return []
        res = await client.collect(protocol.CollectArgs(run_id=m.run_id, timeout_s=1), sink=m.run_dir / role)
        return [a.model_dump(mode="json") for a in res.artifacts]

    roles = [r for r in m.hosts if r in engine.clients and engine.clients[r].connected]
    done, failed = await engine.settle(roles, one)
    for role, exc in failed.items():
        log.warning("stale run artifacts not collected run=%s host=%s error=%s", m.run_id, role, exc)
    return {r: a for r, a in done.items() if a}


async def recover(engine: RunEngine) -> list[RunOutcome]:
    """Finish every run a previous manager left in engine.results_dir; refuses (AnotherManager) if one of
    them is still being run by a live manager."""
    found = marker.unfinished(engine.results_dir)
    alive = [m for m in found if marker.writer_alive(m)]
    if alive:
        raise AnotherManager(", ".join(f"run {m.run_id} by manager pid {m.pid}" for m in alive)
                             + " still running: not touching the hosts")
    outcomes = []
    stale = [m for m in found if m.phase == marker.RUNNING and (m.run_dir / "runspec.json").exists()]
    if stale:
        # what the agents still hold is collected before the reset; one reset of every host serves them all
        artifacts = {m.run_id: await _salvage(engine, m) for m in stale}
        reset_evidence = await engine.reset_all([r for r, c in engine.clients.items() if c.connected])
        for m in stale:
            outcomes.append(await _record_stale(engine, m, reset_evidence, artifacts[m.run_id]))
    for m in found:
        if m.phase == marker.INGEST and (m.run_dir / INGEST_FILE).exists():
            outcomes.append(await engine.ingest(m.run_dir, RunRecord.load(m.run_dir)))
    return outcomes


async def _record_stale(engine: RunEngine, m: marker.RunMarker, reset_evidence: list[dict],
                        artifacts: dict[str, list[dict]]) -> RunOutcome:
    spec = RunSpec.model_validate_json((m.run_dir / "runspec.json").read_text())
    record = RunRecord(run=engine.run_row(spec, m.plan, None, m.started_at, stale_reason(m), []), plan=m.plan,
                       flows=engine.flow_rows(spec, None),
                       evidence=[e for e in reset_evidence if e["host"] in m.hosts], artifacts=artifacts)
    record.save(m.run_dir)
    marker.write(m.run_dir, marker.INGEST, m.started_at, m.hosts, m.plan)
    log.warning("stale run recorded run=%s manager_pid=%d", m.run_id, m.pid)
    return await engine.ingest(m.run_dir, record)


def pending_ingests(results_dir: Path, stored: set[str]) -> list[Path]:
    """Run folders whose run is on disk but not in the database: a marker in phase `ingest`, or an
    ingest.json whose run_id is not among `stored` (e.g. written before markers existed)."""
    if not results_dir.is_dir():
        return []
    out = []
    for d in sorted(p for p in results_dir.iterdir() if (p / INGEST_FILE).is_file()):
        m = marker.read(d)
        if (m is not None and m.phase == marker.INGEST) or (m is None and d.name not in stored):
            out.append(d)
    return out


def ingest_run_dir(db, run_dir: Path) -> RunOutcome:
    """`tcplab ingest`: finalise one run folder; its marker goes once the write committed."""
    outcome = finalise_run(db, run_dir, RunRecord.load(run_dir))
    m = marker.read(run_dir)
    if m is not None and m.phase == marker.INGEST:
        marker.clear(run_dir)
    return outcome


__all__ = ["AnotherManager", "PENDING", "STALE_REASON", "ingest_run_dir", "pending_ingests", "recover"]
