"""RunEngine.run_many (effects): the runs of a campaign in order, each run's ingest overlapped with the next
run.

The same results as run_one for each job in order: the same steps, the same RunRecord on disk, the same
finalise_run. What changes is when the ingest happens: run n's RunRecord and INGEST marker are saved after
its reset (as in run_one), then the ingest worker (engine/ingest_worker.py) finalises it while the engine
already applies run n+1. What may overlap depends on where the manager runs (`overlap_policy`):

- "between_flows" (netns and VM labs: the manager shares its CPUs with every testbed host): the worker is
  held still (SIGSTOP) from PAUSE_BEFORE_T0_NS before run n+1's T0 until its flows' scheduled end, so no
  ingest runs while flows start or are measured (G-CPULOAD, start skew, the analysis window), and goes on
  during run n+1's tail, collect, reset and run n+2's apply and clock exchange.
- "full" (a physical testbed, the manager none of its hosts): the worker is never paused.
- "serial" (TCPLAB_FIXED_MARGINS=1, the reference of bench/run_overhead.py): run_one for each job.

At most one ingest is behind: before run n+1 hands its record over, it waits for run n's (its
`ingest_wait`). A run's timing: the slot it held the testbed for (apply ... save, plus that wait); its own
ingest is recorded as `ingest` (overlapped, so not in its wall time); the wait for the last run's ingest
after its slot is its `drain_s`, and the wait for the worker to be ready before the first run that run's
`warmup_s`, each once per campaign.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from orchestrator.engine import bind, timing
from orchestrator.engine.ingest_worker import IngestWorker
from orchestrator.engine.runner import PENDING, Hooks, RunEngine, RunOutcome
from orchestrator.ingest.record import RunRecord
from orchestrator.inventory import LAB_KINDS, Inventory
from orchestrator.plan import RunSpec

log = logging.getLogger("tcplab.manager")
PAUSE_BEFORE_T0_NS = 100_000_000   # the ingest is still before the flows' first packets (process starts)


def _is_local(host: str) -> bool:
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    local = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None)} if socket.gethostname() else set()
    return any(ipaddress.ip_address(a.split("%")[0]).is_loopback or a in local for a in addrs)


def manager_shares_cpus(inv: Inventory) -> bool:
    """Whether the manager runs on a testbed host: always on the labs (one machine), on a physical testbed
    when an agent's address is this machine's."""
    if inv.kind in LAB_KINDS:
        return True
    return any(_is_local(urlsplit(h.agent).hostname or "") for h in inv.hosts.values())


def overlap_policy(inv: Inventory, fixed: bool) -> str:
    if fixed:
        return "serial"
    return "between_flows" if manager_shares_cpus(inv) else "full"


async def run_many(engine: RunEngine, jobs: Sequence[tuple[RunSpec, dict | None]],
                   on_outcome: Callable[[RunOutcome], None] | None = None) -> list[RunOutcome]:
    policy = overlap_policy(engine.inv, os.environ.get("TCPLAB_FIXED_MARGINS") == "1")
    log.info("run_many runs=%d overlap=%s", len(jobs), policy)
    outcomes: list[RunOutcome | None] = [None] * len(jobs)

    def finished(i: int, outcome: RunOutcome) -> None:
        outcomes[i] = outcome
        if on_outcome is not None:
            try:
                on_outcome(outcome)
            except Exception:   # the caller's display must not stop the campaign
                log.exception("on_outcome failed run=%s", outcome.run_id)

    if policy == "serial":
        for i, (spec, plan_row) in enumerate(jobs):
            finished(i, await engine.run_one(spec, plan_row))
        return [o for o in outcomes if o is not None]

    await engine.start_ingest_worker()   # at once unless started already
    worker: IngestWorker = engine.ingest_worker
    began = time.monotonic()
    # its imports (about a second of CPU) must not run during the first run's flows, and held still there they
    # would delay the first ingests: the campaign waits for them once, before its first run (warmup_s)
    if not await worker.wait_ready():
        log.error("ingest worker not ready: the runs are ingested in the manager")
    warmup_s = time.monotonic() - began

    async def before_flows(t0_ns: int) -> None:
        if policy == "between_flows":
            await asyncio.sleep(max(0.0, (t0_ns - PAUSE_BEFORE_T0_NS - time.time_ns()) / 1e9))
            worker.pause()

    async def after_flows() -> None:
        worker.resume()

    async def ingest(i: int, run_dir: Path, record: RunRecord, run_timing: timing.RunTiming,
                     last: bool) -> RunOutcome:
        began = time.monotonic()
        outcome = await _ingest_one(engine, worker, run_dir, record)
        run_timing.phases["ingest"] = time.monotonic() - began
        if not last:   # the last run's wall time still grows by the wait for this ingest: stored at the end
            finished(i, await asyncio.to_thread(engine.stored_timing, outcome, run_timing))
        return outcome

    pending: asyncio.Task | None = None
    try:
        for i, (spec, plan_row) in enumerate(jobs):
            run_timing = timing.RunTiming(flows_s=bind.flows_s(spec), warmup_s=warmup_s if i == 0 else 0.0)
            clock = timing.PhaseClock(run_timing)
            try:
                run_dir, record = await engine.execute(spec, plan_row, clock, Hooks(before_flows, after_flows))
            finally:
                worker.resume()
            clock.enter("ingest_wait")
            if pending is not None:
                await pending
            clock.close()
            last = i == len(jobs) - 1
            pending = asyncio.create_task(ingest(i, run_dir, record, run_timing, last))
            if last:   # the campaign waits for it once: drain_s, not part of the run's slot
                began = time.monotonic()
                outcome = await pending
                pending = None
                run_timing.drain_s = time.monotonic() - began
                finished(i, await asyncio.to_thread(engine.stored_timing, outcome, run_timing))
    finally:
        worker.resume()
        if pending is not None:
            await asyncio.gather(pending, return_exceptions=True)
    return [o for o in outcomes if o is not None]


async def _ingest_one(engine: RunEngine, worker: IngestWorker, run_dir: Path, record: RunRecord) -> RunOutcome:
    """The run's ingest in the worker; in the engine (a thread) if the worker cannot take it."""
    try:
        return await worker.ingest(run_dir)
    except (RuntimeError, OSError) as exc:
        log.error("ingest worker failed run=%s error=%s: ingesting in the manager", record.run_id, exc)
    try:
        return await engine.ingest(run_dir, record)
    except Exception as exc:   # the run is on disk with its INGEST marker: `tcplab ingest --pending`
        log.exception("ingest failed run=%s", record.run_id)
        return RunOutcome(record.run_id, PENDING, f"ingest failed: {exc} (run kept in {run_dir})")
