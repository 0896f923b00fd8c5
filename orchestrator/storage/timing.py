"""The run row's `timing` (orchestrator/engine/timing.py), completed once the run's ingest is over."""
from __future__ import annotations

from sqlalchemy import Engine, update

from orchestrator.storage import tables


def store_timing(db: Engine, run_id: str, timing: dict) -> None:
    with db.begin() as conn:
        conn.execute(update(tables.run).where(tables.run.c.run_id == run_id).values(timing=timing))
