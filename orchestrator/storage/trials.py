"""Campaign state in the database (effects): the campaign row, its nights, their trials and metric values.

The one rule that makes a trial trustworthy lives in `settle`: write_run calls it inside the transaction that
stores the run, its artifact rows (each with its sha256) and everything parsed from them, so a trial is `ok`
exactly when its run is in the database — a manager killed before the commit leaves it `running`, which
`requeue_running` puts back to `pending` on resume, and a run re-ingested later cannot make a second sample
(only a pending or running trial is settled).
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, insert, select, update

from orchestrator.storage.campaign_tables import RUN_TO_TRIAL, campaign, campaign_run, trial, trial_metric
from orchestrator.storage.db import writer

OPEN = ("pending", "running")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def settle(conn: Connection, run: dict[str, Any], hosts: Sequence[dict[str, Any]],
           artifacts: Sequence[dict[str, Any]]) -> int:
    """Inside write_run's transaction: the open trial of this run id takes the run's status (complete -> ok),
    the hosts' releases and boot ids and the artifacts' sha256. Returns the trials settled (0 or 1)."""
    status = RUN_TO_TRIAL.get(run.get("status", ""), "failed")
    values = {"status": status, "error": run.get("error"), "finished_at": _now(),
              "releases": {h["host"]: h.get("release") for h in hosts},
              "boot_ids": {h["host"]: h.get("boot_id") for h in hosts},
              "artifacts": [{"host": a.get("host"), "name": a.get("name"), "sha256": a.get("sha256")}
                            for a in artifacts]}
    res = conn.execute(update(trial).where(and_(trial.c.run_id == run["run_id"], trial.c.status.in_(OPEN)))
                       .values(**values))
    return res.rowcount or 0


def save_campaign(engine: Engine, name: str, sha256: str, path: str, text: str) -> None:
    with writer(engine).begin() as conn:
        values = {"sha256": sha256, "path": path, "text": text, "updated_at": _now()}
        if conn.execute(select(campaign.c.name).where(campaign.c.name == name)).first():
            conn.execute(update(campaign).where(campaign.c.name == name).values(**values))
        else:
            conn.execute(insert(campaign).values(name=name, **values))


def open_night(engine: Engine, name: str) -> dict[str, Any] | None:
    """The campaign's unfinished night (the one `resume` finishes), if any."""
    with engine.connect() as conn:
        row = conn.execute(select(campaign_run).where(campaign_run.c.campaign == name, campaign_run.c.status ==
                                                      "running").order_by(campaign_run.c.night.desc())).first()
    return dict(row._mapping) if row else None


def start_night(engine: Engine, name: str, sha256: str, label: str | None) -> dict[str, Any]:
    with writer(engine).begin() as conn:
        last = conn.execute(select(func.max(campaign_run.c.night)).where(campaign_run.c.campaign == name)).scalar()
        night = (last or 0) + 1
        now = _now()
        values = {"campaign": name, "night": night, "label": label or now.strftime("%Y-%m-%d %H:%M"),
                  "campaign_sha256": sha256, "status": "running", "started_at": now}
        night_id = conn.execute(insert(campaign_run).values(**values)).inserted_primary_key[0]
    return {"id": night_id, **values}


def finish_night(engine: Engine, night_id: int, exit_code: int, summary: dict[str, Any]) -> None:
    with writer(engine).begin() as conn:
        conn.execute(update(campaign_run).where(campaign_run.c.id == night_id).values(
            status="done", finished_at=_now(), exit_code=exit_code, summary=summary))


def nights(engine: Engine, name: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(select(campaign_run).where(campaign_run.c.campaign == name)
                            .order_by(campaign_run.c.night)).all()
    return [dict(r._mapping) for r in rows]


def add_trials(engine: Engine, rows: Iterable[dict[str, Any]]) -> int:
    rows = list(rows)
    if rows:
        with writer(engine).begin() as conn:
            conn.execute(insert(trial), [{"status": "pending", **r} for r in rows])
    return len(rows)


def trials(engine: Engine, night_ids: Sequence[int]) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(select(trial).where(trial.c.campaign_run_id.in_(list(night_ids)))
                            .order_by(trial.c.campaign_run_id, trial.c.seq, trial.c.id)).all()
    return [dict(r._mapping) for r in rows]


def mark_running(engine: Engine, trial_id: int, manager: str) -> bool:
    """pending -> running (False: it was not pending any more)."""
    with writer(engine).begin() as conn:
        res = conn.execute(update(trial).where(trial.c.id == trial_id, trial.c.status == "pending")
                           .values(status="running", manager=manager, started_at=_now()))
    return bool(res.rowcount)


def mark_unsettled(engine: Engine, trial_id: int, status: str, error: str | None) -> None:
    """A trial whose run never reached the database (refused without a record, infrastructure error)."""
    with writer(engine).begin() as conn:
        conn.execute(update(trial).where(trial.c.id == trial_id, trial.c.status.in_(OPEN))
                     .values(status=status, error=error, finished_at=_now()))


def requeue_running(engine: Engine, night_id: int) -> int:
    """Trials a killed manager left `running` go back to `pending` (their run was never stored)."""
    with writer(engine).begin() as conn:
        res = conn.execute(update(trial).where(trial.c.campaign_run_id == night_id, trial.c.status == "running")
                           .values(status="pending", manager=None, started_at=None))
    return res.rowcount or 0


def save_metrics(engine: Engine, values: dict[int, dict[str, float]]) -> None:
    """trial id -> metric -> value (NaN stored as NULL); replaces what the trial had."""
    if not values:
        return
    with writer(engine).begin() as conn:
        conn.execute(trial_metric.delete().where(trial_metric.c.trial_id.in_(list(values))))
        rows = [{"trial_id": t, "metric": m, "value": None if v != v else v}
                for t, vals in values.items() for m, v in vals.items()]
        if rows:
            conn.execute(insert(trial_metric), rows)


def metrics(engine: Engine, trial_ids: Sequence[int]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    with engine.connect() as conn:
        for tid, metric, value in conn.execute(select(trial_metric).where(trial_metric.c.trial_id.in_(
                list(trial_ids)))):
            out.setdefault(tid, {})[metric] = float("nan") if value is None else value
    return out
