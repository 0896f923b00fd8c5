"""The walking skeleton end to end: quickstart plan -> lab agents -> shaped flows -> captures -> DB.

Runs the real experiments/quickstart.yaml (8 runs x 5 s) on the test lab into SQLite, then re-ingests
the same artifacts into PostgreSQL and compares row counts table by table.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from rich.progress import Progress
from sqlalchemy import text

from analysis.summary import run_table
from orchestrator.engine.plan_run import run_plan
from orchestrator.guards.finalise import finalise_run
from orchestrator.ingest.record import RunRecord
from orchestrator.lab import netns
from orchestrator.storage.db import open_db
from tests.lab.conftest import stored_flags

QUICKSTART = Path(__file__).resolve().parents[2] / "experiments" / "quickstart.yaml"
TABLES = ["run", "flow", "artifact", "host_evidence", "capture_point", "conn", "packet", "qdelay", "qdelay_pair",
          "tcp_probe", "qdisc_sample", "iperf_interval"]
BY_RUN_KEY = {"conn", "packet", "qdelay", "tcp_probe", "qdisc_sample"}   # per-packet tables: run_key


@pytest.fixture(scope="module")
def quickstart_db(lab, tmp_path_factory):
    _, state_dir = lab
    out = tmp_path_factory.mktemp("quickstart")
    url = f"sqlite:///{out / 'tcplab.db'}"
    rc = asyncio.run(run_plan(QUICKSTART, db_url=url, inventory=netns.inventory_path(state_dir),
                              results=out / "results", force=False, console=Console(stderr=True),
                              progress_factory=lambda: Progress(disable=True)))
    assert rc == 0
    return url, out / "results"


def counts(engine, run_id: str) -> dict[str, int]:
    with engine.connect() as conn:
        key = conn.execute(text("SELECT run_key FROM run WHERE run_id = :r"), {"r": run_id}).scalar_one()
        return {t: conn.execute(text(f"SELECT count(*) FROM {t} WHERE {'run_key' if t in BY_RUN_KEY else 'run_id'}"
                                     " = :r"), {"r": key if t in BY_RUN_KEY else run_id}).scalar_one()
                for t in TABLES}


def test_eight_complete_runs_with_packets_probes_and_qdisc_samples(quickstart_db):
    url, _ = quickstart_db
    engine = open_db(url)
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT run_id, status, params FROM run")).all()
    assert len(runs) == 8 and all(r.status == "complete" for r in runs)
    for run_id, _, _ in runs:
        c = counts(engine, run_id)
        assert c["packet"] > 1000 and c["tcp_probe"] > 100 and c["qdisc_sample"] > 100, (run_id, c)
        assert c["iperf_interval"] > 0 and c["host_evidence"] >= 9
        assert c["capture_point"] == 2 and c["qdelay_pair"] == 1 and c["qdelay"] > 1000, (run_id, c)
    # the tracer kept the senders' sockets only (dport = a flow's receiver port), though the receivers' sockets
    # live in the same kernel here and fire on every data segment
    with engine.connect() as conn:
        flow_ports = {r.dst_port for r in conn.execute(text("SELECT dst_port FROM flow"))}
        probe_ports = {(r.sport, r.dport) for r in conn.execute(text("SELECT DISTINCT sport, dport FROM tcp_probe"))}
    assert probe_ports and {d for _, d in probe_ports} <= flow_ports, probe_ports
    assert not {s for s, _ in probe_ports} & flow_ports, probe_ports


def test_one_flow_goodput_is_within_90_to_100_percent_of_the_htb_rate(quickstart_db):
    url, _ = quickstart_db
    rows = run_table(open_db(url))
    assert len(rows) == 8
    for row in rows:
        ratio = row.goodput_bps / row.rate_bit
        if row.flows == 1:
            assert 0.90 <= ratio <= 1.0, (row.run_id, ratio)
        else:
            assert 0.85 <= ratio <= 1.0, (row.run_id, ratio)
        assert row.mean_cwnd and row.mean_cwnd > 2
        assert row.backlog_p99_bytes >= row.backlog_mean_bytes >= 0


@pytest.mark.postgres
def test_reingest_into_postgres_gives_identical_row_counts(quickstart_db, pg_url):
    url, results = quickstart_db
    sqlite, pg = open_db(url), open_db(pg_url)
    run_dirs = sorted(p for p in results.iterdir() if (p / "ingest.json").exists())
    assert len(run_dirs) == 8
    for run_dir in run_dirs[:3]:
        first = finalise_run(pg, run_dir, RunRecord.load(run_dir))
        again = finalise_run(pg, run_dir, RunRecord.load(run_dir))   # re-ingest replaces, never duplicates
        assert counts(pg, run_dir.name) == counts(sqlite, run_dir.name)
        assert first.flags == again.flags == stored_flags(sqlite)[run_dir.name]   # the guards, recomputed


def test_rerun_skips_runs_already_complete(quickstart_db, lab):
    url, results = quickstart_db
    _, state_dir = lab
    rc = asyncio.run(run_plan(QUICKSTART, db_url=url, inventory=netns.inventory_path(state_dir),
                              results=results, force=False, console=Console(stderr=True),
                              progress_factory=lambda: Progress(disable=True)))
    assert rc == 0
    with open_db(url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM run")).scalar_one() == 8


def test_paired_capture_queue_delay_agrees_with_the_qdisc_backlog(quickstart_db):
    """Per-packet sojourn (aqm ingress/egress captures) vs the bottleneck qdisc's own view: its
    backlog drained at the htb rate, backlog x 8 / rate, sampled every 10 ms over the same window."""
    url, _ = quickstart_db
    engine = open_db(url)
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT run_id, run_key, params FROM run")).all()
        for run_id, key, params in runs:
            params = json.loads(params) if isinstance(params, str) else params
            soj = np.array(conn.execute(text("SELECT ts_in_ns, sojourn_ns FROM qdelay WHERE run_key = :k "
                                             "AND dropped = 0 AND payload_len > 0 ORDER BY ts_in_ns"),
                                        {"k": key}).all(), dtype=np.int64)
            q = np.array(conn.execute(text("SELECT ts_ns, backlog_bytes FROM qdisc_sample WHERE run_key = :k "
                                           "AND parent = 'root' ORDER BY ts_ns"), {"k": key}).all(), dtype=np.int64)
            pair = conn.execute(text("SELECT d_fwd_source, dropped, matched FROM qdelay_pair WHERE run_id = :r"),
                                {"r": run_id}).one()
            lo, hi = soj[0, 0], soj[-1, 0]
            q = q[(q[:, 0] >= lo) & (q[:, 0] <= hi)]
            from_backlog = q[:, 1] * 8 / params["rate_bit"] * 1e9
            got, want = np.median(soj[:, 1]), np.median(from_backlog)
            print(f"{run_id}: median sojourn {got / 1e6:.2f} ms, backlog/rate {want / 1e6:.2f} ms, "
                  f"{pair.matched} matched, {pair.dropped} dropped")
            assert pair.d_fwd_source == "run-minimum"
            assert abs(got - want) <= max(0.1 * want, 1e6), (run_id, got, want)
