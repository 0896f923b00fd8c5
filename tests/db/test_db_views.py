"""The views (orchestrator/storage/views.py) on SQLite and PostgreSQL: same rows, percentiles equal to numpy's."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from dbdata import make_run_ingest
from sqlalchemy import inspect, text

from orchestrator.storage import tables
from orchestrator.storage.campaign_tables import campaign, campaign_run, campaign_verdict, trial, trial_metric
from orchestrator.storage.views import VIEWS
from orchestrator.storage.writer import write_run

NOW = dt.datetime(2026, 11, 27, 2, 0, tzinfo=dt.UTC)


def _rows(engine, sql: str, **params) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), params)]


def test_every_view_exists(engine) -> None:
    assert set(VIEWS) <= set(inspect(engine).get_view_names())


def test_v_run_carries_plan_kernel_and_provenance(engine) -> None:
    ingest = make_run_ingest("v-0001", n_packets=1_000)
    run = {**ingest.run, "params": {"arm": "dctcp"}, "run_by": "alice", "testbed": "physical:mgr1",
           "tcplab_version": "0.1.0", "tcplab_commit": "v0.1-3-gabc", "plan_commit": "f" * 40 + "-dirty"}
    hosts = [{**h, "variant": "prr-fix" if h["host"] == "aqm" else "vanilla-6.1"} for h in ingest.hosts]
    write_run(engine, make_run_ingest("v-0001", n_packets=1_000).__class__(**{**ingest.__dict__, "run": run,
                                                                               "hosts": hosts}))
    (row,) = _rows(engine, "SELECT * FROM v_run")
    assert row["run_id"] == "v-0001" and row["plan_path"] == "experiments/quickstart.yaml"
    assert row["arm"] == "dctcp"
    assert row["kernel_variant"] == "prr-fix,vanilla-6.1" and row["variant"] == "prr-fix,vanilla-6.1"
    assert row["kernel_release"] == "6.1.0-50-amd64"
    assert (row["run_by"], row["testbed"], row["tcplab_commit"], row["plan_commit"]) == (
        "alice", "physical:mgr1", "v0.1-3-gabc", "f" * 40 + "-dirty")


def test_v_flow_goodput_from_iperf(engine) -> None:
    ingest = make_run_ingest("v-0002", n_packets=1_000)
    write_run(engine, ingest)
    rows = {r["flow_id"]: r for r in _rows(engine, "SELECT * FROM v_flow WHERE run_id = 'v-0002'")}
    for flow_id, arr in ingest.iperf_intervals:
        span = arr["end_s"].max() - arr["start_s"].min()
        assert rows[flow_id]["goodput_bps"] == pytest.approx(arr["bytes"].sum() * 8 / span)
        assert rows[flow_id]["retransmits"] == arr["retransmits"].sum()
        assert rows[flow_id]["cc"] == ("cubic", "bbr")[flow_id]


def _check_stats(row: dict, prefix: str, values: np.ndarray) -> None:
    assert row[f"{prefix}_samples"] == len(values)
    for name, p in (("p50", 50), ("p95", 95), ("p99", 99)):
        assert row[f"{prefix}_{name}"] == pytest.approx(np.percentile(values, p), rel=1e-9), name
    assert row[f"{prefix}_mean"] == pytest.approx(values.mean(), rel=1e-9)
    assert (row[f"{prefix}_min"], row[f"{prefix}_max"]) == pytest.approx((values.min(), values.max()))


def test_v_run_qdelay_and_rtt_percentiles_equal_numpy(engine) -> None:
    a, b = make_run_ingest("v-0003", n_packets=2_000, seed=3), make_run_ingest("v-0004", n_packets=3_000, seed=4)
    write_run(engine, a)
    write_run(engine, b)
    rows = {r["run_id"]: r for r in _rows(engine, "SELECT * FROM v_run_qdelay")}
    rtts = {r["run_id"]: r for r in _rows(engine, "SELECT * FROM v_run_rtt")}
    for ingest in (a, b):
        q = ingest.qdelay[0][1]
        kept = q[q["dropped"] == 0]
        row = rows[ingest.run["run_id"]]
        _check_stats(row, "qdelay_us", kept["sojourn_ns"] / 1000.0)
        assert (row["packets"], row["dropped"], row["ce"]) == (len(q), q["dropped"].sum(), q["ce"].sum())
        _check_stats(rtts[ingest.run["run_id"]], "srtt_us", ingest.tcp_probe[0][1]["srtt_us"].astype(float))


def _campaign(engine) -> None:
    with engine.begin() as conn:
        conn.execute(campaign.insert(), {"name": "nightly", "sha256": "c" * 64, "path": "c.yaml", "text": "",
                                         "updated_at": NOW})
        for night in (1, 2):
            conn.execute(campaign_run.insert(), {"id": night, "campaign": "nightly", "night": night,
                                                 "label": f"2026-11-2{night}", "campaign_sha256": "c" * 64,
                                                 "status": "done", "started_at": NOW})
        values = {(1, "vanilla"): [10.0, 12.0, 11.0], (1, "fix"): [9.0, 8.0], (2, "vanilla"): [10.0, 14.0],
                  (2, "fix"): [7.0, 7.5, 9.0, 20.0]}
        tid = 0
        for (night, variant), vals in values.items():
            for rep, v in enumerate(vals):
                tid += 1
                conn.execute(trial.insert(), {"id": tid, "campaign_run_id": night, "seq": tid, "cell_key": "k1",
                                              "cell_label": "rtt=20ms", "plan_sha256": "a" * 64, "variant": variant,
                                              "repetition": rep, "attempt": 0, "status": "ok",
                                              "run_id": f"t-{tid}", "spec": {}})
                conn.execute(trial_metric.insert(), {"trial_id": tid, "metric": "qdelay_p99_ms", "value": v})
        conn.execute(trial.insert(), {"id": 99, "campaign_run_id": 2, "seq": 99, "cell_key": "k1",
                                      "cell_label": "rtt=20ms", "plan_sha256": "a" * 64, "variant": "fix",
                                      "repetition": 9, "attempt": 0, "status": "failed", "run_id": "t-99",
                                      "spec": {}})
        conn.execute(trial_metric.insert(), {"trial_id": 99, "metric": "qdelay_p99_ms", "value": 1000.0})
        conn.execute(campaign_verdict.insert(), {"campaign_run_id": 2, "check_index": 0, "cell_key": "k1",
                                                 "variant": "fix", "metric": "qdelay_p99_ms", "kind": "relative",
                                                 "verdict": "PASS", "detail": {"cell_label": "rtt=20ms",
                                                                               "ratio": 0.68, "p_adjusted": 0.04,
                                                                               "median_base": 12.0,
                                                                               "median_cand": 8.25}})


def test_campaign_views(engine) -> None:
    _campaign(engine)
    trend = _rows(engine, "SELECT night, variant, n, median FROM v_campaign_trend ORDER BY night, variant")
    assert [(r["night"], r["variant"], r["n"], r["median"]) for r in trend] == [
        (1, "fix", 2, 8.5), (1, "vanilla", 3, 11.0), (2, "fix", 4, 8.25), (2, "vanilla", 2, 12.0)]
    (v,) = _rows(engine, "SELECT * FROM v_campaign_verdict")
    assert (v["campaign"], v["night"], v["cell_label"], v["variant"], v["verdict"]) == (
        "nightly", 2, "rtt=20ms", "fix", "PASS")
    assert (v["ratio"], v["p_adjusted"], v["median_cand"]) == (0.68, 0.04, 8.25)


def test_run_row_columns_are_in_v_run() -> None:
    """v_run names every provenance column of the run table."""
    sql = VIEWS["v_run"]("sqlite")
    for col in ("run_by", "testbed", "tcplab_version", "tcplab_commit", "plan_commit"):
        assert f"r.{col}" in sql and col in tables.run.c
