"""The queries behind `tcplab serve`: the run list (filters, paging, sort), a run's stored rows, a plan's runs.

`RunFilter.parse` and `run_select` / `count_select` are pure (query parameters in, SQLAlchemy statements out) and
unit-tested without a server; the readers run them. Every query is bounded: the run list reads one page of
`run` rows (indexed columns only, never a per-packet table), the per-page lookups (kernel, campaign) are keyed by
that page's run ids, and the filter choices are capped at MAX_CHOICES values.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import urlencode

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from orchestrator.storage import tables as T
from orchestrator.storage.campaign_tables import campaign, campaign_run, trial
from schemas.flag import Flag

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
MAX_CHOICES = 500          # values offered per filter drop-down
MAX_ROWS = 2000            # rows of one kind shown on a detail page (artifacts, evidence, events, ...)
SORTS = {"time": "newest first", "time-asc": "oldest first", "id": "run id"}
TEXT_FILTERS = ("plan", "experiment", "status", "tag", "variant", "release", "campaign")


@dataclass(frozen=True)
class RunFilter:
    """What the run list shows: every field empty means every run."""

    plan: str = ""
    experiment: str = ""
    status: str = ""
    tag: str = ""
    variant: str = ""          # kernel variant of any of the run's hosts (run_host.variant)
    release: str = ""          # uname -r of any of the run's hosts (run_host.release)
    campaign: str = ""
    night: int | None = None   # with campaign: that night only
    page: int = 1
    size: int = DEFAULT_PAGE_SIZE
    sort: str = "time"

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> tuple[RunFilter, list[str]]:
        """The filter from URL query parameters and what was wrong with them (bad values are ignored)."""
        problems: list[str] = []
        text = {k: str(params.get(k, "")).strip()[:200] for k in TEXT_FILTERS}

        def integer(key: str, default: int | None, lo: int, hi: int) -> int | None:
            raw = str(params.get(key, "")).strip()
            if not raw:
                return default
            try:
                value = int(raw)
            except ValueError:
                problems.append(f"{key}: {raw[:40]!r} is not a whole number")
                return default
            if not lo <= value <= hi:
                problems.append(f"{key}: {value} is outside {lo}..{hi}")
                return min(max(value, lo), hi)
            return value

        sort = str(params.get("sort", "time"))
        if sort not in SORTS:
            problems.append(f"sort: {sort[:40]!r} is not one of {', '.join(SORTS)}")
            sort = "time"
        f = cls(**text, night=integer("night", None, 1, 10**9), page=integer("page", 1, 1, 10**9) or 1,
                size=integer("size", DEFAULT_PAGE_SIZE, 1, MAX_PAGE_SIZE) or DEFAULT_PAGE_SIZE, sort=sort)
        return f, problems

    def query(self, **changes: Any) -> str:
        """The URL query string of this filter with some fields changed (defaults left out)."""
        values = asdict(replace(self, **changes))
        default = asdict(RunFilter())
        return urlencode({k: v for k, v in values.items() if v not in (None, "") and v != default[k]})

    @property
    def active(self) -> dict[str, str]:
        """The filters set (for the page's summary line)."""
        out = {k: getattr(self, k) for k in TEXT_FILTERS if getattr(self, k)}
        if self.night is not None:
            out["night"] = str(self.night)
        return out


def _like_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def tag_condition(tag: str) -> sa.ColumnElement[bool]:
    """run.tags (a JSON list of strings) contains `tag`: a LIKE on its JSON text, the same on SQLite and
    PostgreSQL (json.dumps writes every tag as "tag")."""
    import json

    needle = json.dumps(tag)
    return sa.cast(T.run.c.tags, sa.Text).like(f"%{_like_escape(needle)}%", escape="\\")


def conditions(f: RunFilter) -> list[sa.ColumnElement[bool]]:
    """The WHERE conditions of a filter over the `run` table."""
    r = T.run
    out: list[sa.ColumnElement[bool]] = []
    for value, column in ((f.plan, r.c.plan_name), (f.experiment, r.c.experiment), (f.status, r.c.status)):
        if value:
            out.append(column == value)
    if f.tag:
        out.append(tag_condition(f.tag))
    h = T.run_host
    for value, column in ((f.variant, h.c.variant), (f.release, h.c.release)):
        if value:
            out.append(sa.exists().where(h.c.run_id == r.c.run_id, column == value))
    if f.campaign:
        night = [campaign_run.c.night == f.night] if f.night is not None else []
        out.append(sa.exists().where(trial.c.run_id == r.c.run_id, trial.c.campaign_run_id == campaign_run.c.id,
                                     campaign_run.c.campaign == f.campaign, *night))
    return out


LIST_COLUMNS = ("run_id", "plan_name", "experiment", "repetition", "status", "started_at", "finished_at",
                "duration_s", "tags", "flags", "params", "error")


def run_select(f: RunFilter) -> sa.Select:
    """One page of runs matching the filter, sorted."""
    r = T.run
    order = {"time": [r.c.started_at.desc().nulls_last(), r.c.run_id],
             "time-asc": [r.c.started_at.asc().nulls_last(), r.c.run_id],
             "id": [r.c.run_id]}[f.sort]
    return (sa.select(*(r.c[c] for c in LIST_COLUMNS)).where(*conditions(f)).order_by(*order)
            .limit(f.size).offset((f.page - 1) * f.size))


def count_select(f: RunFilter) -> sa.Select:
    return sa.select(sa.func.count()).select_from(T.run).where(*conditions(f))


def status_counts_select(f: RunFilter) -> sa.Select:
    """Runs per status among those matching the filter (the status filter itself left out)."""
    r = T.run
    return (sa.select(r.c.status, sa.func.count()).where(*conditions(replace(f, status="")))
            .group_by(r.c.status).order_by(r.c.status))


def flag_text(stored: Any) -> str:
    return str(Flag.from_stored(stored))


@dataclass(frozen=True)
class RunPage:
    rows: list[dict[str, Any]]
    total: int
    status_counts: dict[str, int]
    kernels: dict[str, list[str]]          # run id -> "host: variant release" of each host
    campaigns: dict[str, str]              # run id -> "campaign night N, variant"

    def pages(self, size: int) -> int:
        return max(1, -(-self.total // size))


def compact_kernels(lines: list[str]) -> list[str]:
    """'host: variant release' per host, or one 'N hosts: variant release' line when every host ran the same."""
    kernels = {line.partition(": ")[2] for line in lines}
    return [f"{len(lines)} hosts: {kernels.pop()}"] if len(lines) > 1 and len(kernels) == 1 else lines


def run_page(conn: Connection, f: RunFilter) -> RunPage:
    rows = [dict(x._mapping) for x in conn.execute(run_select(f))]
    ids = [x["run_id"] for x in rows]
    kernels: dict[str, list[str]] = {}
    campaigns: dict[str, str] = {}
    if ids:
        h = T.run_host
        for x in conn.execute(sa.select(h.c.run_id, h.c.host, h.c.variant, h.c.release)
                              .where(h.c.run_id.in_(ids)).order_by(h.c.run_id, h.c.host)):
            kernels.setdefault(x.run_id, []).append(f"{x.host}: {x.variant or '-'} {x.release or ''}".strip())
        kernels = {k: compact_kernels(v) for k, v in kernels.items()}
        for x in conn.execute(sa.select(trial.c.run_id, trial.c.variant, campaign_run.c.campaign, campaign_run.c.night)
                              .join(campaign_run, campaign_run.c.id == trial.c.campaign_run_id)
                              .where(trial.c.run_id.in_(ids))):
            campaigns[x.run_id] = f"{x.campaign} night {x.night}, {x.variant}"
    for x in rows:
        x["flags"] = [flag_text(s) for s in (x["flags"] or [])[:50]]
        x["tags"] = [str(t) for t in (x["tags"] or [])[:50]]
    counts = {s: n for s, n in conn.execute(status_counts_select(f))}
    return RunPage(rows, conn.execute(count_select(f)).scalar() or 0, counts, kernels, campaigns)


def choices(conn: Connection, f: RunFilter) -> dict[str, list[Any]]:
    """The values each filter drop-down offers (at most MAX_CHOICES each)."""
    r, h = T.run, T.run_host

    def distinct(column: sa.ColumnElement, *where: sa.ColumnElement[bool]) -> list[Any]:
        stmt = sa.select(column).where(column.is_not(None), *where).distinct().order_by(column).limit(MAX_CHOICES)
        return [v for (v,) in conn.execute(stmt)]

    out = {"plan": distinct(r.c.plan_name), "experiment": distinct(r.c.experiment), "status": distinct(r.c.status),
           "variant": distinct(h.c.variant), "release": distinct(h.c.release),
           "campaign": distinct(campaign.c.name), "night": []}
    if f.campaign:
        out["night"] = distinct(campaign_run.c.night, campaign_run.c.campaign == f.campaign)
    return out


# ---------------------------------------------------------------------------- one run

def _rows(conn: Connection, table: sa.Table, run_id: str, order: Sequence[str]) -> list[dict[str, Any]]:
    stmt = (sa.select(table).where(table.c.run_id == run_id).order_by(*(table.c[c] for c in order))
            .limit(MAX_ROWS))
    return [dict(x._mapping) for x in conn.execute(stmt)]


def run_detail(conn: Connection, run_id: str) -> dict[str, Any] | None:
    """Everything stored about one run but its per-packet rows; None if there is no such run."""
    row = conn.execute(sa.select(T.run).where(T.run.c.run_id == run_id)).first()
    if row is None:
        return None
    run = dict(row._mapping)
    run["flags"] = [flag_text(s) for s in run["flags"] or []]
    plan = None
    if run["plan_sha256"]:
        p = conn.execute(sa.select(T.plan.c.name, T.plan.c.path, T.plan.c.plan_sha256)
                         .where(T.plan.c.plan_sha256 == run["plan_sha256"])).first()
        plan = dict(p._mapping) if p else None
    camp = conn.execute(
        sa.select(trial.c.variant, trial.c.cell_label, trial.c.repetition, trial.c.attempt, trial.c.status,
                  campaign_run.c.campaign, campaign_run.c.night)
        .join(campaign_run, campaign_run.c.id == trial.c.campaign_run_id).where(trial.c.run_id == run_id)).first()
    return {
        "run": run, "plan": plan, "trial": dict(camp._mapping) if camp else None,
        "flows": _rows(conn, T.flow, run_id, ["flow_id"]),
        "hosts": _rows(conn, T.run_host, run_id, ["host"]),
        "evidence": _rows(conn, T.host_evidence, run_id, ["host", "phase"]),
        "artifacts": _rows(conn, T.artifact, run_id, ["host", "name"]),
        "events": _rows(conn, T.run_event, run_id, ["event_index"]),
        "captures": _rows(conn, T.capture_point, run_id, ["point_id"]),
        "qdelay_pairs": _rows(conn, T.qdelay_pair, run_id, ["ingress", "egress"]),
    }


# ---------------------------------------------------------------------------- plans

def plan_summary(conn: Connection, name: str) -> dict[str, Any] | None:
    """A plan's stored versions (newest first) and its runs counted by experiment and status."""
    p, r = T.plan, T.run
    versions = [dict(x._mapping) for x in conn.execute(
        sa.select(p).where(p.c.name == name).order_by(p.c.created_at.desc()).limit(20))]
    counts = [dict(x._mapping) for x in conn.execute(
        sa.select(r.c.experiment, r.c.status, sa.func.count().label("runs"), sa.func.min(r.c.started_at)
                  .label("first"), sa.func.max(r.c.started_at).label("last"))
        .where(r.c.plan_name == name).group_by(r.c.experiment, r.c.status)
        .order_by(r.c.experiment, r.c.status).limit(MAX_ROWS))]
    if not versions and not counts:
        return None
    return {"name": name, "versions": versions, "counts": counts}


def plan_names(conn: Connection) -> list[str]:
    r = T.run
    return [v for (v,) in conn.execute(sa.select(r.c.plan_name).distinct().order_by(r.c.plan_name)
                                       .limit(MAX_CHOICES))]


def campaign_names(conn: Connection) -> list[str]:
    return [v for (v,) in conn.execute(sa.select(campaign.c.name).order_by(campaign.c.name).limit(MAX_CHOICES))]


def campaign_row(conn: Connection, name: str) -> dict[str, Any] | None:
    row = conn.execute(sa.select(campaign).where(campaign.c.name == name)).first()
    return dict(row._mapping) if row else None
