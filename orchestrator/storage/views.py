"""The views for the common questions (docs/database.md), one definition each for SQLite and PostgreSQL.

Each view is plain SQL built by one function of the dialect name; only three fragments differ between the
backends: reading a JSON key, joining strings, and percentiles. PostgreSQL has `percentile_cont`; SQLite has no
percentile function, so there the same linear interpolation (numpy's default: position h = (n - 1) p between the
sorted values floor(h) and floor(h) + 1) is computed from window functions. Both therefore return the same
numbers (tests/db/test_db_views.py checks both against numpy).

Migration 0016 creates the views from this module. Changing a view means a new migration that calls
`create_views` again (it drops and recreates them all); a migration that alters a column a view reads drops the
views first (`drop_views`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

PERCENTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
DOUBLE = "DOUBLE PRECISION"   # both backends accept it in CAST (SQLite: REAL affinity)


def json_text(dialect: str, column: str, key: str) -> str:
    """The value of a top-level JSON key as SQL text/number (NULL when absent)."""
    if dialect == "postgresql":
        return f"({column} ->> '{key}')"
    return f"json_extract({column}, '$.{key}')"


def joined(dialect: str, expr: str) -> str:
    """The distinct non-NULL values of `expr` in a group, sorted, joined with ','."""
    if dialect == "postgresql":
        return f"string_agg(DISTINCT {expr}, ',' ORDER BY {expr})"
    return f"group_concat(DISTINCT {expr})"   # SQLite: no ORDER BY here; the source is sorted (see v_run)


def summary_stats(dialect: str, source: str, keys: Sequence[str], value: str = "v", scale: float = 1.0) -> str:
    """SELECT keys, n, mean, min, max and PERCENTILES of `value` over the rows of `source` (a subquery with the
    keys and the value) grouped by the keys, each divided by `scale`; NULL values are left out."""
    k = ", ".join(keys)
    s = f"/ {scale!r}"
    common = (f"count(*) AS n, CAST(avg({value}) AS {DOUBLE}) {s} AS mean, CAST(min({value}) AS {DOUBLE}) {s} AS min, "
              f"CAST(max({value}) AS {DOUBLE}) {s} AS max")
    if dialect == "postgresql":
        pcts = ", ".join(f"percentile_cont({p}) WITHIN GROUP (ORDER BY {value}) {s} AS {name}"
                         for name, p in PERCENTILES)
        return f"SELECT {k}, {common}, {pcts} FROM ({source}) src WHERE {value} IS NOT NULL GROUP BY {k}"

    def interpolated(p: float) -> str:
        h = f"((n - 1) * {p})"
        lo = f"CAST({h} AS INTEGER)"     # h >= 0, so truncation is floor
        frac = f"({h} - {lo})"
        return f"sum(CASE WHEN i = {lo} THEN {value} * (1 - {frac}) WHEN i = {lo} + 1 THEN {value} * {frac} ELSE 0 END)"

    pcts = ", ".join(f"CAST({interpolated(p)} AS {DOUBLE}) {s} AS {name}" for name, p in PERCENTILES)
    ranked = (f"SELECT {k}, {value}, row_number() OVER (PARTITION BY {k} ORDER BY {value}) - 1 AS i, "
              f"count(*) OVER (PARTITION BY {k}) AS n FROM ({source}) src WHERE {value} IS NOT NULL")
    common = common.replace("count(*) AS n", "max(n) AS n")
    return f"SELECT {k}, {common}, {pcts} FROM ({ranked}) ranked GROUP BY {k}"


def v_run(dialect: str) -> str:
    # run_host sorted first so that SQLite's group_concat joins in host order too
    hosts = "(SELECT * FROM run_host ORDER BY run_id, host)"
    kernels = (f"SELECT run_id, {joined(dialect, 'variant')} AS kernel_variant, "
               f"{joined(dialect, 'release')} AS kernel_release FROM {hosts} h GROUP BY run_id")
    return f"""SELECT r.run_id, r.run_key, r.plan_name, r.plan_sha256, p.path AS plan_path, r.experiment,
  {json_text(dialect, 'r.params', 'arm')} AS arm, r.repetition, r.seed, r.status, r.profile,
  coalesce(t.variant, k.kernel_variant) AS variant, t.variant AS campaign_variant, k.kernel_variant,
  k.kernel_release, r.params, r.tags, r.duration_s, r.t0_ns, r.started_at, r.finished_at, r.error,
  r.run_by, r.testbed, r.tcplab_version, r.tcplab_commit, r.plan_commit
