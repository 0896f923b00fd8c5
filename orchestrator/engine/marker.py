"""The unfinished-run marker: results/<run-id>/RUNNING, written before the engine touches any host and removed
only once the run is in the database. What a marker found at startup means depends on its phase:

- `running`: the manager that wrote it stopped (killed, crashed, power lost) while hosts were configured or
  tasks ran; nothing about the run was recorded. Recovery resets every host and records it as failed.
- `ingest`: the run ended and its RunRecord (ingest.json) is on disk, but the database write did not happen
  (database unreachable, manager stopped while parsing). Recovery ingests it again.

The marker carries the writing manager's pid, so a second manager never takes over a run that is still alive.
"""
from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.atomic import write_atomic

MARKER_FILE = "RUNNING"
RUNNING, INGEST = "running", "ingest"


@dataclass(frozen=True)
class RunMarker:
    run_dir: Path
    phase: str
    pid: int
    started_at: dt.datetime
    hosts: list[str]
    plan: dict[str, Any] | None

    @property
    def run_id(self) -> str:
        return self.run_dir.name


def write(run_dir: Path, phase: str, started_at: dt.datetime, hosts: list[str], plan: dict[str, Any] | None) -> None:
    """Write (or move to `phase`) the run's marker; atomic, so a reader never sees half a marker."""
    doc = {"phase": phase, "pid": os.getpid(), "started_at": started_at.isoformat(), "hosts": hosts,
           "plan": {k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in (plan or {}).items()}
           if plan else None}
    write_atomic(run_dir / MARKER_FILE, json.dumps(doc, indent=1))


def clear(run_dir: Path) -> None:
    (run_dir / MARKER_FILE).unlink(missing_ok=True)


def read(run_dir: Path) -> RunMarker | None:
    try:
        doc = json.loads((run_dir / MARKER_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):   # a torn or foreign file: the run is unfinished, whoever wrote it
        doc = {}
    plan = doc.get("plan")
    if plan and plan.get("created_at"):
        plan["created_at"] = dt.datetime.fromisoformat(plan["created_at"])
    started = doc.get("started_at")
    return RunMarker(run_dir=run_dir, phase=doc.get("phase", RUNNING), pid=int(doc.get("pid") or 0),
                     started_at=dt.datetime.fromisoformat(started) if started else dt.datetime.now(dt.UTC),
                     hosts=list(doc.get("hosts") or []), plan=plan)


def unfinished(results_dir: Path) -> list[RunMarker]:
    """Every marker under results_dir, oldest first."""
    if not results_dir.is_dir():
        return []
    found = [read(d) for d in results_dir.iterdir() if (d / MARKER_FILE).is_file()]
    return sorted((m for m in found if m is not None), key=lambda m: m.started_at)


def writer_alive(m: RunMarker) -> bool:
    """Whether the manager that wrote the marker still runs (another process than this one, not a zombie)."""
    if m.pid <= 0 or m.pid == os.getpid():
        return False
    try:
        stat = Path(f"/proc/{m.pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
