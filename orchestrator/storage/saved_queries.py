"""Named saved queries (`tcplab query --name NAME [--param k=v ...]`, docs/database.md "Saved queries").

Every query lives here, once: a name, a description, typed parameters and SQL over the views
(orchestrator/storage/views.py), so one text runs on SQLite and PostgreSQL. Parameters are always bound (`:name`),
never formatted into the SQL; an optional parameter is NULL when not given, and the SQL tests it as
`CAST(:p AS type) IS NULL` (PostgreSQL must know a parameter's type to compare it with NULL).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class SavedQueryError(ValueError):
    """An unknown query name or a bad parameter; the message names it."""


@dataclass(frozen=True)
class Param:
    name: str
    type: type          # int, float or str
    help: str
    default: int | float | str | None = None   # None: optional, NULL when not given


@dataclass(frozen=True)
class SavedQuery:
    name: str
    description: str
    sql: str
    params: tuple[Param, ...] = ()


_PLAN = Param("plan", str, "only runs of this plan (run.plan_name)")
_PLAN_FILTER = "(CAST(:plan AS VARCHAR(200)) IS NULL OR r.plan_name = :plan)"

QUERIES: dict[str, SavedQuery] = {q.name: q for q in (
    SavedQuery(
        "runs", "stored runs with their variant, kernel release and provenance, oldest first",
        "SELECT r.run_id, r.plan_name, r.experiment, r.arm, r.variant, r.kernel_release, r.status, r.run_by, "
        "r.testbed, r.tcplab_commit, r.plan_commit, r.started_at FROM v_run r "
        f"WHERE {_PLAN_FILTER} AND (CAST(:status AS VARCHAR(20)) IS NULL OR r.status = :status) "
        "ORDER BY r.started_at, r.run_id LIMIT :limit",
        (_PLAN, Param("status", str, "complete, failed or refused"),
         Param("limit", int, "at most this many runs", 1000))),
    SavedQuery(
        "qdelay-by-variant", "per-packet queue delay (µs) by plan, experiment and variant: runs, mean of the runs' "
        "median and p99, worst p99 (complete runs with paired captures)",
        "SELECT r.plan_name, r.experiment, r.variant, count(*) AS runs, avg(q.qdelay_us_p50) AS p50_us_mean, "
        "avg(q.qdelay_us_p99) AS p99_us_mean, max(q.qdelay_us_p99) AS p99_us_max "
        "FROM v_run r JOIN v_run_qdelay q ON q.run_id = r.run_id "
        f"WHERE r.status = 'complete' AND {_PLAN_FILTER} "
        "GROUP BY r.plan_name, r.experiment, r.variant ORDER BY r.plan_name, r.experiment, r.variant",
        (_PLAN,)),
    SavedQuery(
        "latecomer-fairness", "runs whose flows start at different times: Jain's index of the flows' iperf3 goodput "
        "and the smallest/largest goodput ratio, by plan, experiment and variant (each flow's goodput is over its "
        "own reporting span; `tcplab report` has the analysis-window version)",
        "WITH per_run AS (SELECT f.run_id, count(*) AS flows, count(DISTINCT f.start_s) AS starts, "
        "sum(f.goodput_bps) AS total, sum(f.goodput_bps * f.goodput_bps) AS squares, "
        "min(f.goodput_bps) AS lowest, max(f.goodput_bps) AS highest "
        "FROM v_flow f WHERE f.status = 'complete' AND f.goodput_bps IS NOT NULL GROUP BY f.run_id) "
        "SELECT r.plan_name, r.experiment, r.variant, count(*) AS runs, "
        "CAST(avg(p.flows) AS DOUBLE PRECISION) AS flows, "
        "avg(p.total * p.total / (p.flows * p.squares)) AS jain_mean, "
        "min(p.total * p.total / (p.flows * p.squares)) AS jain_min, avg(p.lowest / p.highest) AS goodput_ratio_mean "
        "FROM per_run p JOIN v_run r ON r.run_id = p.run_id "
        f"WHERE p.starts > 1 AND p.flows >= :min_flows AND {_PLAN_FILTER} "
        "GROUP BY r.plan_name, r.experiment, r.variant ORDER BY r.plan_name, r.experiment, r.variant",
        (_PLAN, Param("min_flows", int, "only runs with at least this many flows", 2))),
    SavedQuery(
        "campaign-verdicts", "campaign verdicts per night, cell and variant (ratio = candidate/baseline median)",
        "SELECT v.campaign, v.night, v.label, v.cell_label, v.variant, v.metric, v.kind, v.verdict, v.ratio, "
        "v.p_adjusted FROM v_campaign_verdict v "
        "WHERE (CAST(:campaign AS VARCHAR(64)) IS NULL OR v.campaign = :campaign) "
        "AND (CAST(:night AS INTEGER) IS NULL OR v.night = :night) "
        "ORDER BY v.campaign, v.night, v.check_index, v.cell_label, v.variant",
        (Param("campaign", str, "only this campaign"), Param("night", int, "only this night (1, 2, ...)"))),
)}


def saved_query(name: str) -> SavedQuery:
    if name not in QUERIES:
        raise SavedQueryError(f"--name {name!r}: no saved query of that name; there are {', '.join(QUERIES)}")
    return QUERIES[name]


def parse_assignments(items: Sequence[str]) -> dict[str, str]:
    """`k=v` strings (from --param) as a dict; a repeated key keeps the last value."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SavedQueryError(f"--param {item!r}: expected NAME=VALUE")
        out[key.strip()] = value
    return out


def _convert(query: SavedQuery, param: Param, raw: str) -> int | float | str:
    try:
        return param.type(raw)
    except ValueError:
        raise SavedQueryError(f"--param {param.name}={raw!r}: query {query.name} wants "
                              f"{'an integer' if param.type is int else 'a number'}") from None


def bind(query: SavedQuery, given: Mapping[str, str]) -> dict[str, int | float | str | None]:
    """Every parameter of the query with its value: given (converted to its type), else its default (or NULL)."""
    known = {p.name: p for p in query.params}
    unknown = sorted(set(given) - set(known))
    if unknown:
        names = ", ".join(known) or "none"
        raise SavedQueryError(f"--param {unknown[0]}: query {query.name} has no such parameter (it takes {names})")
    return {p.name: _convert(query, p, given[p.name]) if p.name in given else p.default for p in query.params}


def describe(query: SavedQuery) -> str:
    lines = [f"{query.name}: {query.description}"]
    for p in query.params:
        default = "" if p.default is None else f", default {p.default}"
        lines.append(f"    --param {p.name}=<{p.type.__name__}>  {p.help}{default}")
    return "\n".join(lines)