FROM run r
LEFT JOIN plan p ON p.plan_sha256 = r.plan_sha256
LEFT JOIN ({kernels}) k ON k.run_id = r.run_id
LEFT JOIN trial t ON t.run_id = r.run_id"""


def v_flow(dialect: str) -> str:
    iperf = ("SELECT run_id, flow_id, count(*) AS iperf_intervals, CAST(sum(bytes) AS BIGINT) AS iperf_bytes, "
             f"CAST(sum(bytes) AS {DOUBLE}) * 8 / nullif(max(end_s) - min(start_s), 0) AS goodput_bps, "
             f"CAST(sum(retransmits) AS BIGINT) AS retransmits, CAST(avg(rtt_us) AS {DOUBLE}) AS iperf_rtt_mean_us "
             "FROM iperf_interval GROUP BY run_id, flow_id")
    return f"""SELECT f.run_id, r.plan_name, r.experiment, r.status, f.flow_id, f.src_host, f.dst_host, f.src_addr,
  f.dst_addr, f.src_port, f.dst_port, f.cc, f.tool, f.start_s, f.duration_s, f.ack_ratio,
  i.iperf_intervals, i.iperf_bytes, i.goodput_bps, i.retransmits, i.iperf_rtt_mean_us
FROM flow f
JOIN run r ON r.run_id = f.run_id
LEFT JOIN ({iperf}) i ON i.run_id = f.run_id AND i.flow_id = f.flow_id"""


def _per_run(dialect: str, table: str, value: str, scale: float, prefix: str, extra: str = "") -> str:
    stats = summary_stats(dialect, f"SELECT run_key, {value} AS v FROM {table}", ["run_key"], scale=scale)
    names = ["n", "mean", "min", "max", *(n for n, _ in PERCENTILES)]
    cols = ", ".join(f"s.{c} AS {prefix}_{c}" if c != "n" else f"s.n AS {prefix}_samples" for c in names)
    return f"SELECT r.run_id, r.run_key, {cols}{extra}\nFROM run r JOIN ({stats}) s ON s.run_key = r.run_key"


def v_run_qdelay(dialect: str) -> str:
    counts = "SELECT run_key, count(*) AS packets, sum(dropped) AS dropped, sum(ce) AS ce FROM qdelay GROUP BY run_key"
    sql = _per_run(dialect, "qdelay", "sojourn_ns", 1000.0, "qdelay_us", ", c.packets, c.dropped, c.ce")
    return sql + f"\nJOIN ({counts}) c ON c.run_key = r.run_key"


def v_run_rtt(dialect: str) -> str:
    return _per_run(dialect, "tcp_probe", "srtt_us", 1.0, "srtt_us")


def v_campaign_verdict(dialect: str) -> str:
    def num(key: str) -> str:
        return f"CAST({json_text(dialect, 'v.detail', key)} AS {DOUBLE})"

    return f"""SELECT c.campaign, c.night, c.label, c.started_at, v.campaign_run_id, v.check_index, v.cell_key,
  {json_text(dialect, 'v.detail', 'cell_label')} AS cell_label, v.variant, v.metric, v.kind, v.verdict,
  {num('median_base')} AS median_base, {num('median_cand')} AS median_cand, {num('ratio')} AS ratio,
  {num('p_adjusted')} AS p_adjusted, v.detail
FROM campaign_verdict v JOIN campaign_run c ON c.id = v.campaign_run_id"""


def v_campaign_trend(dialect: str) -> str:
    source = ("SELECT t.campaign_run_id, t.cell_key, t.cell_label, t.variant, m.metric, m.value AS v "
              "FROM trial t JOIN trial_metric m ON m.trial_id = t.id WHERE t.status = 'ok'")
    stats = summary_stats(dialect, source, ["campaign_run_id", "cell_key", "cell_label", "variant", "metric"])
    return f"""SELECT c.campaign, c.night, c.label, c.started_at, s.cell_key, s.cell_label, s.variant, s.metric,
  s.n, s.p50 AS median, s.mean, s.min, s.max
FROM ({stats}) s JOIN campaign_run c ON c.id = s.campaign_run_id"""


VIEWS: dict[str, Callable[[str], str]] = {
    "v_run": v_run, "v_flow": v_flow, "v_run_qdelay": v_run_qdelay, "v_run_rtt": v_run_rtt,
    "v_campaign_verdict": v_campaign_verdict, "v_campaign_trend": v_campaign_trend,
}


def create_views(bind) -> None:
    """(Re)create every view on a SQLAlchemy connection (a migration's op.get_bind())."""
    drop_views(bind)
    for name, definition in VIEWS.items():
        bind.exec_driver_sql(f"CREATE VIEW {name} AS {definition(bind.dialect.name)}")


def drop_views(bind) -> None:
    for name in reversed(list(VIEWS)):
        bind.exec_driver_sql(f"DROP VIEW IF EXISTS {name}")
