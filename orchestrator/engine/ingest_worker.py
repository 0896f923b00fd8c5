"""The ingest worker: one child process of the manager that finalises runs (parse, guards, one write) while
the engine drives the next run, so a run's ingest overlaps the next run instead of following it.

A process rather than a thread, so the engine can hold it still with SIGSTOP while the next run's flows are
measured where the manager shares the testbed's CPUs (netns and VM labs: engine/pipeline.py) and let it go
on with SIGCONT afterwards; a thread can be neither paused nor kept from the manager's own GIL. It is
started with `setpriv --pdeathsig KILL` (as the agents start their tools), so it never outlives the manager, also when
stopped. Crash safety is the engine's: a run is handed over only once its RunRecord and INGEST marker are on
disk, and the marker goes once the write committed, so a worker or manager killed at any point leaves the
run for `tcplab run`'s recovery or `tcplab ingest --pending`.

Protocol: the database URL in the environment (TCPLAB_INGEST_DB_URL: never on a command line); the worker
writes {"ready": true} once it has imported what it needs (about a second of CPU, once per session: the
engine starts it before the first run, `RunEngine.start_ingest_worker`), then reads one JSON line per run on
stdin {"run_dir": ...} and answers one JSON line per run on stdout, in order. It runs at the manager's
priority: held still during the flows, it has to keep up in the time between them.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

from orchestrator.guards.finalise import RunOutcome
from schemas.flag import Flag

log = logging.getLogger("tcplab.manager")
URL_ENV = "TCPLAB_INGEST_DB_URL"
PENDING = "pending"


def reply(outcome: RunOutcome) -> dict:
    return {"run_id": outcome.run_id, "status": outcome.status, "error": outcome.error,
            "flags": [f.stored() for f in outcome.flags], "counts": outcome.counts}


def outcome_of(doc: dict) -> RunOutcome:
    return RunOutcome(doc["run_id"], doc["status"], doc.get("error"),
                      [Flag.from_stored(f) for f in doc.get("flags", [])], dict(doc.get("counts") or {}))


def main() -> None:
    """The child: finalise each run folder named on stdin; a database error leaves the run pending."""
    import psycopg
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.engine import marker
    from orchestrator.guards.finalise import finalise_run
    from orchestrator.ingest.record import RunRecord
    from orchestrator.storage.db import create_db_engine
    from orchestrator.storage.run_ingest import IngestError

    db_errors = (SQLAlchemyError, psycopg.Error, IngestError)   # engine/runner.py's DB_ERRORS, without its imports

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    db = create_db_engine(os.environ[URL_ENV])   # the manager migrated it already
    sys.stdout.write(json.dumps({"ready": True}) + "\n")   # imported: ~1 s of CPU, once per session
    sys.stdout.flush()
    for line in sys.stdin:
        run_dir = Path(json.loads(line)["run_dir"])
        try:
            outcome = finalise_run(db, run_dir, RunRecord.load(run_dir))
            marker.clear(run_dir)
            doc = reply(outcome)
        except db_errors as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            reason = f"database unreachable or refused the write: {first}"
            log.error("run not stored run=%s error=%s", run_dir.name, reason)
            doc = {"run_id": run_dir.name, "status": PENDING,
                   "error": f"{reason} (run kept in {run_dir}; `tcplab ingest --pending` stores it)"}
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()


class IngestWorker:
    """The manager's handle on the worker: `ingest(run_dir)` one run at a time, `pause()`/`resume()`."""

    def __init__(self, db_url: str):
        self.db_url = db_url
        self.proc: asyncio.subprocess.Process | None = None
        self.paused = False
        self._ready: asyncio.Future | None = None

    async def start(self) -> None:
        env = {**os.environ, URL_ENV: self.db_url}
        die_with_us = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        self.proc = await asyncio.create_subprocess_exec(
            *die_with_us, sys.executable, "-m", "orchestrator.engine.ingest_worker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, limit=16 * 1024 * 1024)
        self._ready = asyncio.ensure_future(self.proc.stdout.readline())   # its first line: imported
        log.info("ingest worker started pid=%d", self.proc.pid)

    async def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """Whether the worker has imported what it needs (False: it died or took longer than timeout_s)."""
        if self._ready is None:
            return False
        try:
            return bool(await asyncio.wait_for(asyncio.shield(self._ready), timeout_s))
        except TimeoutError:
            return False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def ingest(self, run_dir: Path) -> RunOutcome:
        """The run's outcome as the worker stored it; RuntimeError if the worker died (the run stays pending
        on disk, marker and all)."""
        if self.proc is None:
            await self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        if not await self._ready or not self.alive:
            raise RuntimeError(f"ingest worker exited with {await self.proc.wait()}")
        self.proc.stdin.write((json.dumps({"run_dir": str(run_dir)}) + "\n").encode())
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"ingest worker exited with {await self.proc.wait()}")
        return outcome_of(json.loads(line))

    def _signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def pause(self) -> None:
        if not self.paused:
            self._signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused:
            self._signal(signal.SIGCONT)
            self.paused = False

    async def close(self) -> None:
        self.resume()
        if self.proc is None:
            return
        if self._ready is not None and not self._ready.done():
            self._ready.cancel()
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self._signal(signal.SIGKILL)
            await self.proc.wait()


if __name__ == "__main__":
    main()
